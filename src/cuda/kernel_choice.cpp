#include "cuda/kernel_choice.hpp"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <map>
#include <mutex>

#include "cuda/cuda_check.hpp"

namespace flashtq::cuda {
namespace {

constexpr std::int64_t kInt31 = std::int64_t(1) << 31;  // TMA coordinates are 32-bit signed

bool half_precision(DType t) { return t == DType::f16 || t == DType::bf16; }

std::int64_t element_bytes(DType t) { return t == DType::f32 ? 4 : 2; }

bool all_rows_aligned16(std::initializer_list<const TensorView*> views) {
  for (const TensorView* t : views)
    if (!rows_aligned16(*t)) return false;
  return true;
}

bool all_describable(std::initializer_list<const TensorView*> views) {
  for (const TensorView* t : views)
    if (!tensor_map_describable(*t)) return false;
  return true;
}

DeviceTraits query_traits(int device) {
  int major = 0, minor = 0;
  FLASHTQ_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  FLASHTQ_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  void* encode = nullptr;
  cudaDriverEntryPointQueryResult found{};
  const bool queried = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &encode, 12000, cudaEnableDefault,
                                                        &found) == cudaSuccess;
  if (!queried) (void)cudaGetLastError();
  return DeviceTraits{major == 9 && minor == 0, queried && found == cudaDriverEntryPointSuccess && encode != nullptr};
}

}  // namespace

const char* kernel_name(DenseForwardKernel k) {
  switch (k) {
    case DenseForwardKernel::wgmma: return "dense_forward_wgmma";
    case DenseForwardKernel::decode: return "dense_forward_decode";
    case DenseForwardKernel::mma: return "dense_forward_mma";
    case DenseForwardKernel::tf32: return "dense_forward_tf32";
    case DenseForwardKernel::ffma: return "dense_forward_ffma";
    case DenseForwardKernel::warp_per_row: return "dense_forward_warp_per_row";
  }
  return "?";
}

const char* kernel_name(DenseBackwardKernel k) {
  switch (k) {
    case DenseBackwardKernel::wgmma: return "dense_backward_wgmma";
    case DenseBackwardKernel::warp_per_row: return "dense_backward_warp_per_row";
  }
  return "?";
}

const char* kernel_name(TqAttendKernel k) {
  switch (k) {
    case TqAttendKernel::decode_mma: return "tq_attend_decode_mma";
    case TqAttendKernel::decode_mma_bf16: return "tq_attend_decode_mma_bf16";
    case TqAttendKernel::decode_tc: return "tq_attend_decode_tc";
    case TqAttendKernel::split_k: return "tq_attend_split_k";
    case TqAttendKernel::prefill_bf16: return "tq_attend_prefill_bf16";
  }
  return "?";
}

DeviceTraits current_device_traits() {
  static std::mutex mutex;
  static std::map<int, DeviceTraits> traits;
  int device = 0;
  FLASHTQ_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  auto it = traits.find(device);
  if (it == traits.end()) it = traits.emplace(device, query_traits(device)).first;
  return it->second;
}

bool rows_aligned16(const TensorView& t) {
  const std::int64_t per16 = 16 / element_bytes(t.dtype);
  return reinterpret_cast<std::uintptr_t>(t.data) % 16 == 0 && t.strides[0] % per16 == 0 && t.strides[1] % per16 == 0 &&
         t.strides[2] % per16 == 0;
}

bool tensor_map_describable(const TensorView& t) {
  constexpr std::int64_t kLimit = std::int64_t(1) << 40;
  for (int d = 0; d < 3; ++d) {
    const std::int64_t bytes = t.strides[d] * element_bytes(t.dtype);
    if (bytes <= 0 || bytes % 16 != 0 || bytes >= kLimit) return false;
  }
  for (int d = 0; d < 4; ++d)
    if (t.shape[d] < 1 || t.shape[d] > (std::int64_t(1) << 32)) return false;
  return reinterpret_cast<std::uintptr_t>(t.data) % 16 == 0;
}

DenseForwardKernel choose_dense_forward(const ForwardCall& c, const DeviceTraits& device) {
  const DenseProblem& p = c.p;
  if (!all_rows_aligned16({&c.q, &c.k, &c.v})) return DenseForwardKernel::warp_per_row;
  if (half_precision(p.dtype)) {
    if (dense_decode_serves(c)) return DenseForwardKernel::decode;
    if (device.hopper && device.tensor_maps && built_for(tiles::kWgmmaForwardDims, p.D) &&
        row_block_grid_fits(p, tiles::kWgmmaForward) && p.Sq < kInt31 && p.Sk < kInt31 &&
        all_describable({&c.q, &c.k, &c.v}))
      return DenseForwardKernel::wgmma;
    if (built_for(tiles::kTiledForwardDims, p.D) && row_block_grid_fits(p, tiles::kMmaForward))
      return DenseForwardKernel::mma;
    return DenseForwardKernel::warp_per_row;
  }
  if (!built_for(tiles::kTiledForwardDims, p.D)) return DenseForwardKernel::warp_per_row;
  // The rounded tiling has the smaller blocks, so its grid is the larger of the two.
  if (!p.pedantic && row_block_grid_fits(p, tiles::kTf32ForwardRounded)) return DenseForwardKernel::tf32;
  if (p.pedantic && row_block_grid_fits(p, tiles::kFfmaForward)) return DenseForwardKernel::ffma;
  return DenseForwardKernel::warp_per_row;
}

bool paged_decode_serves(const DenseProblem& p) {
  return half_precision(p.dtype) && built_for(tiles::kDecodeDims, p.D) &&
         p.Sq * p.group() <= tiles::decode_columns(p.D) && p.mask == nullptr && p.dropout_p == 0.0f;
}

bool dense_decode_serves(const ForwardCall& c) {
  const DenseProblem& p = c.p;
  if (!paged_decode_serves(p)) return false;
  for (const TensorView* t : {&c.q, &c.k, &c.v, &c.out})
    if (t->strides[3] != 1) return false;
  return p.B <= 65535 && p.Hkv <= 65535 && p.Sk < kInt31 && all_rows_aligned16({&c.k, &c.v});
}

DenseBackwardKernel choose_dense_backward(const BackwardCall& c, const DeviceTraits& device) {
  const DenseProblem& p = c.p;
  const bool fits = p.B * p.H <= 65535 && p.Sq < kInt31 && p.Sk < kInt31;
  if (device.hopper && device.tensor_maps && half_precision(p.dtype) && built_for(tiles::kWgmmaBackwardDims, p.D) &&
      fits && all_rows_aligned16({&c.q, &c.k, &c.v, &c.out, &c.dout, &c.dq}) &&
      all_describable({&c.q, &c.k, &c.v, &c.dout}))
    return DenseBackwardKernel::wgmma;
  return DenseBackwardKernel::warp_per_row;
}

bool tq_decode_mma_serves(const TqLayout& l, std::int64_t group, std::int64_t window) {
  return window == 0 && l.exact_rows() == 0 && l.head_dim == tiles::kTqDecodeMmaDim && l.key_bits == 2 && l.qjl &&
         l.value_bits == 2 && group % 4 == 0;
}

bool tq_decode_tc_serves(const TqLayout& l, bool exact) {
  if (exact || l.qjl || !built_for(tiles::kTqDecodeTcDims, l.head_dim)) return false;
  if (l.key_outliers % tiles::kTqDecodeTcOutlierMultiple != 0) return false;
  for (const std::int32_t g : {l.key_block, l.value_block})
    if (g != 0 && g < tiles::kTqDecodeTcLeastBlock) return false;
  const int outlier_bits = l.key_outliers ? l.key_outlier_bits : 0;
  for (const tiles::TqCodeWidths& w : tiles::kTqDecodeTcWidths)
    if (w.key_bits == l.key_bits && w.outlier_bits == outlier_bits && w.value_bits == l.value_bits) return true;
  return false;
}

std::int64_t tq_prefill_first_key(const TqAttendCall& c) { return c.first_visible(c.start_pos); }

DenseProblem tq_prefill_problem(const TqAttendCall& c) {
  const TqLayout& l = c.layout();
  const std::int64_t first = tq_prefill_first_key(c);
  DenseProblem p;
  p.B = c.batch, p.Sq = c.n_queries, p.Sk = c.start_pos + c.n_queries - first;
  p.H = c.n_heads, p.Hkv = l.n_kv_heads, p.D = l.head_dim;
  p.dtype = DType::bf16;
  p.scale = c.scale;
  p.causal = true;
  p.causal_offset = c.start_pos - first;
  p.window = c.window;
  p.softcap = c.softcap;  // the rotation keeps every <q, k>: the dense kernels cap and sink the same scores
  p.sinks = c.sinks;
  return p;
}

bool tq_prefill_serves(const TqAttendCall& c, const DeviceTraits& device) {
  if (c.exact || c.start_positions != nullptr || c.n_queries < tiles::kTqPrefillMinRows) return false;
  if (c.sequence_end(c.start_pos) != c.start_pos + c.n_queries) return false;  // rows clamped by max_seq or capacity
  const DenseProblem p = tq_prefill_problem(c);
  if (device.hopper && device.tensor_maps && built_for(tiles::kWgmmaForwardDims, p.D) &&
      row_block_grid_fits(p, tiles::kWgmmaForward))
    return true;
  return built_for(tiles::kTiledForwardDims, p.D) && row_block_grid_fits(p, tiles::kMmaForward);
}

// The seed's layout has an exact tensor-core decode; the presets' layouts a bf16-class one; everything
// else, and an exact call of those, the split-K kernel.
TqAttendKernel choose_tq_attend(const TqAttendCall& c, const DeviceTraits& device) {
  if (tq_prefill_serves(c, device)) return TqAttendKernel::prefill_bf16;
  if (tq_decode_mma_serves(c.layout(), c.group(), c.window))
    return c.exact ? TqAttendKernel::decode_mma : TqAttendKernel::decode_mma_bf16;
  if (tq_decode_tc_serves(c.layout(), c.exact)) return TqAttendKernel::decode_tc;
  return TqAttendKernel::split_k;
}

std::string tq_unsupported(const TqLayout& l) {
  if (built_for(tiles::kTqDims, l.head_dim)) return {};
  return "TurboQuant kernels exist for head_dim 32, 64, 128 and 256";
}

}  // namespace flashtq::cuda

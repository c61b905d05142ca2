// The TurboQuant norm rule on the device (docs/spec.md §4): before an encode of rows in device memory,
// which the validator cannot read on the host, this kernel finds the first row whose norm word f16
// cannot hold. One warp per row, laid out as the encoder's (lane holds coordinates lane * E .. + E - 1)
// and summing in the same order, so the decision is the one the encode kernel's words would reflect.
// A row at most always_fits long (core::norm_always_fits) passes on its norm alone; a longer one with
// norm correction needs its codes (the rotation and the quantizer, as the encoder runs them).
//
// The first failing row is the smallest row index, kept by atomicMin in one __device__ word that the
// host reads back after the kernel: the one synchronisation of an encode (docs/api.md). The word is one
// per device, so the checks of concurrent calls take turns (a mutex); a word per call would need an
// allocation inside the call.
#include <cuda_runtime.h>

#include <mutex>

#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"
#include "cuda/tq_dispatch.cuh"

namespace flashtq::cuda {
namespace {

constexpr int kWarps = 4;
constexpr double kF16Max = 65504.0;  // core::kF16Max: the rule's bound on a norm word
constexpr unsigned long long kNone = ~0ull;

__device__ unsigned long long first_bad_row;

template <typename T, int E>
__global__ void __launch_bounds__(32 * kWarps)
    norm_check_kernel(TqTables tables, TensorView x, bool keys, double always_fits) {
  const TqLayout& l = tables.layout;
  const TqCodebook& cb = keys ? tables.key_codebook : tables.value_codebook;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const std::int64_t row = std::int64_t(blockIdx.x) * kWarps + warp;
  if (row >= x.shape[1] * l.n_kv_heads) return;
  const std::int64_t t = row / l.n_kv_heads, h = row % l.n_kv_heads;
  double r[E];
  const T* src = static_cast<const T*>(x.data) + row_offset(x, 0, t, h) + lane * E;
  double n2 = 0.0;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    r[e] = double(to_float(src[e]));
    n2 += r[e] * r[e];
  }
  const double n = sqrt(warp_sum(n2));  // the same in every lane: the branches below are warp-uniform
  if (n <= always_fits) return;         // the common case (false for NaN)
  // Keys with outlier channels: each part's norm half depends on the head's mask, so a row past always_fits
  // is only a candidate, which the host decides (CudaBackend::tq_unstorable_row).
  // So is any row past the bound with block means (whose rule is the bound: CudaBackend::tq_unstorable_row).
  const bool candidate = (keys && l.key_outliers) || l.mean_block(keys) > 0;
  bool bad = candidate || !isfinite(n) || (!l.norm_correction && n > kF16Max);
  if (!bad && l.norm_correction) {  // n / |c[idx]|: the codes of the rotated unit vector
#pragma unroll
    for (int e = 0; e < E; ++e) r[e] /= n;
    warp_rht<E>(r, tables.polar_sign_bits.data(), lane);
    double c2 = 0.0;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      int idx = 0;
      for (int i = 0; i < cb.levels - 1; ++i) idx += r[e] >= cb.boundaries[i] ? 1 : 0;
      c2 += cb.centroids[idx] * cb.centroids[idx];
    }
    bad = !(n / sqrt(warp_sum(c2)) <= kF16Max);
  }
  if (bad && lane == 0) atomicMin(&first_bad_row, static_cast<unsigned long long>(row));
}

}  // namespace

std::optional<std::int64_t> first_unstorable_tq_row(const TqEncodeCall& c, double always_fits) {
  const auto stream = static_cast<cudaStream_t>(c.stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  FLASHTQ_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    throw Error("stream",
                "is capturing a CUDA graph: a cuda TurboQuant encode reads its norm check back to the host "
                "(docs/api.md), which a capture cannot hold; encode outside the capture");
  }
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  const std::int64_t rows = c.tokens() * c.layout().n_kv_heads;
  unsigned long long found = kNone;
  FLASHTQ_CUDA_CHECK(cudaMemcpyToSymbolAsync(first_bad_row, &kNone, sizeof kNone, 0, cudaMemcpyHostToDevice, stream));
  by_dtype_and_width(c.x.dtype, c.layout().head_dim, [&](auto tag, auto width) {
    norm_check_kernel<decltype(tag), decltype(width)::value>
        <<<unsigned((rows + kWarps - 1) / kWarps), 32 * kWarps, 0, stream>>>(c.tables, c.x, c.keys, always_fits);
  });
  FLASHTQ_CUDA_CHECK_LAUNCH("TurboQuant norm check kernel");
  FLASHTQ_CUDA_CHECK(cudaMemcpyFromSymbolAsync(&found, first_bad_row, sizeof found, 0, cudaMemcpyDeviceToHost, stream));
  FLASHTQ_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (found == kNone) return std::nullopt;
  return std::int64_t(found);
}

}  // namespace flashtq::cuda

// Keys with outlier channels on CUDA (docs/turboquant_layout.md): encode and query rotation part by
// part, one thread per row, in double with the oracle's operations in the oracle's order (no fused
// multiply-adds: every product and sum is rounded as the host rounds it), so codes and norm halves
// match the oracle's exactly. Encode is once per token and the rotation once per query row: neither is
// on attention's critical path, and a row of parts does not map onto the warp butterflies of the
// one-part kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/packing.hpp"
#include "core/tq_outliers.hpp"
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"
#include "cuda/tq_row_math.cuh"

namespace flashtq::cuda {
namespace {

constexpr int kThreads = 64;
constexpr int kMaxDim = kRowMaxDim;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    encode_parts_kernel(TqTables tables, TensorView x, std::int64_t start, std::uint32_t* cache) {
  const TqLayout& l = tables.layout;
  const std::int64_t row = std::int64_t(blockIdx.x) * kThreads + threadIdx.x, T_rows = x.shape[1];
  if (row >= T_rows * l.n_kv_heads) return;
  const std::int64_t t = row / l.n_kv_heads, h = row % l.n_kv_heads, slot = h * l.capacity + start + t;
  const std::int32_t D = std::int32_t(l.head_dim);
  double r[kMaxDim], part[kMaxDim];
  std::int32_t order[kMaxDim];
  for (std::int32_t d = 0; d < D; ++d) r[d] = element<T>(x, 0, t, h, d);
  const double norm = length(r, D);
  std::uint32_t* codes = cache + slot * l.key_code_words();
  std::uint32_t* norms = cache + l.key_norm_offset() + slot * l.key_norm_words();
  for (std::int64_t w = 0; w < l.key_code_words(); ++w) codes[w] = 0u;
  for (std::int64_t w = 0; w < l.key_norm_words(); ++w) norms[w] = 0u;
  const std::int64_t exact_row = l.exact_row(start + t, start + T_rows);
  unsigned short* exact =
      exact_row < 0 ? nullptr
                    : reinterpret_cast<unsigned short*>(cache + l.key_exact_offset() +
                                                        (h * l.exact_rows() + exact_row) * l.exact_row_words());
  if (exact)
    for (std::int32_t d = 0; d < D; ++d) exact[d] = 0;
  if (norm < 1e-12) return;  // a zero vector: every word of its slot is 0
  core::key_channel_order(l, core::key_outlier_mask(l, cache, h), order);
  for (int p = 0; p < l.key_parts(); ++p) {
    const TqLayout::KeyPart kp = l.key_part(p);
    const TqCodebook& cb = p == 0 ? tables.outlier_codebook : tables.key_codebook;
    for (std::int32_t i = 0; i < kp.size; ++i) part[i] = r[order[kp.offset + i]];
    const double n = length(part, kp.size);
    if (n < 1e-12) continue;  // a zero part: codes and norm 0
    for (std::int32_t i = 0; i < kp.size; ++i) part[i] = __ddiv_rn(part[i], n);
    part_rht(part, kp.size, tables.polar_sign_bits.data(), kp.offset);
    if (exact) {
      const double share = __ddiv_rn(n, norm);
      for (std::int32_t k = 0; k < kp.size; ++k)
        exact[kp.offset + k] =
            __bfloat16_as_ushort(__float2bfloat16_rn(float(__dmul_rn(norm, __dmul_rn(part[k], share)))));
    }
    code_part(
        cb, kp, D, l.norm_correction, p, n, [&](std::int32_t k) { return part[k]; }, codes, norms);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    rotate_parts_kernel(TqTables tables, TensorView q, TqScratchLayout s, float* scratch, const std::uint32_t* keys) {
  allow_next_grid();  // the attention's first kernel may start launching (it waits for this one's output)
  const TqLayout& l = tables.layout;
  const std::int64_t n = q.shape[1], H = q.shape[2];
  const std::int64_t row = std::int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (row >= q.shape[0] * n * H) return;
  const std::int64_t j = row / H, h = row % H, b = j / n;  // j: scratch row b * n + i of query (b, i)
  const std::int32_t D = std::int32_t(l.head_dim);
  double x[kMaxDim];
  std::int32_t order[kMaxDim];
  core::key_channel_order(l, core::key_outlier_mask(l, keys + b * l.key_words(), h / (H / l.n_kv_heads)), order);
  for (std::int32_t i = 0; i < D; ++i) x[i] = element<T>(q, b, j % n, h, order[i]);
  for (int p = 0; p < l.key_parts(); ++p) {
    const TqLayout::KeyPart kp = l.key_part(p);
    part_rht(x + kp.offset, kp.size, tables.polar_sign_bits.data(), kp.offset);
  }
  float* q_rot = scratch + s.q_rot(j, h);
  float* q_jl = scratch + s.q_jl(j, h);  // keys with outlier channels have no QJL bits
  for (std::int32_t d = 0; d < D; ++d) {
    q_rot[d] = float(x[d]);
    q_jl[d] = 0.0f;
  }
  scratch[s.sum(j, h)] = 0.0f;
}

}  // namespace

void launch_tq_encode_parts(const TqEncodeCall& c) {
  const std::int64_t rows = c.tokens() * c.layout().n_kv_heads;
  by_dtype(c.x.dtype, [&](auto tag) {
    encode_parts_kernel<decltype(tag)>
        <<<unsigned((rows + kThreads - 1) / kThreads), kThreads, 0, static_cast<cudaStream_t>(c.stream)>>>(
            c.tables, c.x, c.start_pos, c.cache);
  });
  FLASHTQ_CUDA_CHECK_LAUNCH("TurboQuant encode kernel (outlier channels)");
}

void launch_tq_rotate_parts(const TqRotateCall& c) {
  const std::int64_t rows = c.rows() * c.scratch_layout.n_heads;
  by_dtype(c.q.dtype, [&](auto tag) {
    rotate_parts_kernel<decltype(tag)>
        <<<unsigned((rows + kThreads - 1) / kThreads), kThreads, 0, static_cast<cudaStream_t>(c.stream)>>>(
            c.tables, c.q, c.scratch_layout, c.scratch, c.k_cache);
  });
  FLASHTQ_CUDA_CHECK_LAUNCH("TurboQuant rotate kernel (outlier channels)");
}

}  // namespace flashtq::cuda

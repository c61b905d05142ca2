// Encode with block means on CUDA (docs/turboquant_layout.md): the timesteps that leave the recent window are
// coded, each minus its block's mean, from exact rows, as core::tq_encode_head_with_means does, one thread per
// row in the oracle's arithmetic (tq_row_math.cuh), so means, codes and norms match its bits. Three launches in
// stream order: the means of the blocks that start being coded (from the exact rows, before any is replaced),
// the residuals' codes, then the new rows' exact copies. A row of the call is rotated again by each launch that
// needs it (no workspace: encode takes none); encode is once per token and off attention's critical path.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "core/packing.hpp"
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"
#include "cuda/tq_row_math.cuh"

namespace flashtq::cuda {
namespace {

constexpr int kThreads = 64;

struct Span {
  std::int64_t start, end;   // the call's timesteps [start, end)
  std::int64_t first, stop;  // those it codes, [first, stop): the ones that leave the recent window
  TqPageTable pages;         // a pool's: the sequence's pages and exact set

  __device__ TqSequence sequence(const TqLayout& l) const { return tq_sequence(l, pages, 0); }
};

// Timestep u's exact row: a row of the call, or one the cache holds (sinks and the window before the call).
template <typename T>
__device__ void source_row(const TqTables& tables, const TensorView& x, const Span& s, std::int64_t u, std::int64_t h,
                           bool keys, const std::uint32_t* cache, double* out) {
  const TqLayout& l = tables.layout;
  if (u >= s.start) return exact_row_of<T>(tables, x, u - s.start, h, keys, cache, out);
  const std::uint32_t* words = cache + (keys ? l.key_exact_offset() : l.value_exact_offset()) +
                               l.exact_row_at(s.sequence(l).exact_set, h, l.exact_row(u, s.start));
  for (std::int64_t d = 0; d < l.head_dim; ++d)
    out[d] = double(__uint_as_float((words[d / 2] >> (16 * (d % 2))) << 16));
}

// One thread per (block whose first timestep is coded by this call, kv head).
template <typename T>
__global__ void __launch_bounds__(kThreads) means_kernel(TqTables tables, TensorView x, Span s, std::uint32_t* cache,
                                                         bool keys, std::int64_t first_block, std::int64_t n_blocks) {
  const TqLayout& l = tables.layout;
  const std::int64_t i = std::int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n_blocks * l.n_kv_heads) return;
  const std::int64_t b = first_block + i / l.n_kv_heads, h = i % l.n_kv_heads, g = l.mean_block(keys);
  const std::int32_t D = std::int32_t(l.head_dim);
  double row[kRowMaxDim], sum[kRowMaxDim];
  for (std::int32_t d = 0; d < D; ++d) sum[d] = 0.0;
  for (std::int64_t u = b * g; u < b * g + g; ++u) {
    source_row<T>(tables, x, s, u, h, keys, cache, row);
    for (std::int32_t d = 0; d < D; ++d) sum[d] = __dadd_rn(sum[d], row[d]);
  }
  const std::int64_t at = s.sequence(l).timestep(b * g);  // a block lies in one page
  std::uint32_t* mean = cache + (keys ? l.key_mean(h, at) : l.value_mean(h, at));
  for (std::int32_t k = 0; k < D / 2; ++k) {
    const float lo = float(__ddiv_rn(sum[2 * k], double(g))), hi = float(__ddiv_rn(sum[2 * k + 1], double(g)));
    auto bits = [](float x) { return core::block_mean_half(__half_as_ushort(__float2half_rn(x))); };
    mean[k] = bits(lo) | bits(hi) << 16;
  }
}

// One thread per (coded timestep, kv head): the row minus its block's mean, coded part by part
// (core::put_residual).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    residual_kernel(TqTables tables, TensorView x, Span s, std::uint32_t* cache, bool keys) {
  const TqLayout& l = tables.layout;
  const std::int64_t i = std::int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= (s.stop - s.first) * l.n_kv_heads) return;
  const std::int64_t t = s.first + i / l.n_kv_heads, h = i % l.n_kv_heads, at = s.sequence(l).timestep(t);
  const std::int64_t slot = h * l.capacity + at;
  const std::int32_t D = std::int32_t(l.head_dim);
  double r[kRowMaxDim];
  source_row<T>(tables, x, s, t, h, keys, cache, r);
  const std::uint32_t* mean = cache + (keys ? l.key_mean(h, at) : l.value_mean(h, at));
  for (std::int32_t d = 0; d < D; ++d) {
    const float m = __half2float(__ushort_as_half(std::uint16_t(mean[d / 2] >> (16 * (d % 2)))));
    r[d] = __dsub_rn(r[d], double(m));
  }
  const bool parts = keys && l.key_outliers;
  const std::int64_t code_words = keys ? l.key_code_words() : l.value_code_words();
  const std::int64_t norm_words = keys ? l.key_norm_words() : 1;
  std::uint32_t* codes = cache + slot * code_words;
  std::uint32_t* norms = cache + (keys ? l.key_norm_offset() : l.value_norm_offset()) + slot * norm_words;
  for (std::int64_t w = 0; w < code_words; ++w) codes[w] = 0u;
  for (std::int64_t w = 0; w < norm_words; ++w) norms[w] = 0u;
  const int n_parts = parts ? l.key_parts() : 1;
  for (int p = 0; p < n_parts; ++p) {
    const TqLayout::KeyPart kp = parts ? l.key_part(p) : TqLayout::KeyPart{0, D, keys ? l.key_bits : l.value_bits, 0};
    const TqCodebook& cb =
        parts && p == 0 ? tables.outlier_codebook : (keys ? tables.key_codebook : tables.value_codebook);
    const double n = length(r + kp.offset, kp.size);
    if (n < 1e-12) continue;  // a zero part: it decodes to the mean alone
    code_part(
        cb, kp, D, l.norm_correction, p, n, [&](std::int32_t k) { return __ddiv_rn(r[kp.offset + k], n); }, codes,
        norms);
  }
}

// One thread per (row of the call, kv head): its exact copy, where it has one once the call is done.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    exact_kernel(TqTables tables, TensorView x, Span s, std::uint32_t* cache, bool keys) {
  const TqLayout& l = tables.layout;
  const std::int64_t i = std::int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= (s.end - s.start) * l.n_kv_heads) return;
  const std::int64_t t = s.start + i / l.n_kv_heads, h = i % l.n_kv_heads;
  const std::int64_t row = l.exact_row(t, s.end);
  if (row < 0) return;
  double r[kRowMaxDim];
  exact_row_of<T>(tables, x, t - s.start, h, keys, cache, r);
  std::uint32_t* words =
      cache + (keys ? l.key_exact_offset() : l.value_exact_offset()) + l.exact_row_at(s.sequence(l).exact_set, h, row);
  for (std::int64_t k = 0; k < l.head_dim / 2; ++k)
    words[k] = std::uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(float(r[2 * k])))) |
               std::uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(float(r[2 * k + 1])))) << 16;
}

unsigned grid_for(std::int64_t threads) { return unsigned((threads + kThreads - 1) / kThreads); }

}  // namespace

void launch_tq_encode_with_means(const TqEncodeCall& c) {
  const TqLayout& l = c.layout();
  const std::int64_t g = l.mean_block(c.keys), w = l.recent_tokens, H = l.n_kv_heads;
  Span s{c.start_pos, c.start_pos + c.tokens(), 0, 0, c.pages};
  s.first = std::max<std::int64_t>(0, s.start - w);
  s.stop = std::max(s.first, s.end - w);
  // The blocks whose first timestep is in [first, stop).
  const std::int64_t first_block = (s.first + g - 1) / g, end_block = (s.stop + g - 1) / g;
  const auto stream = static_cast<cudaStream_t>(c.stream);
  by_dtype(c.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (end_block > first_block)
      means_kernel<T><<<grid_for((end_block - first_block) * H), kThreads, 0, stream>>>(
          c.tables, c.x, s, c.cache, c.keys, first_block, end_block - first_block);
    if (s.stop > s.first)
      residual_kernel<T><<<grid_for((s.stop - s.first) * H), kThreads, 0, stream>>>(c.tables, c.x, s, c.cache, c.keys);
    exact_kernel<T><<<grid_for((s.end - s.start) * H), kThreads, 0, stream>>>(c.tables, c.x, s, c.cache, c.keys);
  });
  FLASHTQ_CUDA_CHECK_LAUNCH("TurboQuant encode kernels (block means)");
}

}  // namespace flashtq::cuda

// Keys with outlier channels on CUDA (docs/turboquant_layout.md): encode part by part, one thread per row,
// in double with the oracle's operations in the oracle's order (no fused multiply-adds: every product and
// sum is rounded as the host rounds it), so codes and norm halves match the oracle's exactly (encode is once
// per token, off attention's critical path); query rotation, which is on it, a warp per row in f32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/packing.hpp"
#include "core/tq_outliers.hpp"
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"
#include "cuda/tq_dispatch.cuh"
#include "cuda/tq_row_math.cuh"

namespace flashtq::cuda {
namespace {

constexpr int kThreads = 64;
constexpr int kMaxDim = kRowMaxDim;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    encode_parts_kernel(TqTables tables, TensorView x, std::int64_t start, std::uint32_t* cache, TqPageTable pages) {
  const TqLayout& l = tables.layout;
  const std::int64_t row = std::int64_t(blockIdx.x) * kThreads + threadIdx.x, T_rows = x.shape[1];
  if (row >= T_rows * l.n_kv_heads) return;
  const TqSequence sq = tq_sequence(l, pages, 0);  // a pool's pages (contiguous: the identity)
  const std::int64_t t = row / l.n_kv_heads, h = row % l.n_kv_heads, slot = h * l.capacity + sq.timestep(start + t);
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
  unsigned short* exact = exact_row < 0 ? nullptr
                                        : reinterpret_cast<unsigned short*>(cache + l.key_exact_offset() +
                                                                            l.exact_row_at(sq.exact_set, h, exact_row));
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

// Query rotation: a warp per (query row, head), in f32 (held to 1e-5 like every rotation, docs/spec.md §3; the
// codes are the encoder's business, so no bit-exact double here). Lane l loads channels [l E, l E + E) and
// puts each at its permuted coordinate in the warp's shared row: an outlier channel at its rank among the
// mask's set bits, another at N + (its rank among the rest); then each part's butterflies (relative
// indices, the signs of its absolute coordinates) and 1 / sqrt(n_p), in registers and shuffles.
constexpr int kRotateWarps = 4;

template <typename T, int E>
__global__ void __launch_bounds__(32 * kRotateWarps)
    rotate_parts_kernel(TqTables tables, TensorView q, TqScratchLayout s, float* scratch, const std::uint32_t* keys) {
  constexpr int D = 32 * E;
  __shared__ float rows[kRotateWarps][D];
  allow_next_grid();  // the attention's first kernel may start launching (it waits for this one's output)
  const TqLayout& l = tables.layout;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const std::int64_t n = q.shape[1], H = q.shape[2];
  const std::int64_t r = std::int64_t(blockIdx.x) * kRotateWarps + warp;
  if (r >= q.shape[0] * n * H) return;                 // whole warps
  const std::int64_t j = r / H, h = r % H, b = j / n;  // j: scratch row b * n + i of query (b, i)
  const std::uint32_t* mask = core::key_outlier_mask(l, keys + tq_sequence_base(l, b, true), h / (H / l.n_kv_heads));
  const std::int32_t N = l.key_outliers;
  int set = 0;
  for (int w = 0; w < D / 32; ++w) set += __popc(mask[w]);
  const bool calibrated = set == N;  // else channels [0, N) (core::key_channel_order)
  float* x = rows[warp];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int c = lane * E + e;
    int below = 0;  // outlier channels below c
    bool outlier;
    if (calibrated) {
      for (int w = 0; w < c / 32; ++w) below += __popc(mask[w]);
      below += __popc(mask[c / 32] & ((1u << (c % 32)) - 1u));
      outlier = (mask[c / 32] >> (c % 32)) & 1u;
    } else {
      below = c < N ? c : N;
      outlier = c < N;
    }
    x[outlier ? below : N + c - below] = to_float(static_cast<const T*>(q.data)[row_offset(q, b, j % n, h) + c]);
  }
  __syncwarp();
  // Lane l then holds coordinates [l E, l E + E) of the permuted row; they lie in one part (parts are powers of two
  // of at least 16 coordinates starting on multiples of 16), whose butterflies run in registers and across the
  // part's lanes by shuffles: the pairs and sums of the shared-memory butterflies, without a round trip a stage.
  const int first = lane * E;
  int offset = 0, size = D;
  for (int p = 0; p < l.key_parts(); ++p) {
    const TqLayout::KeyPart kp = l.key_part(p);
    if (first >= kp.offset && first < kp.offset + kp.size) offset = kp.offset, size = kp.size;
  }
  float y[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int d = first + e;
    y[e] = ((tables.polar_sign_bits[std::size_t(d / 32)] >> (d % 32)) & 1u) ? -x[d] : x[d];
  }
  lane_fwht<float, E>(y);
  const int rel = (first - offset) / E, base = offset / E;  // the lane's place in its part, the part's first lane
#pragma unroll
  for (int m = 1; m < 32; m <<= 1) {
    const bool stage = m * E < size;  // every lane shuffles; a lane whose part is done keeps its values
    const int from = stage ? base + (rel ^ m) : lane;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const float other = __shfl_sync(0xFFFFFFFFu, y[e], from);
      if (stage) y[e] = (rel & m) ? other - y[e] : y[e] + other;
    }
  }
  const float inv = rsqrtf(float(size));
  float* q_rot = scratch + s.q_rot(j, h);
  float* q_jl = scratch + s.q_jl(j, h);  // keys with outlier channels have no QJL bits
#pragma unroll
  for (int e = 0; e < E; ++e) {
    q_rot[first + e] = y[e] * inv;
    q_jl[first + e] = 0.0f;
  }
  if (lane == 0) scratch[s.sum(j, h)] = 0.0f;
}

}  // namespace

void launch_tq_encode_parts(const TqEncodeCall& c) {
  const std::int64_t rows = c.tokens() * c.layout().n_kv_heads;
  by_dtype(c.x.dtype, [&](auto tag) {
    encode_parts_kernel<decltype(tag)>
        <<<unsigned((rows + kThreads - 1) / kThreads), kThreads, 0, static_cast<cudaStream_t>(c.stream)>>>(
            c.tables, c.x, c.start_pos, c.cache, c.pages);
  });
  FLASHTQ_CUDA_CHECK_LAUNCH("TurboQuant encode kernel (outlier channels)");
}

void launch_tq_rotate_parts(const TqRotateCall& c) {
  const std::int64_t rows = c.rows() * c.scratch_layout.n_heads;
  by_dtype_and_width(c.q.dtype, c.tables.layout.head_dim, [&](auto tag, auto width) {
    rotate_parts_kernel<decltype(tag), decltype(width)::value>
        <<<unsigned((rows + kRotateWarps - 1) / kRotateWarps), 32 * kRotateWarps, 0,
           static_cast<cudaStream_t>(c.stream)>>>(c.tables, c.q, c.scratch_layout, c.scratch, c.k_cache);
  });
  FLASHTQ_CUDA_CHECK_LAUNCH("TurboQuant rotate kernel (outlier channels)");
}

}  // namespace flashtq::cuda

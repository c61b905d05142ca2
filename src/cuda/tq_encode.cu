// TurboQuant encode and query rotation on CUDA: one warp per row, the rotation in double with the
// host's butterflies, so codes and norm words match the oracle's.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"
#include "cuda/tq_dispatch.cuh"

namespace flashtq::cuda {
namespace {

constexpr int kWarps = 4;

// ORs `width` bits per lane (lane's bits start at lane * width) into words[], then stores them.
__device__ __forceinline__ void store_bitstream(std::uint32_t* shared_words, std::uint32_t* out, int n_words,
                                                std::uint32_t lane_bits, int width, int lane) {
  if (lane < n_words) shared_words[lane] = 0u;
  __syncwarp();
  const int pos = lane * width;
  atomicOr(&shared_words[pos / 32], lane_bits << (pos % 32));
  if (pos % 32 + width > 32) atomicOr(&shared_words[pos / 32 + 1], lane_bits >> (32 - pos % 32));
  __syncwarp();
  if (lane < n_words) out[lane] = shared_words[lane];
  __syncwarp();
}

template <typename T, int E>
__global__ void __launch_bounds__(32 * kWarps) encode_kernel(TqTables tables, TensorView x, std::int64_t start,
                                                             std::uint32_t* cache, bool keys, TqPageTable pages) {
  const TqLayout& l = tables.layout;
  const TqCodebook& cb = keys ? tables.key_codebook : tables.value_codebook;
  __shared__ std::uint32_t words[kWarps][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const std::int64_t row = std::int64_t(blockIdx.x) * kWarps + warp;
  const std::int64_t T_rows = x.shape[1];
  if (row >= T_rows * l.n_kv_heads) return;
  const std::int64_t t = row / l.n_kv_heads, h = row % l.n_kv_heads;
  const TqSequence sq = tq_sequence(l, pages, 0);  // a pool's pages (contiguous: the identity)
  const std::int64_t slot = h * l.capacity + sq.timestep(start + t);
  const int bits = keys ? l.key_bits : l.value_bits;
  const int code_words = int(l.head_dim) * bits / 32;
  std::uint32_t* codes = cache + slot * code_words;
  std::uint32_t* jl = cache + l.key_jl_offset() + slot * l.jl_words();
  std::uint32_t* norm_word = cache + (keys ? l.key_norm_offset() : l.value_norm_offset()) + slot;

  double r[E];
  const T* src = static_cast<const T*>(x.data) + row_offset(x, 0, t, h) + lane * E;
  double n2 = 0.0;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    r[e] = double(to_float(src[e]));
    n2 += r[e] * r[e];
  }
  const double n = sqrt(warp_sum(n2));
  // The exact copy of a sink or recent timestep (docs/spec.md §2.6): n * RHT(x / n) in bf16.
  const std::int64_t exact_row = l.exact_row(start + t, start + T_rows);
  unsigned short* exact =
      exact_row < 0 ? nullptr
                    : reinterpret_cast<unsigned short*>(cache + (keys ? l.key_exact_offset() : l.value_exact_offset()) +
                                                        l.exact_row_at(sq.exact_set, h, exact_row)) +
                          lane * E;
  if (n < 1e-12) {  // a zero vector: every word of its slot is 0
    if (exact)
#pragma unroll
      for (int e = 0; e < E; ++e) exact[e] = 0;
    if (lane < code_words) codes[lane] = 0u;
    if (keys && lane < int(l.jl_words())) jl[lane] = 0u;  // none without QJL
    if (lane == 0) *norm_word = 0u;
    return;
  }
#pragma unroll
  for (int e = 0; e < E; ++e) r[e] /= n;
  warp_rht<E>(r, tables.polar_sign_bits.data(), lane);
  if (exact)
#pragma unroll
    for (int e = 0; e < E; ++e) exact[e] = __bfloat16_as_ushort(__float2bfloat16_rn(float(n * r[e])));
  std::uint32_t lane_codes = 0;
  double e2 = 0.0, c2 = 0.0;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    int idx = 0;
    for (int i = 0; i < cb.levels - 1; ++i) idx += r[e] >= cb.boundaries[i] ? 1 : 0;
    lane_codes |= std::uint32_t(idx) << (e * bits);
    c2 += cb.centroids[idx] * cb.centroids[idx];
    r[e] -= cb.centroids[idx];
    e2 += r[e] * r[e];
  }
  store_bitstream(words[warp], codes, code_words, lane_codes, E * bits, lane);
  c2 = warp_sum(c2);  // every lane: the decoded unit vector's squared length
  const double stored = l.norm_correction ? n / sqrt(c2) : n;
  std::uint32_t word = __half_as_ushort(__float2half_rn(float(stored)));
  if (keys && l.qjl) {
    const double gamma = sqrt(warp_sum(e2));
    std::uint32_t lane_jl = 0;
    if (gamma >= 1e-12) {
      warp_rht<E>(r, tables.jl_sign_bits.data(), lane);
#pragma unroll
      for (int e = 0; e < E; ++e) lane_jl |= (r[e] >= 0.0 ? 1u : 0u) << e;
    }
    store_bitstream(words[warp], jl, int(l.jl_words()), lane_jl, E, lane);
    word |= std::uint32_t(__half_as_ushort(__float2half_rn(float(gamma)))) << 16;
  }
  if (lane == 0) *norm_word = word;
}

template <typename T, int E>
__global__ void __launch_bounds__(32 * kWarps)
    rotate_kernel(TqTables tables, TensorView q, TqScratchLayout s, float* scratch) {
  allow_next_grid();  // the attention's first kernel may start launching (it waits for this one's output)
  const int lane = threadIdx.x % 32;
  const std::int64_t row = std::int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  const std::int64_t n = q.shape[1], H = q.shape[2];
  if (row >= q.shape[0] * n * H) return;
  const std::int64_t j = row / H, h = row % H;  // j: scratch row b * n + i of query (b, i)
  double x[E];
  const T* src = static_cast<const T*>(q.data) + row_offset(q, j / n, j % n, h) + lane * E;
#pragma unroll
  for (int e = 0; e < E; ++e) x[e] = double(to_float(src[e]));
  warp_rht<E>(x, tables.polar_sign_bits.data(), lane);
  float* q_rot = scratch + s.q_rot(j, h) + lane * E;
  float* q_jl = scratch + s.q_jl(j, h) + lane * E;
#pragma unroll
  for (int e = 0; e < E; ++e) q_rot[e] = float(x[e]);
  warp_rht<E>(x, tables.jl_sign_bits.data(), lane);
  double sum = 0.0;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    q_jl[e] = float(x[e]);
    sum += x[e];
  }
  sum = warp_sum(sum);
  if (lane == 0) scratch[s.sum(j, h)] = float(sum);
}

}  // namespace

void launch_tq_encode(const TqEncodeCall& c) {
  if (c.layout().mean_block(c.keys)) return launch_tq_encode_with_means(c);
  if (c.keys && c.layout().key_outliers) return launch_tq_encode_parts(c);
  const std::int64_t rows = c.tokens() * c.layout().n_kv_heads;
  by_dtype_and_width(c.x.dtype, c.layout().head_dim, [&](auto tag, auto width) {
    encode_kernel<decltype(tag), decltype(width)::value>
        <<<unsigned((rows + kWarps - 1) / kWarps), 32 * kWarps, 0, static_cast<cudaStream_t>(c.stream)>>>(
            c.tables, c.x, c.start_pos, c.cache, c.keys, c.pages);
  });
  FLASHTQ_CUDA_CHECK_LAUNCH("TurboQuant encode kernel");
}

void launch_tq_rotate(const TqRotateCall& c) {
  if (c.tables.layout.key_outliers) return launch_tq_rotate_parts(c);
  const std::int64_t rows = c.rows() * c.scratch_layout.n_heads;
  by_dtype_and_width(c.q.dtype, c.scratch_layout.head_dim, [&](auto tag, auto width) {
    rotate_kernel<decltype(tag), decltype(width)::value>
        <<<unsigned((rows + kWarps - 1) / kWarps), 32 * kWarps, 0, static_cast<cudaStream_t>(c.stream)>>>(
            c.tables, c.q, c.scratch_layout, c.scratch);
  });
  FLASHTQ_CUDA_CHECK_LAUNCH("TurboQuant rotate kernel");
}

}  // namespace flashtq::cuda

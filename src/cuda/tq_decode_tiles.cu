// Decode over the packed TurboQuant cache for every layout (TqAttendKernel::decode_tiles, bf16-class:
// docs/spec.md §3). A block takes one (query row, kv head, split of the timesteps) and the GQA group's heads
// (up to 16, the rows of one m16 tile); per tile of T timesteps its 4 warps decode keys and values into
// shared memory as bf16 (a warp per timestep, tq_decode_rows.cuh), then S = Q K^T and O += P V run on
// mma.sync with an online softmax in between (base 2, statistics in f32). The block writes one partial per
// head for the split-K merge (LSE merge and the single inverse rotation, tq_attend.cu).
#include <cuda_bf16.h>

#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/launch.hpp"
#include "cuda/mma_sync.cuh"
#include "cuda/tq_attend.cuh"
#include "cuda/tq_decode_rows.cuh"

namespace flashtq::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kBatch = 4;  // timesteps a warp decodes before it stores them

template <int E>
struct Tiles {
  static constexpr int D = 32 * E;
  static constexpr int T = tq_decode_tile_tokens(D);  // timesteps per tile
  static constexpr int RowPad = D + 8;                // bf16 per shared row: ldmatrix rows in distinct banks
  static constexpr int ScorePad = T + 8;
  static constexpr int ScoreTiles = T / (8 * kWarps);  // n8 tiles of scores per warp
  static constexpr int ValueTiles = D / (8 * kWarps);  // n8 tiles of output dims per warp
  static_assert(T % (kWarps * kBatch) == 0, "every warp decodes whole batches of a tile");
};

template <int E>
__global__ void __launch_bounds__(32 * kWarps) decode_tiles_kernel(AttendParams a, RowCodebooks books) {
  using S = Tiles<E>;
  constexpr int D = S::D, T = S::T;
  __shared__ __align__(16) __nv_bfloat16 qs[16][S::RowPad], ks[T][S::RowPad], vs[T][S::RowPad], ps[16][S::ScorePad];
  __shared__ float ss[16][T + 4];  // scores (base 2) of the tile
  __shared__ float row_m[16], row_l[16], row_corr[16];
  __shared__ float kc[16], vc[16], oc[16];
  allow_next_grid();  // the merge kernel's blocks wait for this grid to finish
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t4 = lane % 4;
  const TqLayout& l = a.l;
  const std::int64_t kvh = blockIdx.y, z = a.first_row + blockIdx.z;  // z = b * n_queries + j
  const std::int64_t G = a.H / l.n_kv_heads, h0 = kvh * G;
  const std::int64_t seq = seq_len_of(a, z), first = first_visible_of(a, z), end = sequence_end_of(a, z);
  const std::int64_t t_begin = std::int64_t(blockIdx.x) * a.split_tokens;
  const std::int64_t t_stop = min(t_begin + a.split_tokens, seq);
  float* ws = a.ws + ((z * a.H + h0) * a.n_splits + blockIdx.x) * partial_stride(D);
  const std::int64_t ws_head = std::int64_t(a.n_splits) * partial_stride(D);
  if (t_stop <= max(t_begin, first)) {  // nothing visible in this split: an empty partial
    if (tid < G) {
      ws[tid * ws_head] = -INFINITY;
      ws[tid * ws_head + 1] = 0.0f;
    }
    return;
  }
  if (tid < 16) {
    kc[tid] = books.key[tid];
    vc[tid] = books.value[tid];
    oc[tid] = books.outlier[tid];
    row_m[tid] = -INFINITY;
    row_l[tid] = 0.0f;
  }
  wait_for_previous_grid();  // the rotated queries
  for (int i = tid; i < 16 * D; i += 32 * kWarps) {
    const int r = i / D, d = i % D;
    qs[r][d] = __float2bfloat16_rn(r < G ? a.scratch[a.scratch_layout.q_rot(z, h0 + r) + d] : 0.0f);
  }
  const LaneCodes key_at = lane_codes<E>(l, true, lane), value_at = lane_codes<E>(l, false, lane);
  const std::uint32_t* keys = keys_of(a, z);
  const std::uint32_t* values = values_of(a, z);
  const float score_scale = a.scale * kLog2e;
  float acc[S::ValueTiles][4] = {};
  __syncthreads();
  const float* key_cent = l.key_outliers && key_at.part == 0 ? oc : kc;
  // Tiles before the window's start are skipped whole.
  const std::int64_t t_first = t_begin + max(std::int64_t(0), first - t_begin) / T * T;
  for (std::int64_t t0 = t_first; t0 < t_stop; t0 += T) {
    // ---- decode: a warp per timestep, kBatch timesteps at once so that their loads are in flight together;
    // timesteps the row does not see become zeros (masked below) ----
    for (int r0 = warp * kBatch; r0 < T; r0 += kWarps * kBatch) {
      float k[kBatch][E] = {}, v[kBatch][E] = {};
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const std::int64_t t = t0 + r0 + i;
        if (t >= first && t < t_stop)
          decode_timestep<E>(l, a.qjl_scale, a.jl_signs, keys, values, kvh, t, end, key_at, value_at, key_cent, vc,
                             lane, k[i], v[i]);
      }
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
#pragma unroll
        for (int e = 0; e < E; e += 2) {
          if constexpr (E == 1) {
            ks[r0 + i][lane] = __float2bfloat16_rn(k[i][0]);
            vs[r0 + i][lane] = __float2bfloat16_rn(v[i][0]);
          } else {
            *reinterpret_cast<__nv_bfloat162*>(&ks[r0 + i][lane * E + e]) = __floats2bfloat162_rn(k[i][e], k[i][e + 1]);
            *reinterpret_cast<__nv_bfloat162*>(&vs[r0 + i][lane * E + e]) = __floats2bfloat162_rn(v[i][e], v[i][e + 1]);
          }
        }
      }
    }
    __syncthreads();
    // ---- scores of this warp's timesteps [warp T / 4, (warp + 1) T / 4) for the 16 rows ----
    {
      float s[S::ScoreTiles][4] = {};
      const int n0 = warp * (T / kWarps);
#pragma unroll
      for (int k0 = 0; k0 < D; k0 += 16) {
        std::uint32_t qa[4];
        ldmatrix_x4(qa, &qs[(lane & 7) + ((lane >> 3) & 1) * 8][k0 + (lane >> 4) * 8]);
        if constexpr (S::ScoreTiles == 2) {
          std::uint32_t kb[4];
          ldmatrix_x4(kb, &ks[n0 + (lane & 7) + (lane >> 4) * 8][k0 + ((lane >> 3) & 1) * 8]);
          mma_bf16_16816(s[0], qa, kb[0], kb[1]);
          mma_bf16_16816(s[1], qa, kb[2], kb[3]);
        } else {
          std::uint32_t kb[2];
          ldmatrix_x2(kb, &ks[n0 + (lane & 7)][k0 + ((lane >> 3) & 1) * 8]);
          mma_bf16_16816(s[0], qa, kb[0], kb[1]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < S::ScoreTiles; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int row = g + 8 * (c / 2), tok = n0 + 8 * nt + 2 * t4 + (c % 2);
          const std::int64_t t = t0 + tok;
          ss[row][tok] = (t >= first && t < t_stop) ? s[nt][c] * score_scale : -INFINITY;
        }
    }
    __syncthreads();
    // ---- online softmax: warp w takes rows 4 w .. 4 w + 3, its lanes the tile's timesteps ----
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) {
      const int row = 4 * warp + rr;
      float x[T / 32];
      float tile_max = -INFINITY;
#pragma unroll
      for (int i = 0; i < T / 32; ++i) {
        x[i] = ss[row][lane + 32 * i];
        tile_max = fmaxf(tile_max, x[i]);
      }
      tile_max = warp_max(tile_max);
      const float m_old = row_m[row], m_new = fmaxf(m_old, tile_max);
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < T / 32; ++i) {
        const float p = x[i] == -INFINITY ? 0.0f : exp2_approx(x[i] - m_new);
        ps[row][lane + 32 * i] = __float2bfloat16_rn(p);
        sum += p;
      }
      sum = warp_sum(sum);
      __syncwarp();
      if (lane == 0) {
        const float corr = m_new == -INFINITY ? 1.0f : exp2_approx(m_old - m_new);  // exp2(-inf) = 0 on a first tile
        row_corr[row] = corr;
        row_m[row] = m_new;
        row_l[row] = fmaf(row_l[row], corr, sum);
      }
    }
    __syncthreads();
    // ---- O += P V for this warp's dims [warp D / 4, (warp + 1) D / 4) ----
    {
      const float corr_lo = row_corr[g], corr_hi = row_corr[g + 8];
#pragma unroll
      for (int nt = 0; nt < S::ValueTiles; ++nt) {
        acc[nt][0] *= corr_lo;
        acc[nt][1] *= corr_lo;
        acc[nt][2] *= corr_hi;
        acc[nt][3] *= corr_hi;
      }
      const int d0 = warp * (D / kWarps);
#pragma unroll
      for (int k0 = 0; k0 < T; k0 += 16) {
        std::uint32_t pa[4];
        ldmatrix_x4(pa, &ps[(lane & 7) + ((lane >> 3) & 1) * 8][k0 + (lane >> 4) * 8]);
        if constexpr (S::ValueTiles == 1) {
          std::uint32_t vb[2];
          ldmatrix_x2_trans(vb, &vs[k0 + (lane & 7) + ((lane >> 3) & 1) * 8][d0]);
          mma_bf16_16816(acc[0], pa, vb[0], vb[1]);
        } else {
#pragma unroll
          for (int nt = 0; nt < S::ValueTiles; nt += 2) {
            std::uint32_t vb[4];
            ldmatrix_x4_trans(vb, &vs[k0 + (lane & 7) + ((lane >> 3) & 1) * 8][d0 + 8 * nt + (lane >> 4) * 8]);
            mma_bf16_16816(acc[nt], pa, vb[0], vb[1]);
            mma_bf16_16816(acc[nt + 1], pa, vb[2], vb[3]);
          }
        }
      }
    }
    __syncthreads();  // every warp is done with this tile's keys, values and weights
  }
  // ---- the partials: natural-log maximum, sum of weights, accumulators per head ----
  const int d0 = warp * (D / kWarps);
#pragma unroll
  for (int nt = 0; nt < S::ValueTiles; ++nt)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int row = g + 8 * (c / 2);
      if (row < G) ws[row * ws_head + kPartialHeader + d0 + 8 * nt + 2 * t4 + (c % 2)] = acc[nt][c];
    }
  if (tid < G) {
    ws[tid * ws_head] = row_m[tid] * kLn2;
    ws[tid * ws_head + 1] = row_l[tid];
  }
}

}  // namespace

void launch_tq_decode_tiles(const AttendParams& a, dim3 grid, cudaStream_t stream) {
  RowCodebooks books{};
  for (int i = 0; i < 16; ++i) {
    books.key[i] = a.key_centroids[i];
    books.value[i] = a.value_centroids[i];
    books.outlier[i] = a.outlier_centroids[i];
  }
  switch (a.l.head_dim) {
    case 32:
      launch_dependent(decode_tiles_kernel<1>, grid, dim3(32 * kWarps), stream, "TurboQuant decode (tiles)", a, books);
      break;
    case 64:
      launch_dependent(decode_tiles_kernel<2>, grid, dim3(32 * kWarps), stream, "TurboQuant decode (tiles)", a, books);
      break;
    case 128:
      launch_dependent(decode_tiles_kernel<4>, grid, dim3(32 * kWarps), stream, "TurboQuant decode (tiles)", a, books);
      break;
    case 256:
      launch_dependent(decode_tiles_kernel<8>, grid, dim3(32 * kWarps), stream, "TurboQuant decode (tiles)", a, books);
      break;
    default: throw Error("head_dim", "no CUDA TurboQuant kernel for this head_dim");
  }
}

}  // namespace flashtq::cuda

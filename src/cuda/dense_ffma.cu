// Dense forward for f32 inputs in f32 arithmetic (FFMA), tiled: the f32 path with
// AttentionParams::pedantic_f32 (the default runs error-compensated TF32, dense_tf32.cu). A block of 8 warps owns 128
// query rows (16 per warp); K and V tiles of 64 keys go through shared memory (one buffer each: K of the next tile
// loads while P V runs, V of the next while the scores run). Lane (rg, kg) = (lane / 8, lane % 8) of a warp holds rows
// rg + 4 i (i < 4) of the warp's 16 and keys kg + 8 j (j < 8) of the tile, and dims 32 c + 4 kg + {0..3} of the output:
// every shared-memory read is a 16-byte vector that 4 or 8 lanes share or that 8 lanes read contiguously, and each
// thread does 32 FFMA per 3 such reads for the scores and 64 per 5 for P V. P passes through shared memory (rows
// private to a warp). The softmax, features and store are dense_softmax.cuh's.
#include "core/visibility.hpp"
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/dense_softmax.cuh"
#include "cuda/kernels.hpp"
#include "cuda/launch.hpp"
#include "cuda/row_blocks.cuh"
#include "cuda/stage_rows.cuh"

namespace flashtq::cuda {
namespace {

constexpr RowOrder kRowOrder = tiles::kFfmaForward.order;  // row_blocks.cuh

constexpr int kRows = tiles::kFfmaForward.rows, kWarpRows = 16, kKeys = 64, kThreads = 256;
constexpr int kPad = 4;           // floats per Q/K/V row: rows 4 banks apart
constexpr int kPRow = kKeys + 8;  // floats per P row: rows 8 banks apart

template <int D>
constexpr int shared_floats() {
  return (kRows + 2 * kKeys) * (D + kPad) + kRows * kPRow;
}

template <int D>
__global__ void __launch_bounds__(kThreads, 1)
    forward_ffma_kernel(DenseProblem p, TensorView qv, TensorView kv, TensorView vv, TensorView ov, float* lse,
                        unsigned* unfinished) {
  constexpr int kChunks = D / 32;  // 4-dim output chunks per thread
  extern __shared__ __align__(16) unsigned char smem_raw[];
  using Row = float[D + kPad];
  Row* const q_tile = reinterpret_cast<Row*>(smem_raw);
  Row* const k_tile = q_tile + kRows;
  Row* const v_tile = k_tile + kKeys;
  float(*const p_tile)[kPRow] = reinterpret_cast<float(*)[kPRow]>(v_tile + kKeys);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, rg = lane / 8, kg = lane % 8;
  const RowBlock block = this_row_block(p, kRows, kRowOrder);
  const std::int64_t b = block.b, h = block.h, hk = block.hk, i0 = block.i0;
  const int r0 = warp * kWarpRows + rg;  // this thread's rows in the block: r0 + 4 i
  // Layout for dense_softmax.cuh: row i = 2 a + half, key j = 2 nt + x, dim chunk dt / 2 with pair dt % 2.
  auto row_of = [=](int a, int half) { return i0 + r0 + 4 * (2 * a + half); };
  auto key_of = [=](int nt, int x) { return kg + 8 * (2 * nt + x); };
  auto dim_of = [=](int dt, int x) { return 32 * (dt / 2) + 4 * kg + 2 * (dt % 2) + x; };
  const auto tile = score_tile<8>(p, b, h, row_of, key_of, dim_of);
  float o[2][2 * kChunks][4] = {};
  float m[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}}, l[2][2] = {};
  const core::KeyRange range = core::key_range(p, i0, min(i0 + kRows, p.Sq));
  const std::int64_t first = range.begin / kKeys * kKeys;
  auto stage = [&](Row* dst, const TensorView& t, std::int64_t j0) {
    stage_rows<float, D, kPad, kThreads>(dst, t, b, hk, j0, kKeys, p.Sk, tid);
    cp_async_commit();
  };
  stage_rows<float, D, kPad, kThreads>(q_tile, qv, b, h, i0, kRows, p.Sq, tid);  // committed with K of the first tile
  if (first < range.end) {
    stage(k_tile, kv, first);
    stage(v_tile, vv, first);
  } else {
    cp_async_commit();
  }
  for (std::int64_t j0 = first; j0 < range.end; j0 += kKeys) {
    const bool more = j0 + kKeys < range.end;
    cp_async_wait<1>();  // K of this tile (and Q) landed; V may still be in flight
    __syncthreads();
    // S = Q K^T: 4 dims a step, Q's 4 rows and K's 8 keys as float4.
    float s[2][4][4] = {};
#pragma unroll 4  // faster than 2; the FMA order within a step makes no difference (docs/benchmarks.md)
    for (int d = 0; d < D; d += 4) {
      float4 q[4], k[8];
#pragma unroll
      for (int i = 0; i < 4; ++i) q[i] = *reinterpret_cast<const float4*>(&q_tile[r0 + 4 * i][d]);
#pragma unroll
      for (int j = 0; j < 8; ++j) k[j] = *reinterpret_cast<const float4*>(&k_tile[kg + 8 * j][d]);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          float& acc = s[i / 2][j / 2][2 * (i % 2) + j % 2];
          acc = fmaf(q[i].x, k[j].x, acc);
          acc = fmaf(q[i].y, k[j].y, acc);
          acc = fmaf(q[i].z, k[j].z, acc);
          acc = fmaf(q[i].w, k[j].w, acc);
        }
      }
    }
    __syncthreads();  // every warp is done with K: refill it while P V runs
    if (more) stage(k_tile, kv, j0 + kKeys);
    const bool interior = j0 >= range.begin && j0 + kKeys <= p.Sk &&
                          core::tile_fully_visible(p, i0, min(i0 + kRows, p.Sq), j0, j0 + kKeys);
    softmax_tile(tile, j0, interior, s, m, l, o);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 8; ++j) p_tile[r0 + 4 * i][kg + 8 * j] = s[i / 2][j / 2][2 * (i % 2) + j % 2];
    }
    if (more) {
      cp_async_wait<1>();  // V of this tile landed; K of the next may still be in flight
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // V, and this warp's P rows, visible
                      // O += P V: 4 keys a step, P's 4 rows and V's rows as float4.
#pragma unroll 2
    for (int k = 0; k < kKeys; k += 4) {
      float4 w[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) w[i] = *reinterpret_cast<const float4*>(&p_tile[r0 + 4 * i][k]);
#pragma unroll
      for (int x = 0; x < 4; ++x) {
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          const float4 v = *reinterpret_cast<const float4*>(&v_tile[k + x][32 * c + 4 * kg]);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float pw = x == 0 ? w[i].x : x == 1 ? w[i].y : x == 2 ? w[i].z : w[i].w;
            float(&out)[4] = o[i / 2][2 * c];
            float(&out2)[4] = o[i / 2][2 * c + 1];
            const int e = 2 * (i % 2);
            out[e] = fmaf(pw, v.x, out[e]);
            out[e + 1] = fmaf(pw, v.y, out[e + 1]);
            out2[e] = fmaf(pw, v.z, out2[e]);
            out2[e + 1] = fmaf(pw, v.w, out2[e + 1]);
          }
        }
      }
    }
    __syncthreads();  // every warp is done with V (and P): refill V while the next scores run
    if (more) stage(v_tile, vv, j0 + kKeys);
  }
  store_rows<float>(tile, ov, lse, o, m, l, unfinished);
}

template <int D>
void launch_dim(const ForwardCall& c, dim3 grid, cudaStream_t stream) {
  constexpr int smem = shared_floats<D>() * int(sizeof(float));
  allow_shared_bytes<forward_ffma_kernel<D>>(smem);
  forward_ffma_kernel<D><<<grid, kThreads, smem, stream>>>(c.p, c.q, c.k, c.v, c.out, c.lse, unfinished_rows_flag());
}

}  // namespace

void launch_dense_forward_ffma(const ForwardCall& c) {
  const dim3 grid = row_block_grid(c.p, kRows, kRowOrder);
  auto stream = static_cast<cudaStream_t>(c.stream);
  for_head_dim(c.p.D, [&](auto d) { launch_dim<decltype(d)::value>(c, grid, stream); });
  FLASHTQ_CUDA_CHECK_LAUNCH("dense forward (f32 FFMA tiles)");
}

}  // namespace flashtq::cuda

// Dense forward on tensor cores (f16/bf16, head_dim 32/64/96/128), FlashAttention-2 style: a block of
// 4 warps owns 128 query rows (32 per warp, Q staged in shared memory); K and V tiles of 64 keys go
// through shared memory, double-buffered with cp.async so the next tile loads during this one's math.
// S = Q K^T and O += P V run on mma.sync m16n8k16 with f32 accumulators, P staying in registers
// between the two (its C fragments are the next product's A fragments); the softmax runs on exp2.
// Every feature of docs/spec.md §1 (strides, GQA, causal offset, window, mask, dropout, LSE); tiles no row
// of the block can see are skipped, and per-element checks run only on boundary tiles. K's and V's
// B fragments come from their row-major tiles through ldmatrix (.trans for V), four 8x8 matrices a time.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/visibility.hpp"
#include "cuda/common.cuh"
#include "cuda/mma.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/dense_softmax.cuh"
#include "cuda/stage_rows.cuh"
#include "cuda/kernels.hpp"
#include "cuda/launch.hpp"
#include "cuda/row_blocks.cuh"

namespace flashtq::cuda {
namespace {

constexpr RowOrder kRowOrder = tiles::kMmaForward.order;  // row_blocks.cuh

// A block of 4 warps owns 128 query rows: each warp two 16-row mma atoms (rows 16 w + [0, 16) and
// 64 + 16 w + [0, 16)), so every K and V fragment read from shared memory feeds two products.
constexpr int kRows = tiles::kMmaForward.rows, kAtomRows = 64, kThreads = 128;
// Keys per K/V tile: 64, or 32 for head_dim 96 and 128 (the S fragments then fit beside O's registers).
template <int D>
constexpr int kKeysFor = D >= 96 ? 32 : 64;

// Volatile asm: the products issue in source order (non-volatile, letting the compiler reorder
// them, was slower here and in the TurboQuant decode; docs/benchmarks.md).
template <typename T>
__device__ __forceinline__ void mma(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  mma_16816<T>(d, a[0], a[1], a[2], a[3], b0, b1);
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads, 2)
    forward_mma_kernel(DenseProblem p, TensorView qv, TensorView kv, TensorView vv, TensorView ov, float* lse,
                       unsigned* unfinished) {
  // Shared memory: the block's Q tile, then two stages of K and V tiles (rows padded by 8 elements
  // so that the 8 rows an ldmatrix reads fall in distinct banks): the copy engine fills one stage
  // (cp.async) while the warps compute on the other.
  constexpr int kKeys = kKeysFor<D>, NT = kKeys / 8;  // keys per tile, their n-tiles in S
  extern __shared__ __align__(16) unsigned char smem_raw[];
  using Row = T[D + 8];
  Row* q_tile = reinterpret_cast<Row*>(smem_raw);
  Row* const k_stages = q_tile + kRows;  // stage s at k_stages + s * kKeys
  Row* const v_stages = k_stages + 2 * kKeys;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, tig = lane % 4;
  const RowBlock block = this_row_block(p, kRows, kRowOrder);
  const std::int64_t b = block.b, h = block.h, hk = block.hk, i0 = block.i0;
  // This warp's two 16-row atoms: rows kAtomRows * a + 16 warp + [0, 16) of the block; lane (g, tig)
  // holds rows g and g + 8 of each.
  auto row_of = [&](int a, int half) { return i0 + kAtomRows * a + 16 * warp + g + 8 * half; };
  constexpr int KS = D / 16;  // k-steps of S = Q K^T
  float o[2][D / 8][4] = {};
  float m[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}}, l[2][2] = {};
  const core::KeyRange range = core::key_range(p, i0, min(i0 + kRows, p.Sq));
  const auto tile = mma_layout(p, b, h, tig, row_of);
  auto issue = [&](std::int64_t j0, int stage) {
    stage_rows<T, D, 8, kThreads>(k_stages + stage * kKeys, kv, b, hk, j0, kKeys, p.Sk, tid);
    stage_rows<T, D, 8, kThreads>(v_stages + stage * kKeys, vv, b, hk, j0, kKeys, p.Sk, tid);
    cp_async_commit();
  };
  stage_rows<T, D, 8, kThreads>(q_tile, qv, b, h, i0, kRows, p.Sq, tid);  // committed with the first K/V tile
  auto nothing = [](std::int64_t, int) {};
  for_each_key_tile<kKeys>(range.begin, range.end, issue, nothing, [&](std::int64_t j0, int stage) {
    const Row* k_tile = k_stages + stage * kKeys;
    const Row* v_tile = v_stages + stage * kKeys;
    // S = Q K^T for this warp's 2 x 16 rows x 64 keys (8 n-tiles), two k-steps at a time: Q's A
    // fragments by ldmatrix .x4 (matrices: rows 0-7 / 8-15 x dims 0-7 / 8-15 of the step), K's B
    // fragments by one ldmatrix .x4 per n-tile (lanes 8 m .. 8 m + 7 address key rows of matrix m,
    // dims 8 m .. 8 m + 7 of the pair), each used by both atoms.
    float s[2][NT][4] = {};
#pragma unroll
    for (int ks = 0; ks < KS; ks += 2) {
      std::uint32_t qa[2][2][4];
#pragma unroll
      for (int a = 0; a < 2; ++a) {
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(
              &q_tile[kAtomRows * a + 16 * warp + lane % 8 + 8 * ((lane / 8) & 1)][16 * (ks + x) + 8 * (lane / 16)]));
          ldmatrix_x4(qa[a][x], addr);
        }
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        std::uint32_t kb[4];
        const unsigned addr =
            static_cast<unsigned>(__cvta_generic_to_shared(&k_tile[nt * 8 + lane % 8][16 * ks + 8 * (lane / 8)]));
        ldmatrix_x4(kb, addr);
#pragma unroll
        for (int a = 0; a < 2; ++a) {
          mma<T>(s[a][nt], qa[a][0], kb[0], kb[1]);
          mma<T>(s[a][nt], qa[a][1], kb[2], kb[3]);
        }
      }
    }
    const bool interior = j0 >= range.begin && j0 + kKeys <= p.Sk &&
                          core::tile_fully_visible(p, i0, min(i0 + kRows, p.Sq), j0, j0 + kKeys);
    softmax_tile(tile, j0, interior, s, m, l, o);
    // O += P V: P's C fragments become A fragments (keys 16 kk .. 16 kk + 15); V's B fragments for two
    // n-tiles by one ldmatrix .x4 .trans (lanes 8 m .. 8 m + 7 address the key rows of matrix m: keys
    // + 8 for odd m, the second n-tile for m >= 2), each used by both atoms.
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      std::uint32_t pa[2][4];
#pragma unroll
      for (int a = 0; a < 2; ++a) {
        pa[a][0] = pack2<T>(s[a][2 * kk][0], s[a][2 * kk][1]);
        pa[a][1] = pack2<T>(s[a][2 * kk][2], s[a][2 * kk][3]);
        pa[a][2] = pack2<T>(s[a][2 * kk + 1][0], s[a][2 * kk + 1][1]);
        pa[a][3] = pack2<T>(s[a][2 * kk + 1][2], s[a][2 * kk + 1][3]);
      }
#pragma unroll
      for (int nt = 0; nt < D / 8; nt += 2) {
        std::uint32_t vb[4];
        const unsigned addr = static_cast<unsigned>(
            __cvta_generic_to_shared(&v_tile[16 * kk + lane % 8 + 8 * ((lane / 8) & 1)][(nt + lane / 16) * 8]));
        ldmatrix_x4_trans(vb, addr);
#pragma unroll
        for (int a = 0; a < 2; ++a) {
          mma<T>(o[a][nt], pa[a], vb[0], vb[1]);
          mma<T>(o[a][nt + 1], pa[a], vb[2], vb[3]);
        }
      }
    }
  });
  store_rows<T>(tile, ov, lse, o, m, l, unfinished);
}

template <typename T, int D>
void launch_dim(const ForwardCall& c, dim3 grid, cudaStream_t stream) {
  constexpr int smem = (kRows + 4 * kKeysFor<D>)*(D + 8) * int(sizeof(T));  // Q, and K and V in two stages each
  allow_shared_bytes<forward_mma_kernel<T, D>>(smem);
  forward_mma_kernel<T, D><<<grid, kThreads, smem, stream>>>(c.p, c.q, c.k, c.v, c.out, c.lse, unfinished_rows_flag());
}

template <typename T>
void launch_for(const ForwardCall& c) {
  const dim3 grid = row_block_grid(c.p, kRows, kRowOrder);
  auto stream = static_cast<cudaStream_t>(c.stream);
  for_head_dim(c.p.D, [&](auto d) { launch_dim<T, decltype(d)::value>(c, grid, stream); });
  FLASHTQ_CUDA_CHECK_LAUNCH("dense forward (tensor cores)");
}

}  // namespace

void launch_dense_forward_mma(const ForwardCall& c) {
  if (c.p.dtype == DType::f16) {
    launch_for<__half>(c);
  } else {
    launch_for<__nv_bfloat16>(c);
  }
}

}  // namespace flashtq::cuda

// Dense forward for f32 inputs on TF32 tensor cores (the opt-in AttentionParams::allow_tf32 path;
// SPEC §3 bounds its error at 2e-3): the layout of the f16/bf16 mma.sync kernel (dense_mma.cu) with
// mma.m16n8k8.tf32. A block of 4 warps owns 128 query rows (two 16-row atoms per warp); K and V
// tiles are double-buffered by cp.async and rounded to TF32 in place by the threads that copied
// them (Q once), so each value is rounded once however many products read it. Q's and K's fragments
// come through ldmatrix (an 8 x 8 matrix of 16-bit halves is an 8 x 4 matrix of floats); V's by
// single loads: P's C fragments feed O += P V as A fragments when the keys of each 8-key step are
// taken in the order 0, 2, 4, 6 | 1, 3, 5, 7, and V's rows are read in that order.
#include "core/visibility.hpp"
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/dense_softmax.cuh"
#include "cuda/kernels.hpp"
#include "cuda/launch.hpp"
#include "cuda/stage_rows.cuh"

namespace flashtq::cuda {
namespace {

constexpr int kRows = 128, kAtomRows = 64, kThreads = 128;
// Rows padded by 4 floats: the 8 rows an ldmatrix reads, and V's column reads (rows 2t, 2t + 1 of
// a step, 8 columns), fall in distinct banks.
constexpr int kPad = 4;
template <int D>
constexpr int kKeysFor = D >= 96 ? 32 : 64;

__device__ __forceinline__ std::uint32_t to_tf32(float x) {
  std::uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Rounds this thread's staged chunks of a tile to TF32 in place (after its copies have landed).
template <int D>
__device__ __forceinline__ void round_staged(float (*tile)[D + kPad], int rows, int tid) {
  for_staged_chunks<float, D, kPad, kThreads>(tile, rows, tid, [](float* chunk) {
    float4 x = *reinterpret_cast<float4*>(chunk);
    x = make_float4(__uint_as_float(to_tf32(x.x)), __uint_as_float(to_tf32(x.y)), __uint_as_float(to_tf32(x.z)),
                    __uint_as_float(to_tf32(x.w)));
    *reinterpret_cast<float4*>(chunk) = x;
  });
}

template <int D>
__global__ void __launch_bounds__(kThreads, 2) forward_tf32_kernel(DenseProblem p, TensorView qv, TensorView kv, TensorView vv,
                                                                   TensorView ov, float* lse) {
  constexpr int kKeys = kKeysFor<D>, NT = kKeys / 8, DT = D / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  using Row = float[D + kPad];
  Row* q_tile = reinterpret_cast<Row*>(smem_raw);
  Row* const k_stages = q_tile + kRows;  // stage s at k_stages + s * kKeys
  Row* const v_stages = k_stages + 2 * kKeys;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, tig = lane % 4;
  const std::int64_t bh = blockIdx.y, b = bh / p.H, h = bh % p.H, hk = h / p.group();
  const std::int64_t i0 = std::int64_t(gridDim.x - 1 - blockIdx.x) * kRows;  // heaviest (causal) blocks first
  auto row_of = [&](int a, int half) { return i0 + kAtomRows * a + 16 * warp + g + 8 * half; };
  float o[2][DT][4] = {};
  float m[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}}, l[2][2] = {};
  const core::KeyRange range = core::key_range(p, i0, min(i0 + kRows, p.Sq));
  const auto tile = mma_layout(p, b, h, tig, row_of);
  auto issue = [&](std::int64_t j0, int stage) {
    stage_rows<float, D, kPad, kThreads>(k_stages + stage * kKeys, kv, b, hk, j0, kKeys, p.Sk, tid);
    stage_rows<float, D, kPad, kThreads>(v_stages + stage * kKeys, vv, b, hk, j0, kKeys, p.Sk, tid);
    cp_async_commit();
  };
  stage_rows<float, D, kPad, kThreads>(q_tile, qv, b, h, i0, kRows, p.Sq, tid);  // committed with the first K/V tile
  const std::int64_t first = range.begin / kKeys * kKeys;
  if (first < range.end) {
    issue(first, 0);
  } else {
    cp_async_commit();
  }
  int stage = 0;
  for (std::int64_t j0 = first; j0 < range.end; j0 += kKeys, stage ^= 1) {
    if (j0 + kKeys < range.end) {
      issue(j0 + kKeys, stage ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    Row* k_tile = k_stages + stage * kKeys;
    Row* v_tile = v_stages + stage * kKeys;
    if (j0 == first) round_staged<D>(q_tile, kRows, tid);
    round_staged<D>(k_tile, kKeys, tid);
    round_staged<D>(v_tile, kKeys, tid);
    __syncthreads();  // this stage's tiles (and, the first time, Q), rounded, visible to every warp
    // S = Q K^T, 8 dims a step: Q's A fragments by ldmatrix .x4 (matrices: rows 0-7 / 8-15 x dims
    // 0-3 / 4-7), K's B fragments for two steps by one ldmatrix .x4 (dims 0-3, 4-7, 8-11, 12-15).
    float s[2][NT][4] = {};
#pragma unroll
    for (int ks = 0; ks < D / 8; ks += 2) {
      std::uint32_t qa[2][2][4];
#pragma unroll
      for (int a = 0; a < 2; ++a) {
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(
              &q_tile[kAtomRows * a + 16 * warp + lane % 8 + 8 * ((lane / 8) & 1)][8 * (ks + x) + 4 * (lane / 16)]));
          asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                       : "=r"(qa[a][x][0]), "=r"(qa[a][x][1]), "=r"(qa[a][x][2]), "=r"(qa[a][x][3]) : "r"(addr));
        }
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        std::uint32_t kb[4];
        const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(&k_tile[nt * 8 + lane % 8][8 * ks + 4 * (lane / 8)]));
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(kb[0]), "=r"(kb[1]), "=r"(kb[2]), "=r"(kb[3]) : "r"(addr));
#pragma unroll
        for (int a = 0; a < 2; ++a) {
          mma_tf32(s[a][nt], qa[a][0], kb[0], kb[1]);
          mma_tf32(s[a][nt], qa[a][1], kb[2], kb[3]);
        }
      }
    }
    const bool interior = j0 >= range.begin && j0 + kKeys <= p.Sk &&
                          core::tile_fully_visible(p, i0, min(i0 + kRows, p.Sq), j0, j0 + kKeys);
    softmax_tile(tile, j0, interior, s, m, l, o);
    // O += P V, 8 keys a step in the order 0, 2, 4, 6 | 1, 3, 5, 7: A fragment (c0, c2, c1, c3) of the
    // step's n-tile; B fragment rows 2 tig and 2 tig + 1 of V, column g of each n-tile.
#pragma unroll
    for (int kk = 0; kk < NT; ++kk) {
      std::uint32_t pa[2][4];
#pragma unroll
      for (int a = 0; a < 2; ++a) {
        pa[a][0] = to_tf32(s[a][kk][0]);
        pa[a][1] = to_tf32(s[a][kk][2]);
        pa[a][2] = to_tf32(s[a][kk][1]);
        pa[a][3] = to_tf32(s[a][kk][3]);
      }
      const float* v0 = &v_tile[8 * kk + 2 * tig][g];
      const float* v1 = &v_tile[8 * kk + 2 * tig + 1][g];
#pragma unroll
      for (int nt = 0; nt < DT; ++nt) {
        const std::uint32_t b0 = __float_as_uint(v0[8 * nt]), b1 = __float_as_uint(v1[8 * nt]);
#pragma unroll
        for (int a = 0; a < 2; ++a) mma_tf32(o[a][nt], pa[a], b0, b1);
      }
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }
  store_rows<float>(tile, ov, lse, o, m, l);
}

template <int D>
void launch_dim(const ForwardCall& c, dim3 grid, cudaStream_t stream) {
  constexpr int smem = (kRows + 4 * kKeysFor<D>) * (D + kPad) * int(sizeof(float));  // Q, K and V in two stages
  allow_shared_bytes<forward_tf32_kernel<D>>(smem);
  forward_tf32_kernel<D><<<grid, kThreads, smem, stream>>>(c.p, c.q, c.k, c.v, c.out, c.lse);
}

}  // namespace

bool launch_dense_forward_tf32(const ForwardCall& c) {
  if (!c.p.tf32 || c.p.dtype != DType::f32) return false;
  if (!rows_aligned16(c.q) || !rows_aligned16(c.k) || !rows_aligned16(c.v)) return false;
  if (c.p.B * c.p.H > 65535) return false;
  const dim3 grid(unsigned((c.p.Sq + kRows - 1) / kRows), unsigned(c.p.B * c.p.H));
  auto stream = static_cast<cudaStream_t>(c.stream);
  if (!for_head_dim(c.p.D, [&](auto d) { launch_dim<decltype(d)::value>(c, grid, stream); })) return false;
  FLASHTQ_CUDA_CHECK_LAUNCH("dense forward (tf32 tensor cores)");
  return true;
}

}  // namespace flashtq::cuda

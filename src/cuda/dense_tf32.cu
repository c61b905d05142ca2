// Dense forward for f32 inputs on TF32 tensor cores (mma.m16n8k8.tf32), in one of two modes:
// - rounded (the opt-in AttentionParams::allow_tf32 path; docs/spec.md §3 bounds its error at 2e-3): each
//   operand rounded to TF32 once, one product per multiply. A block of 4 warps owns 128 query rows
//   (two 16-row atoms per warp); the threads that copied a tile round it in place.
// - compensated (the default f32 path: f32 accuracy, docs/spec.md §3's 1e-5): each operand x is split into
//   big = tf32(x) and small = tf32(x - big) as its fragment is read, and a b is taken as
//   a_small b_big + a_big b_small + a_big b_big (the dropped a_small b_small is ~2^-22 of a b) — the
//   error-compensated "3xTF32" scheme of CUTLASS's OpMultiplyAddFastF32, which PyTorch's efficient
//   attention runs for f32. Each key tile's P V is summed in fresh accumulators and added to O in
//   f32 (the tensor cores' accumulation truncates; over thousands of keys O would drift). Three
//   tensor-core products still beat f32 FMAs (timings: docs/benchmarks.md). A block of 8 warps
//   owns 256 rows (two atoms per warp), so each split K/V fragment feeds two atoms.
// K and V tiles are double-buffered by cp.async. Q's and K's fragments come through ldmatrix (an
// 8 x 8 matrix of 16-bit halves is an 8 x 4 matrix of floats); V's by single loads: P's C fragments
// feed O += P V as A fragments when the keys of each 8-key step are taken in the order
// 0, 2, 4, 6 | 1, 3, 5, 7, and V's rows are read in that order.
#include "core/visibility.hpp"
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/dense_softmax.cuh"
#include "cuda/kernels.hpp"
#include "cuda/launch.hpp"
#include "cuda/mma.cuh"
#include "cuda/row_blocks.cuh"
#include "cuda/stage_rows.cuh"

namespace flashtq::cuda {
namespace {

constexpr RowOrder kRowOrder = tiles::kTf32ForwardRounded.order;  // row_blocks.cuh

enum class Tf32Mode { rounded, compensated };

template <Tf32Mode M>
struct Tf32Config {
  static constexpr int kWarps = M == Tf32Mode::rounded ? 4 : 8;
  static constexpr int kBlocksPerSm = M == Tf32Mode::rounded ? 2 : 1;
  static constexpr int kThreads = 32 * kWarps, kAtomRows = 16 * kWarps, kRows = 2 * kAtomRows;
};
static_assert(Tf32Config<Tf32Mode::rounded>::kRows == tiles::kTf32ForwardRounded.rows &&
              Tf32Config<Tf32Mode::compensated>::kRows == tiles::kTf32ForwardCompensated.rows &&
              tiles::kTf32ForwardCompensated.order == kRowOrder);

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

// One operand element as TF32 parts: rounded mode uses `big` alone (already rounded in shared
// memory); compensated mode has x ~ big + small to ~2^-22.
struct Parts {
  std::uint32_t big, small;
};

template <Tf32Mode M>
__device__ __forceinline__ Parts parts_of(std::uint32_t bits) {
  if constexpr (M == Tf32Mode::rounded) {
    return {bits, 0u};
  } else {
    const float x = __uint_as_float(bits);
    const std::uint32_t big = to_tf32(x);
    return {big, to_tf32(x - __uint_as_float(big))};
  }
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], std::uint32_t a0, std::uint32_t a1, std::uint32_t a2,
                                         std::uint32_t a3, std::uint32_t b0, std::uint32_t b1) {
  // Not volatile: a pure function of its operands, so independent products may be interleaved.
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// d += a b for one m16n8k8 step: one product (rounded) or three, small terms first (compensated).
template <Tf32Mode M>
__device__ __forceinline__ void mma_step(float (&d)[4], const Parts (&a)[4], const Parts (&b)[2]) {
  if constexpr (M == Tf32Mode::compensated) {
    mma_tf32(d, a[0].small, a[1].small, a[2].small, a[3].small, b[0].big, b[1].big);
    mma_tf32(d, a[0].big, a[1].big, a[2].big, a[3].big, b[0].small, b[1].small);
  }
  mma_tf32(d, a[0].big, a[1].big, a[2].big, a[3].big, b[0].big, b[1].big);
}

// Rounds this thread's staged chunks of a tile to TF32 in place (after its copies have landed).
template <int D, int Threads>
__device__ __forceinline__ void round_staged(float (*tile)[D + kPad], int rows, int tid) {
  for_staged_chunks<float, D, kPad, Threads>(tile, rows, tid, [](float* chunk) {
    float4 x = *reinterpret_cast<float4*>(chunk);
    x = make_float4(__uint_as_float(to_tf32(x.x)), __uint_as_float(to_tf32(x.y)), __uint_as_float(to_tf32(x.z)),
                    __uint_as_float(to_tf32(x.w)));
    *reinterpret_cast<float4*>(chunk) = x;
  });
}

template <int D, Tf32Mode M>
__global__ void __launch_bounds__(Tf32Config<M>::kThreads, Tf32Config<M>::kBlocksPerSm)
    forward_tf32_kernel(DenseProblem p, TensorView qv, TensorView kv, TensorView vv, TensorView ov, float* lse,
                        unsigned* unfinished) {
  using C = Tf32Config<M>;
  constexpr int kKeys = kKeysFor<D>, NT = kKeys / 8, DT = D / 8, kRows = C::kRows, kThreads = C::kThreads;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  using Row = float[D + kPad];
  Row* q_tile = reinterpret_cast<Row*>(smem_raw);
  Row* const k_stages = q_tile + kRows;  // stage s at k_stages + s * kKeys
  Row* const v_stages = k_stages + 2 * kKeys;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, tig = lane % 4;
  const RowBlock block = this_row_block(p, kRows, kRowOrder);
  const std::int64_t b = block.b, h = block.h, hk = block.hk, i0 = block.i0;
  auto row_of = [&](int a, int half) { return i0 + C::kAtomRows * a + 16 * warp + g + 8 * half; };
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
  auto round = [&](std::int64_t j0, int stage) {  // this thread's own chunks, before the block sees them
    if constexpr (M == Tf32Mode::rounded) {
      if (j0 == first) round_staged<D, kThreads>(q_tile, kRows, tid);
      round_staged<D, kThreads>(k_stages + stage * kKeys, kKeys, tid);
      round_staged<D, kThreads>(v_stages + stage * kKeys, kKeys, tid);
    }
  };
  for_each_key_tile<kKeys>(range.begin, range.end, issue, round, [&](std::int64_t j0, int stage) {
    Row* k_tile = k_stages + stage * kKeys;
    Row* v_tile = v_stages + stage * kKeys;
    // S = Q K^T, 8 dims a step: Q's A fragments by ldmatrix .x4 (matrices: rows 0-7 / 8-15 x dims
    // 0-3 / 4-7), K's B fragments for two steps by one ldmatrix .x4 (dims 0-3, 4-7, 8-11, 12-15).
    float s[2][NT][4] = {};
#pragma unroll
    for (int ks = 0; ks < D / 8; ks += 2) {
      Parts qa[2][2][4];
#pragma unroll
      for (int a = 0; a < 2; ++a) {
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(
              &q_tile[C::kAtomRows * a + 16 * warp + lane % 8 + 8 * ((lane / 8) & 1)][8 * (ks + x) + 4 * (lane / 16)]));
          std::uint32_t r[4];
          ldmatrix_x4(r, addr);
#pragma unroll
          for (int e = 0; e < 4; ++e) qa[a][x][e] = parts_of<M>(r[e]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        std::uint32_t r[4];
        const unsigned addr =
            static_cast<unsigned>(__cvta_generic_to_shared(&k_tile[nt * 8 + lane % 8][8 * ks + 4 * (lane / 8)]));
        ldmatrix_x4(r, addr);
        const Parts kb[2][2] = {{parts_of<M>(r[0]), parts_of<M>(r[1])}, {parts_of<M>(r[2]), parts_of<M>(r[3])}};
#pragma unroll
        for (int x = 0; x < 2; ++x) {
#pragma unroll
          for (int a = 0; a < 2; ++a) mma_step<M>(s[a][nt], qa[a][x], kb[x]);
        }
      }
    }
    const bool interior = j0 >= range.begin && j0 + kKeys <= p.Sk &&
                          core::tile_fully_visible(p, i0, min(i0 + kRows, p.Sq), j0, j0 + kKeys);
    softmax_tile(tile, j0, interior, s, m, l, o);
    // O += P V, 8 keys a step in the order 0, 2, 4, 6 | 1, 3, 5, 7: A fragment (c0, c2, c1, c3) of the
    // step's n-tile; B fragment rows 2 tig and 2 tig + 1 of V, column g of each n-tile. P is rounded
    // (split) here in both modes: it is computed, not staged.
    Parts pa[2][NT][4];
#pragma unroll
    for (int a = 0; a < 2; ++a) {
#pragma unroll
      for (int kk = 0; kk < NT; ++kk) {
        constexpr int kOrder[4] = {0, 2, 1, 3};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          pa[a][kk][e] = M == Tf32Mode::rounded ? Parts{to_tf32(s[a][kk][kOrder[e]]), 0u}
                                                : parts_of<Tf32Mode::compensated>(__float_as_uint(s[a][kk][kOrder[e]]));
        }
      }
    }
#pragma unroll
    for (int nt = 0; nt < DT; ++nt) {
      // Compensated mode sums this tile's P V for the n-tile in fresh accumulators and adds them to O
      // in f32: a tensor-core accumulation truncates, so O accumulated there over thousands of keys
      // drifts (1e-4 at 16k keys, measured); within one tile the drift is ~1e-7.
      float fresh[2][4] = {};
      auto target = [&](int a) -> float(&)[4] {
        if constexpr (M == Tf32Mode::rounded) {
          return o[a][nt];
        } else {
          return fresh[a];
        }
      };
#pragma unroll
      for (int kk = 0; kk < NT; ++kk) {
        const Parts vb[2] = {parts_of<M>(__float_as_uint(v_tile[8 * kk + 2 * tig][g + 8 * nt])),
                             parts_of<M>(__float_as_uint(v_tile[8 * kk + 2 * tig + 1][g + 8 * nt]))};
#pragma unroll
        for (int a = 0; a < 2; ++a) mma_step<M>(target(a), pa[a][kk], vb);
      }
      if constexpr (M == Tf32Mode::compensated) {
#pragma unroll
        for (int a = 0; a < 2; ++a) {
#pragma unroll
          for (int e = 0; e < 4; ++e) o[a][nt][e] += fresh[a][e];
        }
      }
    }
  });
  store_rows<float>(tile, ov, lse, o, m, l, unfinished);
}

template <int D, Tf32Mode M>
void launch_dim(const ForwardCall& c, cudaStream_t stream) {
  constexpr int rows = Tf32Config<M>::kRows;
  constexpr int smem = (rows + 4 * kKeysFor<D>)*(D + kPad) * int(sizeof(float));  // Q, K and V in two stages
  allow_shared_bytes<forward_tf32_kernel<D, M>>(smem);
  const dim3 grid = row_block_grid(c.p, rows, kRowOrder);
  forward_tf32_kernel<D, M>
      <<<grid, Tf32Config<M>::kThreads, smem, stream>>>(c.p, c.q, c.k, c.v, c.out, c.lse, unfinished_rows_flag());
}

}  // namespace

void launch_dense_forward_tf32(const ForwardCall& c) {
  auto stream = static_cast<cudaStream_t>(c.stream);
  for_head_dim(c.p.D, [&](auto d) {
    constexpr int D = decltype(d)::value;
    if (c.p.tf32) {
      launch_dim<D, Tf32Mode::rounded>(c, stream);
    } else {
      launch_dim<D, Tf32Mode::compensated>(c, stream);
    }
  });
  FLASHTQ_CUDA_CHECK_LAUNCH(c.p.tf32 ? "dense forward (tf32 tensor cores)"
                                     : "dense forward (error-compensated tf32 tensor cores)");
}

}  // namespace flashtq::cuda

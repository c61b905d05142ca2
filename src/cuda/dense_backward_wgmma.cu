// Dense backward on Hopper (sm_90a), f16/bf16, head_dim 64 and 128: wgmma products, TMA loads, two
// consumer warpgroups taking turns on the tensor cores and a producer warpgroup, as the forward
// (dense_wgmma.cu). Two kernels, no atomics, so the result is deterministic:
// - dK, dV: a block owns 128 keys of one kv head (64 per warpgroup) and walks every query tile of
//   64 rows that sees them, for every query head of the group (GQA's reduction stays in registers):
//   S^T = K Q^T and dP^T = V dO^T, then P^T and dS^T = P^T (dP^T - Delta) scale elementwise, then
//   dV += P^T dO and dK += dS^T Q with P^T and dS^T as register operands.
// - dQ: a block owns 128 query rows (64 per warpgroup) and walks the key tiles of 64 they see:
//   S = Q K^T and dP = dO V^T, then dQ += dS K.
// P comes from the forward's LSE (P = exp(S scale + mask - LSE)). A first kernel computes each row's
// Delta_i = <dO_i, O_i> and LSE in log2 units once, and stashes them (a float2) at the start of the
// row's dQ, which nothing reads or writes before the dQ kernel: the dK/dV kernel reads them there,
// the dQ kernel reads its rows' stash before it overwrites them. Dropout decisions come from hash3.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/hash3.hpp"
#include "core/softcap.hpp"
#include "core/visibility.hpp"
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernel_choice.hpp"
#include "cuda/kernels.hpp"
#include "cuda/launch.hpp"
#include "cuda/tensor_map.hpp"
#include "cuda/tma.cuh"
#include "cuda/unfinished_rows.cuh"
#include "cuda/wgmma.cuh"

namespace flashtq::cuda {
namespace {

constexpr int kGroups = 2, kThreads = 128 * (kGroups + 1);  // two consumer warpgroups, one producer
constexpr int kStages = 3;
[[maybe_unused]] constexpr int kGroupRows = 64;  // rows (keys for dK/dV, queries for dQ) per consumer warpgroup

struct Maps {
  CUtensorMap q, k, v, dout;
};

// The stash of row (b, i, h): (lse2, delta) in the first 8 bytes of its dQ row.
__device__ __forceinline__ float2* stash_of(const BackwardCall& c, std::int64_t b, std::int64_t i, std::int64_t h) {
  return reinterpret_cast<float2*>(static_cast<char*>(c.dq.data) + row_offset(c.dq, b, i, h) * 2);
}

// Delta and lse2 of every row: D / 8 threads per row, 16 bytes each.
template <typename T, int D>
__global__ void stash_row_stats_kernel(BackwardCall c) {
  constexpr int kParts = D / 8;
  const DenseProblem& p = c.p;
  const std::int64_t id = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x, row = id / kParts;
  const int part = int(id % kParts);
  const bool valid = row < p.B * p.H * p.Sq;
  const std::int64_t i = row % p.Sq, h = (row / p.Sq) % p.H, b = row / p.Sq / p.H;
  float acc = 0.0f;
  if (valid) {
    const uint4 x =
        *reinterpret_cast<const uint4*>(static_cast<const T*>(c.dout.data) + row_offset(c.dout, b, i, h) + 8 * part);
    const uint4 y =
        *reinterpret_cast<const uint4*>(static_cast<const T*>(c.out.data) + row_offset(c.out, b, i, h) + 8 * part);
    const T* a = reinterpret_cast<const T*>(&x);
    const T* o = reinterpret_cast<const T*>(&y);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc = fmaf(to_float(a[e]), to_float(o[e]), acc);
  }
#pragma unroll
  for (int m = 1; m < kParts; m <<= 1) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, m);
  if (valid && part == 0) {
    const float lse = c.lse[p.lse_at(b, h, i)];
    *stash_of(c, b, i, h) = make_float2(lse == -INFINITY ? INFINITY : lse * kLog2e, acc);
  }
}

#ifdef FLASHTQ_WGMMA
// Registers per thread once the producer gives its own back (see dense_wgmma.cu).
constexpr int kProducerRegisters = 24, kConsumerRegisters = 240;

// The two gradients one score contributes: P with dropout applied (dV's weight) and dS / scale (the
// kernels multiply dK and dQ by the softmax scale once, when they store them). `lse2` is the row's LSE in log2 units
// (+inf for a row that sees nothing, so P = 0); `checked` asks for the per-element visibility test (tiles not fully
// visible). (Not inlining it, to spare the instruction cache, was slower: the call saves every accumulator.)
struct ScoreGrads {
  float p_kept, ds;
};
__device__ __forceinline__ ScoreGrads score_grads(const DenseProblem& p, float s, float dp, float lse2, float delta,
                                                  std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j,
                                                  bool checked, float scale_log2, float keep_scale) {
  if (checked && (i >= p.Sq || !core::key_visible(p, i, j))) return {0.0f, 0.0f};
  float x = s * scale_log2, slope = 1.0f;
  if (p.softcap > 0.0f || p.mask != nullptr) {
    // The score in natural units; docs/spec.md §1.8: dS reaches <q, k> through the cap's slope.
    const core::CappedScore<float> capped = core::capped_with_slope(p.softcap, s * p.scale);
    float v = capped.s;
    slope = capped.slope;
    if (p.mask != nullptr) {
      const float mask =
          p.mask[b * p.mask_strides[0] + h * p.mask_strides[1] + i * p.mask_strides[2] + j * p.mask_strides[3]];
      v += mask;
      if (mask == -INFINITY || v <= -1e30f) return {0.0f, 0.0f};  // a -inf entry whatever the key holds
    }
    x = v * kLog2e;
  }
  const float pr = fminf(exp2_approx(x - lse2), 1.0f);  // a probability (docs/spec.md §3)
  float z = 1.0f;
  if (p.dropout_p > 0.0f) {
    z = core::dropout_keep(p.dropout_p, p.seed, p.dropout_bh(b, h), std::uint32_t(i), std::uint32_t(j)) ? keep_scale
                                                                                                        : 0.0f;
  }
  return {pr * z, pr * (dp * z - delta) * slope};
}

#endif  // FLASHTQ_WGMMA

// ---- dK, dV -------------------------------------------------------------------------------------
constexpr int kKvRows = tiles::kWgmmaBackwardKeyRows, kQueryTile = 64;  // keys per block; query rows per tile

template <int D>
constexpr unsigned dkdv_shared_bytes() {
  return 2 * wgmma::swizzled_tile_bytes<D>(kKvRows) +
         kStages * 2 * wgmma::swizzled_tile_bytes<D>(kQueryTile)  // K, V; (Q, dO) stages
         + kStages * kQueryTile * 8                               // (lse2, delta) per stage
         + 8 * (1 + 2 * kStages) + wgmma::kSwizzleAtomBytes;      // barriers; alignment
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads, 1) dkdv_wgmma_kernel(BackwardCall c, const __grid_constant__ Maps maps) {
#ifdef FLASHTQ_WGMMA
  constexpr int kBlocks = D / 64, NT = kQueryTile / 8, DT = D / 8;
  constexpr unsigned kKvBytes = wgmma::swizzled_tile_bytes<D>(kKvRows),
                     kQBytes = wgmma::swizzled_tile_bytes<D>(kQueryTile);
  const DenseProblem& p = c.p;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const unsigned k_tile = wgmma::swizzle_aligned(smem_raw), v_tile = k_tile + kKvBytes;
  const unsigned stages = v_tile + kKvBytes;              // stage s: Q, dO at stages + (2 s + {0, 1}) kQBytes
  const unsigned stats = stages + kStages * 2 * kQBytes;  // float2 (lse2, delta)[stage][row]
  const unsigned kv_full = stats + kStages * kQueryTile * 8, full = kv_full + 8, empty = full + 8 * kStages;
  const int tid = threadIdx.x, group = tid / 128;
  const std::int64_t bh = blockIdx.y, b = bh / p.Hkv, hk = bh % p.Hkv, G = p.group();
  const std::int64_t j0 = std::int64_t(blockIdx.x) * kKvRows;
  const core::KeyRange rows = core::row_range(p, j0, min(j0 + kKvRows, p.Sk));
  const std::int64_t first = rows.begin / kQueryTile * kQueryTile;
  const int per_head = rows.begin < rows.end ? int((rows.end - first + kQueryTile - 1) / kQueryTile) : 0;
  const int tiles = per_head * int(G);
  auto tile_row = [&](int t) { return first + std::int64_t(t % per_head) * kQueryTile; };
  auto tile_head = [&](int t) { return hk * G + t / per_head; };
  // "full": the producer warp's 32 lanes (stats stored), lane 0 also with the copies' bytes.
  if (tid == 0) tma::init_ring(kv_full, full, empty, kStages, 32, 128 * kGroups);
  __syncthreads();

  if (group == kGroups) {  // producer: one warp; lane 0 issues the copies, every lane stashes stats
    wgmma::shrink_registers<kProducerRegisters>();
    if (tid >= 128 * kGroups + 32 || tiles == 0) return;
    const int lane = tid % 32;
    if (lane == 0) {
      tma::arrive_expect_bytes(kv_full, 2 * kKvBytes);
      for (int cb = 0; cb < kBlocks; ++cb) {
        tma::load_4d(k_tile + cb * (kKvBytes / kBlocks), maps.k, kv_full, 64 * cb, int(hk), int(j0), int(b));
        tma::load_4d(v_tile + cb * (kKvBytes / kBlocks), maps.v, kv_full, 64 * cb, int(hk), int(j0), int(b));
      }
    }
    for (int t = 0; t < tiles; ++t) {
      const int s = t % kStages;
      if (t >= kStages) tma::wait(empty + 8 * s, unsigned(t / kStages - 1) & 1u);
      const std::int64_t i0 = tile_row(t), h = tile_head(t);
      for (int r = lane; r < kQueryTile; r += 32) {
        const float2 st = i0 + r < p.Sq ? *stash_of(c, b, i0 + r, h) : make_float2(INFINITY, 0.0f);
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(stats + unsigned(s * kQueryTile + r) * 8), "f"(st.x),
                     "f"(st.y)
                     : "memory");
      }
      if (lane != 0) {
        tma::arrive(full + 8 * s);
        continue;
      }
      tma::arrive_expect_bytes(full + 8 * s, 2 * kQBytes);
      const unsigned dst = stages + 2 * s * kQBytes;
      for (int cb = 0; cb < kBlocks; ++cb) {
        const unsigned off = cb * (kQBytes / kBlocks);
        tma::load_4d(dst + off, maps.q, full + 8 * s, 64 * cb, int(h), int(i0), int(b));
        tma::load_4d(dst + kQBytes + off, maps.dout, full + 8 * s, 64 * cb, int(h), int(i0), int(b));
      }
    }
    return;
  }

  wgmma::grow_registers<kConsumerRegisters>();
  const int warp = (tid / 32) % 4, lane = tid % 32, g = lane / 4, tig = lane % 4;
  const float scale_log2 = p.scale * kLog2e, keep_scale = p.dropout_p > 0.0f ? 1.0f / (1.0f - p.dropout_p) : 1.0f;
  // This thread's accumulator rows are keys j0 + 64 group + 16 warp + g (+ 8); columns query rows.
  const std::int64_t key0 = j0 + kGroupRows * group + 16 * warp + g;
  float dk[DT * 4] = {}, dv[DT * 4] = {};
  // K and V rows of this warpgroup as A operands (K-major): k-step kk at column block kk / 4.
  const std::uint64_t k_desc = wgmma::k_major(k_tile, group * kGroupRows);
  const std::uint64_t v_desc = wgmma::k_major(v_tile, group * kGroupRows);
  // Turns on the tensor cores: warpgroup q waits on named barrier 1 + q, then lets the other go.
  auto my_turn = [&] { tma::named_sync(1 + group, 128 * kGroups); };
  auto their_turn = [&] { tma::named_arrive(2 - group, 128 * kGroups); };
  auto q_tile_of = [&](int t) { return stages + 2 * unsigned(t % kStages) * kQBytes; };  // then dO
  float st[NT * 4], dpt[NT * 4];
  std::uint32_t pa[kQueryTile / 16][4], da[kQueryTile / 16][4];
  // S^T = K Q^T and dP^T = V dO^T of tile t (64 keys x 64 rows each), issued.
  auto issue_scores = [&](int t) {
    const std::uint64_t q_desc = wgmma::k_major(q_tile_of(t), 0);
    const std::uint64_t do_desc = wgmma::k_major(q_tile_of(t) + kQBytes, 0);
    wgmma::mma_ss_rows<T, kQueryTile, D>(st, k_desc, kKvBytes / kBlocks, q_desc, kQBytes / kBlocks);
    wgmma::mma_ss_rows<T, kQueryTile, D>(dpt, v_desc, kKvBytes / kBlocks, do_desc, kQBytes / kBlocks);
  };
  // dV += P^T dO and dK += dS^T Q of tile t (dO and Q N-major: k-step kk is 16 rows further), issued.
  auto issue_gradients = [&](int t) {
    const std::uint64_t q_n = wgmma::n_major(q_tile_of(t), kQBytes / kBlocks);
    const std::uint64_t do_n = wgmma::n_major(q_tile_of(t) + kQBytes, kQBytes / kBlocks);
    wgmma::mma_rs_rows<T, D, kQueryTile>(dv, pa, do_n);
    wgmma::mma_rs_rows<T, D, kQueryTile>(dk, da, q_n);
  };
  // P^T (with dropout) and dS^T of tile t, packed as A fragments (16 query rows per k-step).
  auto elementwise = [&](int t) {
    const std::int64_t i0 = tile_row(t), h = tile_head(t);
    const unsigned tile_stats = stats + unsigned((t % kStages) * kQueryTile) * 8;
    const bool checked = !(i0 + kQueryTile <= p.Sq && j0 + kKvRows <= p.Sk &&
                           core::tile_fully_visible(p, i0, i0 + kQueryTile, j0, j0 + kKvRows));
    // The common case, one exp2 per score.
    const bool plain = !checked && p.mask == nullptr && p.dropout_p == 0.0f && p.softcap == 0.0f;
    // (lse2, delta) of this thread's two columns of n-tile nt: rows 8 nt + 2 tig and + 1.
    auto column_stats = [&](int nt) {
      float4 st4;
      asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                   : "=f"(st4.x), "=f"(st4.y), "=f"(st4.z), "=f"(st4.w)
                   : "r"(tile_stats + unsigned(nt * 8 + 2 * tig) * 8));
      return st4;
    };
    // Accumulator (nt, pair) holds A fragment register (nt % 2) * 2 + pair of k-step nt / 2; pair 0 is
    // row g, pair 1 row g + 8. Two loops, so that the common one stays short and branch-free.
    if (plain) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const float4 cs = column_stats(nt);
#pragma unroll
        for (int pair = 0; pair < 2; ++pair) {
          const int x = 4 * nt + 2 * pair;
          const float p0 = fminf(exp2_approx(st[x] * scale_log2 - cs.x), 1.0f),
                      p1 = fminf(exp2_approx(st[x + 1] * scale_log2 - cs.z), 1.0f);
          pa[nt / 2][(nt % 2) * 2 + pair] = pack2<T>(p0, p1);
          da[nt / 2][(nt % 2) * 2 + pair] = pack2<T>(p0 * (dpt[x] - cs.y), p1 * (dpt[x + 1] - cs.w));
        }
      }
      return;
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const float4 cs = column_stats(nt);
#pragma unroll
      for (int pair = 0; pair < 2; ++pair) {
        const int x = 4 * nt + 2 * pair;
        const std::int64_t i = i0 + nt * 8 + 2 * tig, j = key0 + 8 * pair;
        const ScoreGrads g0 = score_grads(p, st[x], dpt[x], cs.x, cs.y, b, h, i, j, checked, scale_log2, keep_scale);
        const ScoreGrads g1 =
            score_grads(p, st[x + 1], dpt[x + 1], cs.z, cs.w, b, h, i + 1, j, checked, scale_log2, keep_scale);
        pa[nt / 2][(nt % 2) * 2 + pair] = pack2<T>(g0.p_kept, g1.p_kept);
        da[nt / 2][(nt % 2) * 2 + pair] = pack2<T>(g0.ds, g1.ds);
      }
    }
  };
  if (tiles > 0) {
    // Two turns on the tensor cores per tile, scores then gradients. (One turn holding the gradients
    // of tile t with the scores of tile t + 1, as dQ does, needs more than 240 registers here: ptxas
    // then serialises the products.)
    if (group == 1) their_turn();  // warpgroup 0 goes first
    tma::wait(kv_full, 0);
    for (int t = 0; t < tiles; ++t) {
      tma::wait(full + 8 * (t % kStages), unsigned(t / kStages) & 1u);
      my_turn();
      wgmma::fence();
      issue_scores(t);
      wgmma::commit();
      their_turn();
      wgmma::wait<0>();
      elementwise(t);
      my_turn();
      wgmma::fence();
      issue_gradients(t);
      wgmma::commit();
      if (t + 1 < tiles || group == 0) their_turn();  // balanced: warpgroup 1 gave one turn away at the start
      wgmma::wait<0>();
      tma::arrive(empty + 8 * (t % kStages));
    }
  }
  // Store: row key0 (+ 8) of dK and dV, columns 8 nt + 2 tig (+ 1).
#pragma unroll
  for (int pair = 0; pair < 2; ++pair) {
    const std::int64_t j = key0 + 8 * pair;
    if (j >= p.Sk) continue;
    T* dk_row = static_cast<T*>(c.dk.data) + row_offset(c.dk, b, j, hk);
    T* dv_row = static_cast<T*>(c.dv.data) + row_offset(c.dv, b, j, hk);
#pragma unroll
    for (int nt = 0; nt < DT; ++nt) {
      const int d0 = nt * 8 + 2 * tig;
      dk_row[d0] = from_float<T>(dk[4 * nt + 2 * pair] * p.scale);
      dk_row[d0 + 1] = from_float<T>(dk[4 * nt + 2 * pair + 1] * p.scale);
      dv_row[d0] = from_float<T>(dv[4 * nt + 2 * pair]);
      dv_row[d0 + 1] = from_float<T>(dv[4 * nt + 2 * pair + 1]);
    }
  }
#endif
}

// ---- dQ -------------------------------------------------------------------------------------------
constexpr int kQRows = tiles::kWgmmaBackwardQueryRows, kKeyTile = 64,
              kDqStages = 3;  // query rows per block; keys per tile; tiles in flight

template <int D>
constexpr unsigned dq_shared_bytes() {
  return 2 * wgmma::swizzled_tile_bytes<D>(kQRows) + kDqStages * 2 * wgmma::swizzled_tile_bytes<D>(kKeyTile) +
         8 * (1 + 2 * kDqStages) + wgmma::kSwizzleAtomBytes;
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads, 1)
    dq_wgmma_kernel(BackwardCall c, const __grid_constant__ Maps maps, unsigned* unfinished) {
#ifdef FLASHTQ_WGMMA
  constexpr int kBlocks = D / 64, NT = kKeyTile / 8, DT = D / 8;
  constexpr unsigned kRowBytes = wgmma::swizzled_tile_bytes<D>(kQRows),
                     kKeyBytes = wgmma::swizzled_tile_bytes<D>(kKeyTile);
  const DenseProblem& p = c.p;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const unsigned q_tile = wgmma::swizzle_aligned(smem_raw), dout_tile = q_tile + kRowBytes;
  const unsigned stages = dout_tile + kRowBytes;  // stage s: K, V at stages + (2 s + {0, 1}) kKeyBytes
  const unsigned q_full = stages + kDqStages * 2 * kKeyBytes, full = q_full + 8, empty = full + 8 * kDqStages;
  const int tid = threadIdx.x, group = tid / 128;
  const std::int64_t bh = blockIdx.y, b = bh / p.H, h = bh % p.H, hk = h / p.group();
  const std::int64_t i0 = std::int64_t(gridDim.x - 1 - blockIdx.x) * kQRows;  // heaviest (causal) blocks first
  const core::KeyRange range = core::key_range(p, i0, min(i0 + kQRows, p.Sq));
  const std::int64_t first = range.begin / kKeyTile * kKeyTile;
  const int tiles = first < range.end ? int((range.end - first + kKeyTile - 1) / kKeyTile) : 0;
  if (tid == 0) tma::init_ring(q_full, full, empty, kDqStages, 1, 128 * kGroups);
  __syncthreads();

  if (group == kGroups) {  // producer
    wgmma::shrink_registers<kProducerRegisters>();
    if (tid % 128 != 0 || tiles == 0) return;
    tma::arrive_expect_bytes(q_full, 2 * kRowBytes);
    for (int cb = 0; cb < kBlocks; ++cb) {
      const unsigned off = cb * (kRowBytes / kBlocks);
      tma::load_4d(q_tile + off, maps.q, q_full, 64 * cb, int(h), int(i0), int(b));
      tma::load_4d(dout_tile + off, maps.dout, q_full, 64 * cb, int(h), int(i0), int(b));
    }
    for (int t = 0; t < tiles; ++t) {
      const int s = t % kDqStages;
      if (t >= kDqStages) tma::wait(empty + 8 * s, unsigned(t / kDqStages - 1) & 1u);
      tma::arrive_expect_bytes(full + 8 * s, 2 * kKeyBytes);
      const int jt = int(first) + t * kKeyTile;
      for (int cb = 0; cb < kBlocks; ++cb) {
        const unsigned off = cb * (kKeyBytes / kBlocks);
        tma::load_4d(stages + 2 * s * kKeyBytes + off, maps.k, full + 8 * s, 64 * cb, int(hk), jt, int(b));
        tma::load_4d(stages + (2 * s + 1) * kKeyBytes + off, maps.v, full + 8 * s, 64 * cb, int(hk), jt, int(b));
      }
    }
    return;
  }

  wgmma::grow_registers<kConsumerRegisters>();
  const int warp = (tid / 32) % 4, lane = tid % 32, g = lane / 4, tig = lane % 4;
  const float scale_log2 = p.scale * kLog2e, keep_scale = p.dropout_p > 0.0f ? 1.0f / (1.0f - p.dropout_p) : 1.0f;
  const int r_local = kGroupRows * group + 16 * warp + g;  // this thread's rows: r_local and r_local + 8
  const std::int64_t row0 = i0 + r_local;
  float dq[DT * 4] = {};
  if (tiles > 0) {
    auto my_turn = [&] { tma::named_sync(1 + group, 128 * kGroups); };
    auto their_turn = [&] { tma::named_arrive(2 - group, 128 * kGroups); };
    if (group == 1) their_turn();  // warpgroup 0 goes first
    tma::wait(q_full, 0);
    // Delta and lse2 of the two rows, from their stash (the threads that read a row's stash are the
    // ones that write its dQ, at the end).
    float delta[2], lse2[2];
#pragma unroll
    for (int pair = 0; pair < 2; ++pair) {
      const float2 st = row0 + 8 * pair < p.Sq ? *stash_of(c, b, row0 + 8 * pair, h) : make_float2(INFINITY, 0.0f);
      lse2[pair] = st.x;
      delta[pair] = st.y;
    }
    const std::uint64_t q_desc = wgmma::k_major(q_tile, group * kGroupRows);
    const std::uint64_t do_desc = wgmma::k_major(dout_tile, group * kGroupRows);
    auto k_tile_of = [&](int t) { return stages + 2 * unsigned(t % kDqStages) * kKeyBytes; };  // then V
    float sc[NT * 4], dp[NT * 4];
    std::uint32_t da[kKeyTile / 16][4];
    // S = Q K^T and dP = dO V^T of key tile t (64 rows x 64 keys each), issued.
    auto issue_scores = [&](int t) {
      const std::uint64_t k_desc = wgmma::k_major(k_tile_of(t), 0);
      const std::uint64_t v_desc = wgmma::k_major(k_tile_of(t) + kKeyBytes, 0);
      wgmma::mma_ss_rows<T, kKeyTile, D>(sc, q_desc, kRowBytes / kBlocks, k_desc, kKeyBytes / kBlocks);
      wgmma::mma_ss_rows<T, kKeyTile, D>(dp, do_desc, kRowBytes / kBlocks, v_desc, kKeyBytes / kBlocks);
    };
    // dQ += dS K of key tile t (K N-major: k-step kk is 16 keys further), issued.
    auto issue_gradient = [&](int t) {
      const std::uint64_t k_n = wgmma::n_major(k_tile_of(t), kKeyBytes / kBlocks);
      wgmma::mma_rs_rows<T, D, kKeyTile>(dq, da, k_n);
    };
    // dS of key tile t, packed as A fragments (16 keys per k-step).
    auto elementwise = [&](int t) {
      const std::int64_t jt = first + std::int64_t(t) * kKeyTile;
      const bool checked = !(i0 + kQRows <= p.Sq && jt >= range.begin && jt + kKeyTile <= p.Sk &&
                             core::tile_fully_visible(p, i0, i0 + kQRows, jt, jt + kKeyTile));
      const bool plain = !checked && p.mask == nullptr && p.dropout_p == 0.0f && p.softcap == 0.0f;
      if (plain) {  // two loops, so that the common one stays short and branch-free
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
          for (int pair = 0; pair < 2; ++pair) {
            const int x = 4 * nt + 2 * pair;
            const float p0 = fminf(exp2_approx(sc[x] * scale_log2 - lse2[pair]), 1.0f),
                        p1 = fminf(exp2_approx(sc[x + 1] * scale_log2 - lse2[pair]), 1.0f);
            da[nt / 2][(nt % 2) * 2 + pair] = pack2<T>(p0 * (dp[x] - delta[pair]), p1 * (dp[x + 1] - delta[pair]));
          }
        }
        return;
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int pair = 0; pair < 2; ++pair) {
          const int x = 4 * nt + 2 * pair;
          const std::int64_t i = row0 + 8 * pair, j = jt + nt * 8 + 2 * tig;
          const float d0 =
              score_grads(p, sc[x], dp[x], lse2[pair], delta[pair], b, h, i, j, checked, scale_log2, keep_scale).ds;
          const float d1 = score_grads(p, sc[x + 1], dp[x + 1], lse2[pair], delta[pair], b, h, i, j + 1, checked,
                                       scale_log2, keep_scale)
                               .ds;
          da[nt / 2][(nt % 2) * 2 + pair] = pack2<T>(d0, d1);
        }
      }
    };
    // One turn per key tile: dQ of tile t with the scores of tile t + 1 (faster than two turns per
    // tile, at 64 keys and at 128; docs/benchmarks.md).
    tma::wait(full, 0);
    my_turn();
    wgmma::fence();
    issue_scores(0);
    wgmma::commit();
    their_turn();
    wgmma::wait<0>();
    elementwise(0);
    for (int t = 0; t + 1 < tiles; ++t) {
      tma::wait(full + 8 * ((t + 1) % kDqStages), unsigned((t + 1) / kDqStages) & 1u);
      my_turn();
      wgmma::fence();
      issue_gradient(t);
      issue_scores(t + 1);
      wgmma::commit();
      their_turn();
      wgmma::wait<0>();
      tma::arrive(empty + 8 * (t % kDqStages));
      elementwise(t + 1);
    }
    my_turn();
    wgmma::fence();
    issue_gradient(tiles - 1);
    wgmma::commit();
    if (group == 0) their_turn();  // balanced: warpgroup 1 gave one turn away at the start
    wgmma::wait<0>();
  }
  bool bad = false;  // dQ = dS K meets the NaN of a key the row does not see through dS = 0
#pragma unroll
  for (int pair = 0; pair < 2; ++pair) {
    const std::int64_t i = row0 + 8 * pair;
    if (i >= p.Sq) continue;
    T* row = static_cast<T*>(c.dq.data) + row_offset(c.dq, b, i, h);
#pragma unroll
    for (int nt = 0; nt < DT; ++nt) {
      const float x0 = dq[4 * nt + 2 * pair] * p.scale, x1 = dq[4 * nt + 2 * pair + 1] * p.scale;
      bad |= !isfinite(x0) || !isfinite(x1);
      row[nt * 8 + 2 * tig] = from_float<T>(x0);
      row[nt * 8 + 2 * tig + 1] = from_float<T>(x1);
    }
  }
  raise_unfinished(unfinished, bad);
#endif
}

template <typename T, int D>
void launch_dim(const BackwardCall& c, const Maps& kv_maps, const Maps& q_maps, cudaStream_t stream) {
  constexpr int dkdv_smem = int(dkdv_shared_bytes<D>()), dq_smem = int(dq_shared_bytes<D>());
  allow_shared_bytes<dkdv_wgmma_kernel<T, D>>(dkdv_smem);
  allow_shared_bytes<dq_wgmma_kernel<T, D>>(dq_smem);
  const std::int64_t stash_threads = c.p.B * c.p.H * c.p.Sq * (D / 8);
  stash_row_stats_kernel<T, D><<<unsigned((stash_threads + 255) / 256), 256, 0, stream>>>(c);
  FLASHTQ_CUDA_CHECK_LAUNCH("dense backward row statistics");
  const dim3 kv_grid(unsigned((c.p.Sk + kKvRows - 1) / kKvRows), unsigned(c.p.B * c.p.Hkv));
  dkdv_wgmma_kernel<T, D><<<kv_grid, kThreads, dkdv_smem, stream>>>(c, kv_maps);
  FLASHTQ_CUDA_CHECK_LAUNCH("dense backward dK dV (wgmma)");
  const dim3 q_grid(unsigned((c.p.Sq + kQRows - 1) / kQRows), unsigned(c.p.B * c.p.H));
  dq_wgmma_kernel<T, D><<<q_grid, kThreads, dq_smem, stream>>>(c, q_maps, unfinished_rows_flag());
  FLASHTQ_CUDA_CHECK_LAUNCH("dense backward dQ (wgmma)");
}

std::optional<Maps> maps_for(const BackwardCall& c, unsigned query_rows, unsigned key_rows) {
  const auto q = row_tile_map(c.q, query_rows), dout = row_tile_map(c.dout, query_rows);
  const auto k = row_tile_map(c.k, key_rows), v = row_tile_map(c.v, key_rows);
  if (!q || !k || !v || !dout) return std::nullopt;
  return Maps{*q, *k, *v, *dout};
}

}  // namespace

void launch_dense_backward_wgmma(const BackwardCall& c) {
  const auto kv_maps = maps_for(c, kQueryTile, kKvRows), q_maps = maps_for(c, kQRows, kKeyTile);
  if (!kv_maps || !q_maps)
    throw Error("backend", "cuda: no TMA map for views choose_dense_backward gave the wgmma kernels");
  auto stream = static_cast<cudaStream_t>(c.stream);
  const bool half = c.p.dtype == DType::f16;
  if (c.p.D == 64) {
    half ? launch_dim<__half, 64>(c, *kv_maps, *q_maps, stream)
         : launch_dim<__nv_bfloat16, 64>(c, *kv_maps, *q_maps, stream);
  } else {
    half ? launch_dim<__half, 128>(c, *kv_maps, *q_maps, stream)
         : launch_dim<__nv_bfloat16, 128>(c, *kv_maps, *q_maps, stream);
  }
}

}  // namespace flashtq::cuda

// Dense decode (DenseForwardKernel::decode): a few query rows per kv head against many keys, f16/bf16, head_dim
// 64/128/256. A decode step reads each key once and does little arithmetic on it, so the kernel is built to keep
// the memory system busy: the keys are split across blocks (split-K) so that one sequence fills the GPU, each warp
// streams its own 16-key tiles through shared memory with cp.async (two stages), and the parts are merged by
// their log-sum-exp in a second kernel (or written directly when there is one split).
//
// Per warp and tile, with the query columns n = i * group + g (row i, head g of the kv head's group) as the mma's
// N dimension (8 or 16 of them):
//   S^T [16 keys x columns] = K [16 keys x D] . Q^T [D x columns]       K by ldmatrix, Q^T fixed B fragments
//   O^T [D x columns]      += V^T [D x 16 keys] . P^T [16 keys x columns]  V^T by ldmatrix.trans, P^T by movmatrix
// A lane holds keys r, r + 8 of columns 2 c, 2 c + 1 of each n-tile, so a column's statistics meet over the 8
// lanes of equal c, and its O^T accumulators are the same columns (a rescale needs no shuffle). Scores are scaled
// in f32 after the product; the softmax runs on exp2. Keys a column does not see get weight 0, and rows outside
// the visible range are zero-filled in shared memory, so nothing a row does not see reaches its sums.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "core/visibility.hpp"
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/dense_softmax.cuh"
#include "cuda/kernels.hpp"
#include "cuda/launch.hpp"
#include "cuda/mma.cuh"
#include "cuda/page_window.cuh"

namespace flashtq::cuda {
namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kTile = 16;  // keys per warp tile
#ifndef FLASHTQ_DECODE_STAGES
#define FLASHTQ_DECODE_STAGES 3
#endif
constexpr int kStages = FLASHTQ_DECODE_STAGES;  // tiles a warp has in shared memory: kStages - 1 in flight
constexpr int kSplitMultiple = 4 * kTile;       // a split's keys: a multiple of its warps' tiles
constexpr int kMaxSplits = 2048;                // the merge holds a factor per split in shared memory

template <int D, int NT>
struct Shape {
  static constexpr int kColumns = 8 * NT;
  static constexpr int kRowBytes = 2 * D + 16;  // padded by 16 bytes: an ldmatrix's 8 rows in distinct banks
  static constexpr int kTileBytes = kTile * kRowBytes;
  static constexpr int kStageBytes = 2 * kTileBytes;  // K, then V
  static constexpr int kWarpBytes = kStages * kStageBytes;
  static constexpr int kCombineBytes = kWarps * kColumns * (D + 2) * 4;
  static constexpr int kBytes = kWarps * kWarpBytes > kCombineBytes ? kWarps* kWarpBytes : kCombineBytes;
  // Blocks an SM holds by shared memory (227 KB, 1 KB reserved per block): what the registers are bounded for.
  static constexpr int kBlocksPerSm = 227 * 1024 / (kBytes + 1024) < 1 ? 1 : 227 * 1024 / (kBytes + 1024);
};

// A split's partial of one query row and head: its maximum (log2 units), its sum of weights, two unused floats,
// then O unnormalised (on 16 bytes: the merge reads it as float4).
constexpr int kPartialHeader = 4;
__host__ __device__ constexpr int partial_floats(int D) { return D + kPartialHeader; }

struct DecodeArgs {
  DenseProblem p;
  TensorView q, k, v, out;
  float* lse;
  float* partials;  // [B, H, Sq][splits][partial_floats(D)], with splits > 1
  int splits, split_keys;
  unsigned* unfinished;
  PagedTable table;  // page_table null: k and v are [B, Sk, Hkv, D]
};

// Sequence b's problem: with pages its own length (clamped: a device table is the caller's word) and causal offset.
__device__ __forceinline__ DenseProblem sequence_problem(const DecodeArgs& a, std::int64_t b) {
  DenseProblem p = a.p;
  if (a.table.page_table != nullptr) {
    const std::int64_t n = a.table.seq_lens_k[b];
    p.Sk = n < 0 ? 0 : n > a.p.Sk ? a.p.Sk : n;
    if (a.table.offset_from_end) p.causal_offset = p.Sk - p.Sq;
  }
  return p;
}

// Row (i, h)'s end: O / l to out and the LSE, from its maximum M (log2 units), sum L and unnormalised O (x(d)),
// as end_of_row (dense_softmax.cuh) says, with sequence b's own keys. Returns whether the row is for the repair.
template <typename T, typename X>
__device__ __forceinline__ bool finish_row(const DecodeArgs& a, std::int64_t b, std::int64_t i, std::int64_t h, float M,
                                           float L, int d0, int d_step, X x) {
  const DenseProblem& p = a.p;
  const RowEnd end = end_of_row(sequence_problem(a, b), h, i, M, L);
  const float inv = end.inv;
  bool bad = end.unfinished;
  T* out = static_cast<T*>(a.out.data) + row_offset(a.out, b, i, h);
  for (int d = d0; d < p.D; d += d_step) {
    const float y = x(d) * inv;
    bad |= !isfinite(y);
    out[d] = from_float<T>(y);
  }
  if (a.lse != nullptr && d0 == 0) a.lse[p.lse_at(b, h, i)] = end.lse;
  return bad;
}

template <typename T, int D, int NT>
__global__ void __launch_bounds__(kThreads, Shape<D, NT>::kBlocksPerSm < 4 ? Shape<D, NT>::kBlocksPerSm : 4)
    decode_kernel(const DecodeArgs a) {
  using S = Shape<D, NT>;
  constexpr int kColumns = S::kColumns, KS = D / 16;
  extern __shared__ __align__(16) unsigned char smem[];
  // The merge's blocks may take their places now: they wait for this grid, and fit beside its blocks (an SM holds
  // two of these by shared memory).
  allow_next_grid();
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, r = lane / 4, c = lane % 4;
  const std::int64_t b = blockIdx.z, hk = blockIdx.y, G = a.p.group(), columns = a.p.Sq * G;
  const int split = blockIdx.x;
  const PagedTable& pt = a.table;
  const bool paged = pt.page_table != nullptr;
  const DenseProblem p = sequence_problem(a, b);

  // The keys any row of the block sees, this split's share, and this warp's (multiples of 16: no tile straddles).
  const core::KeyRange range = core::key_range(p, 0, p.Sq);
  const int warp_keys = a.split_keys / kWarps;
  const std::int64_t own_begin = std::int64_t(split) * a.split_keys + warp * warp_keys, own_end = own_begin + warp_keys;
  const int w_begin = int(own_begin > range.begin / kTile * kTile ? own_begin : range.begin / kTile * kTile);
  const int w_end = int(own_end < range.end ? own_end : range.end);

  // Q^T's B fragments: column n = 8 nt + r, dims 16 ks + 2 c + {0, 1} and + 8; columns past Sq * G are 0.
  std::uint32_t qb[NT][KS][2];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int n = 8 * nt + r;
    const T* q = n < columns ? static_cast<const T*>(a.q.data) + row_offset(a.q, b, n / G, hk * G + n % G) : nullptr;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
      for (int x = 0; x < 2; ++x)
        qb[nt][ks][x] = q ? *reinterpret_cast<const std::uint32_t*>(q + 16 * ks + 8 * x + 2 * c) : 0u;
  }

  // Staging: lane takes 16-byte chunks lane + 32 k of a tile's rows (D / 8 chunks a row): row lane / CPR + k RPS.
  constexpr int kChunksPerRow = D / 8, kRowsPerPass = 32 / kChunksPerRow, kPasses = kTile / kRowsPerPass;
  const int lane_row = lane / kChunksPerRow, lane_chunk = lane % kChunksPerRow;
  const unsigned stages = shared_address(smem) + unsigned(warp * S::kWarpBytes);
  const unsigned lane_dst = unsigned(lane_row * S::kRowBytes + 16 * lane_chunk);
  const T* k_head = static_cast<const T*>(a.k.data) + hk * a.k.strides[2] + 8 * lane_chunk;
  const T* v_head = static_cast<const T*>(a.v.data) + hk * a.v.strides[2] + 8 * lane_chunk;
  const std::int64_t k_row = a.k.strides[1], v_row = a.v.strides[1];
  // A tile's page (a tile lies in one page: pages hold at least 16 keys), clamped into the pages; the warp reads
  // the entries of its keys (those before w_end) 32 at a time, a window ahead.
  WarpPageWindow page_of;
  if (paged) {
    page_of.row = pt.page_table + b * pt.max_pages;
    page_of.readable = std::min<std::int64_t>(pt.max_pages, (std::int64_t(w_end) + pt.page_size - 1) / pt.page_size);
    page_of.pages = pt.num_pages;
  }
  // Rows before the visible range or past it are zero-filled: they get weight 0 and must not bring a NaN along.
  const int fill_begin = int(range.begin), fill_end = w_end;
  auto fill = [&](int j0, int stage) {
    const unsigned st = stages + unsigned(stage * S::kStageBytes) + lane_dst;
    // Element offsets of key j0 (readable: j0 < Sk) in its batch or page; the tile's rows a row stride apart.
    std::int64_t k_tile, v_tile;
    if (paged) {
      const std::int64_t page = page_of(j0 / pt.page_size), in_page = j0 & (pt.page_size - 1);
      k_tile = page * a.k.strides[0] + in_page * k_row;
      v_tile = page * a.v.strides[0] + in_page * v_row;
    } else {
      k_tile = b * a.k.strides[0] + std::int64_t(j0) * k_row;
      v_tile = b * a.v.strides[0] + std::int64_t(j0) * v_row;
    }
#pragma unroll
    for (int x = 0; x < kPasses; ++x) {
      const int row = lane_row + x * kRowsPerPass, j = j0 + row;
      const bool in = j >= fill_begin && j < fill_end;
      const int rs = in ? row : 0;  // a readable address even when nothing is read
      cp_async16_zfill<true>(st + unsigned(x * kRowsPerPass * S::kRowBytes), k_head + k_tile + rs * k_row, in);
      cp_async16_zfill<true>(st + unsigned(S::kTileBytes + x * kRowsPerPass * S::kRowBytes),
                             v_head + v_tile + rs * v_row, in);
    }
    cp_async_commit();
  };

  // ldmatrix addresses within a stage: K (A, keys x dims): lane l reads key l % 8 + 8 ((l / 8) % 2), dims
  // 16 ks + 8 (l / 16); V^T (A by .trans, dims x keys): key l % 8 + 8 (l / 16), dims 16 dt + 8 ((l / 8) % 2).
  const unsigned k_lane = unsigned((lane % 8 + 8 * ((lane / 8) % 2)) * S::kRowBytes + 16 * (lane / 16));
  const unsigned v_lane = unsigned(S::kTileBytes + (lane % 8 + 8 * (lane / 16)) * S::kRowBytes + 16 * ((lane / 8) % 2));

  const float scale_log2 = p.scale * kLog2e;
  float m[NT][2], l[NT][2], acc[NT][D / 16][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    m[nt][0] = m[nt][1] = -INFINITY;
    l[nt][0] = l[nt][1] = 0.0f;
#pragma unroll
    for (int dt = 0; dt < D / 16; ++dt) acc[nt][dt][0] = acc[nt][dt][1] = acc[nt][dt][2] = acc[nt][dt][3] = 0.0f;
  }

  const int first = w_begin / kTile * kTile;
#pragma unroll
  for (int x = 0; x + 1 < kStages; ++x) {  // the first kStages - 1 tiles in flight (an empty group where none)
    if (first + x * kTile < w_end) {
      fill(first + x * kTile, x);
    } else {
      cp_async_commit();
    }
  }
  int stage = 0;
  for (int j0 = first; j0 < w_end; j0 += kTile, stage = stage + 1 == kStages ? 0 : stage + 1) {
    const int ahead = j0 + (kStages - 1) * kTile;
    if (ahead < w_end) {
      fill(ahead, stage == 0 ? kStages - 1 : stage - 1);
    } else {
      cp_async_commit();  // an empty group: the wait below is always for this tile
    }
    cp_async_wait<kStages - 1>();
    __syncwarp();
    const unsigned st = stages + unsigned(stage * S::kStageBytes);

    float s[NT][4] = {};
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      std::uint32_t ka[4];
      ldmatrix_x4(ka, st + k_lane + unsigned(32 * ks));
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mma_16816<T>(s[nt], ka[0], ka[1], ka[2], ka[3], qb[nt][ks][0], qb[nt][ks][1]);
    }
    const bool interior = j0 >= range.begin && j0 + kTile <= w_end && p.softcap == 0.0f &&
                          core::tile_fully_visible(p, 0, p.Sq, j0, j0 + kTile);
    std::uint32_t pb[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (interior) {
          s[nt][e] *= scale_log2;
        } else {
          const int n = 8 * nt + 2 * c + (e & 1), j = j0 + r + 8 * (e >> 1);
          const bool seen = n < columns && j < w_end && core::key_visible(p, n / G, j);
          s[nt][e] = seen ? softcapped(p, s[nt][e] * p.scale) * kLog2e : -INFINITY;
        }
      }
      float mx[2] = {fmaxf(s[nt][0], s[nt][2]), fmaxf(s[nt][1], s[nt][3])};
#pragma unroll
      for (int o = 4; o < 32; o *= 2)
#pragma unroll
        for (int x = 0; x < 2; ++x) mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xFFFFFFFFu, mx[x], o));
      float corr[2], base[2];
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const float m_new = fmaxf(m[nt][x], mx[x]);
        corr[x] = m_new == -INFINITY ? 1.0f : exp2_approx(m[nt][x] - m_new);
        base[x] = m_new == -INFINITY ? 0.0f : m_new;  // a hidden key's weight is exp2(-inf) = 0
        m[nt][x] = m_new;
      }
      float w[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) w[e] = exp2_approx(s[nt][e] - base[e & 1]);
#pragma unroll
      for (int x = 0; x < 2; ++x) l[nt][x] = fmaf(l[nt][x], corr[x], w[x] + w[2 + x]);
      if (__any_sync(0xFFFFFFFFu, corr[0] != 1.0f || corr[1] != 1.0f)) {
#pragma unroll
        for (int dt = 0; dt < D / 16; ++dt) {
          acc[nt][dt][0] *= corr[0], acc[nt][dt][1] *= corr[1];
          acc[nt][dt][2] *= corr[0], acc[nt][dt][3] *= corr[1];
        }
      }
      // P^T's B fragment: keys r, r + 8 of columns 2 c, 2 c + 1, transposed into column r's keys 2 c, 2 c + 1.
      pb[nt][0] = movmatrix_trans(pack2<T>(w[0], w[1]));
      pb[nt][1] = movmatrix_trans(pack2<T>(w[2], w[3]));
    }
#pragma unroll
    for (int dt = 0; dt < D / 16; ++dt) {
      std::uint32_t va[4];
      ldmatrix_x4_trans(va, st + v_lane + unsigned(32 * dt));
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mma_16816<T>(acc[nt][dt], va[0], va[1], va[2], va[3], pb[nt][0], pb[nt][1]);
    }
    __syncwarp();  // every lane has read this stage before it is refilled
  }

  // ---- the warps' parts, combined ----
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int o = 4; o < 32; o *= 2)
#pragma unroll
      for (int x = 0; x < 2; ++x) l[nt][x] += __shfl_xor_sync(0xFFFFFFFFu, l[nt][x], o);
  __syncthreads();                                   // the stages are free
  float* const cm = reinterpret_cast<float*>(smem);  // [kWarps][kColumns] maxima (log2 units)
  float* const cl = cm + kWarps * kColumns;          // sums
  float* const co = cl + kWarps * kColumns;          // [kWarps][kColumns][D]
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int n = 8 * nt + 2 * c;
    if (r == 0) {
      cm[warp * kColumns + n] = m[nt][0], cm[warp * kColumns + n + 1] = m[nt][1];
      cl[warp * kColumns + n] = l[nt][0], cl[warp * kColumns + n + 1] = l[nt][1];
    }
#pragma unroll
    for (int dt = 0; dt < D / 16; ++dt) {
      float* even = co + (warp * kColumns + n) * D + 16 * dt + r;
      even[0] = acc[nt][dt][0], even[D] = acc[nt][dt][1], even[8] = acc[nt][dt][2], even[D + 8] = acc[nt][dt][3];
    }
  }
  __syncthreads();
  bool bad = false;
  // A warp per column: its maximum and sum over the warps, then O's dims a lane at a time.
  for (int n = warp; n < columns; n += kWarps) {
    float M = -INFINITY;
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, cm[w * kColumns + n]);
    float L = 0.0f, f[kWarps];
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float lw = cl[w * kColumns + n];
      f[w] = lw == 0.0f ? 0.0f : exp2_approx(cm[w * kColumns + n] - M);
      L = fmaf(lw, f[w], L);
    }
    auto x = [&](int d) {
      float y = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) y = f[w] == 0.0f ? y : fmaf(co[(w * kColumns + n) * D + d], f[w], y);
      return y;
    };
    const std::int64_t i = n / G, h = hk * G + n % G;
    if (a.splits == 1) {
      bad |= finish_row<T>(a, b, i, h, M, L, lane, 32, x);
    } else {
      float* part = a.partials + (((b * p.H + h) * p.Sq + i) * a.splits + split) * partial_floats(D);
      if (lane == 0) part[0] = M, part[1] = L;
      for (int d = lane; d < D; d += 32) part[kPartialHeader + d] = x(d);
    }
  }
  raise_unfinished(a.unfinished, bad);
}

// The splits of each row (i, h), merged by their maxima: a block per row. A merge is a chain of dependent loads
// from L2 (at B = 1 it was a sixth of the step), so each thread loads its first kAhead splits' parts of four dims
// before the statistics are reduced, threads over the splits find the maximum and the factors 2^(m_s - M) (kept in
// shared memory), and groups of threads sum disjoint sets of splits, added in shared memory at the end.
constexpr int kMergeThreads = 256, kMergeAhead = 8;

template <int kBlockWarps>
__device__ __forceinline__ float block_reduce(float x, float* scratch, bool max) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  x = max ? warp_max(x) : warp_sum(x);
  __syncthreads();  // scratch is free
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  float y = scratch[0];
  for (int w = 1; w < kBlockWarps; ++w) y = max ? fmaxf(y, scratch[w]) : y + scratch[w];
  return y;
}

template <typename T, int D>
__global__ void __launch_bounds__(kMergeThreads) merge_kernel(const DecodeArgs a) {
  constexpr int kQuads = D / 4, kGroups = kMergeThreads / kQuads, F = partial_floats(D);
  const DenseProblem& p = a.p;
  __shared__ float factor[kMaxSplits];
  __shared__ float scratch[kMergeThreads / 32];
  __shared__ float4 sums[kGroups][kQuads];
  allow_next_grid();         // the repair check's blocks may take their places (dense_repair.cu)
  wait_for_previous_grid();  // launched while the decode kernel drains: its partials are complete after this
  const int tid = threadIdx.x, quad = tid % kQuads, group = tid / kQuads;
  const std::int64_t row = blockIdx.x, i = row % p.Sq, h = row / p.Sq % p.H, b = row / p.Sq / p.H;
  const float* parts = a.partials + row * a.splits * F;
  // Group g sums splits g, g + kGroups, ...: the first kMergeAhead of them in flight now.
  float4 ahead[kMergeAhead];
#pragma unroll
  for (int k = 0; k < kMergeAhead; ++k) {
    const int s = group + k * kGroups;
    ahead[k] = s < a.splits ? *reinterpret_cast<const float4*>(parts + s * F + kPartialHeader + 4 * quad)
                            : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  float m = -INFINITY;
  for (int s = tid; s < a.splits; s += kMergeThreads) m = fmaxf(m, parts[s * F]);
  const float M = block_reduce<kMergeThreads / 32>(m, scratch, true);
  float l = 0.0f;
  for (int s = tid; s < a.splits; s += kMergeThreads) {
    const float ls = parts[s * F + 1];
    const float f = ls == 0.0f ? 0.0f : exp2_approx(parts[s * F] - M);
    l = fmaf(ls, f, l);
    factor[s] = f;
  }
  const float L = block_reduce<kMergeThreads / 32>(l, scratch, false);  // its barriers also publish `factor`
  // A split without keys has a finite part of 0 and a factor of 0.
  float4 y = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  auto add = [&](const float4& o, float f) {
    y.x = fmaf(o.x, f, y.x), y.y = fmaf(o.y, f, y.y), y.z = fmaf(o.z, f, y.z), y.w = fmaf(o.w, f, y.w);
  };
#pragma unroll
  for (int k = 0; k < kMergeAhead; ++k) {
    const int s = group + k * kGroups;
    if (s < a.splits) add(ahead[k], factor[s]);
  }
#pragma unroll 4
  for (int s = group + kMergeAhead * kGroups; s < a.splits; s += kGroups)
    add(*reinterpret_cast<const float4*>(parts + s * F + kPartialHeader + 4 * quad), factor[s]);
  sums[group][quad] = y;
  __syncthreads();
  auto x = [&](int d) {
    float z = 0.0f;
#pragma unroll
    for (int g = 0; g < kGroups; ++g) z += reinterpret_cast<const float*>(&sums[g][d / 4])[d % 4];
    return z;
  };
  raise_unfinished(a.unfinished, finish_row<T>(a, b, i, h, M, L, tid, kMergeThreads, x));
}

template <typename T, int D, int NT>
int resident_blocks() {
  static const int blocks = [] {
    allow_shared_bytes<decode_kernel<T, D, NT>>(Shape<D, NT>::kBytes);
    int n = 0;
    FLASHTQ_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, decode_kernel<T, D, NT>, kThreads, Shape<D, NT>::kBytes));
    return std::max(1, n) * multiprocessors();
  }();
  return blocks;
}

// The split plan: the number of splits whose blocks finish soonest in whole waves of `resident` blocks, counting
// each block's fixed cost as kSplitMultiple keys; at most `most` splits (what the workspace holds).
struct Plan {
  int splits, split_keys;
};
Plan plan_splits(const DenseProblem& p, int resident, std::int64_t most) {
  const std::int64_t units = p.B * p.Hkv, keys = std::max<std::int64_t>(p.Sk, 1);
  const std::int64_t top =
      std::min<std::int64_t>({most, std::int64_t(kMaxSplits), (keys + kSplitMultiple - 1) / kSplitMultiple,
                              4 * (resident + units - 1) / units});
  Plan best{1, int((keys + kSplitMultiple - 1) / kSplitMultiple * kSplitMultiple)};
  double best_cost = 1e300;
  for (std::int64_t s = 1; s <= std::max<std::int64_t>(top, 1); ++s) {
    const std::int64_t split_keys = ((keys + s - 1) / s + kSplitMultiple - 1) / kSplitMultiple * kSplitMultiple;
    const std::int64_t splits = (keys + split_keys - 1) / split_keys;
    const std::int64_t waves = (units * splits + resident - 1) / resident;
    const double cost = double(waves) * double(split_keys + kSplitMultiple) + (splits > 1 ? kSplitMultiple : 0);
    if (cost < best_cost) best_cost = cost, best = {int(splits), int(split_keys)};
  }
  return best;
}

template <typename F>
void by_shape(const DenseProblem& p, F&& f) {
  const bool two = p.Sq * p.group() > 8;
  auto with = [&](auto tag) {
    using T = decltype(tag);
    switch (p.D) {
      case 64:
        two ? f(T{}, std::integral_constant<int, 64>{}, std::integral_constant<int, 2>{})
            : f(T{}, std::integral_constant<int, 64>{}, std::integral_constant<int, 1>{});
        break;
      case 128:
        two ? f(T{}, std::integral_constant<int, 128>{}, std::integral_constant<int, 2>{})
            : f(T{}, std::integral_constant<int, 128>{}, std::integral_constant<int, 1>{});
        break;
      case 256: f(T{}, std::integral_constant<int, 256>{}, std::integral_constant<int, 1>{}); break;
      default: throw Error("backend", "cuda: internal error: no decode kernel for this head_dim");
    }
  };
  if (p.dtype == DType::f16) {
    with(__half{});
  } else {
    with(__nv_bfloat16{});
  }
}

std::size_t partial_bytes(const DenseProblem& p) {
  return std::size_t(p.B * p.H * p.Sq) * std::size_t(partial_floats(int(p.D))) * sizeof(float);
}

Plan plan_for(const ForwardCall& c, std::int64_t most) {
  Plan plan{1, 0};
  by_shape(c.p, [&](auto t, auto d, auto nt) {
    plan = plan_splits(c.p, resident_blocks<decltype(t), decltype(d)::value, decltype(nt)::value>(), most);
  });
  return plan;
}

}  // namespace

std::size_t dense_decode_workspace(const ForwardCall& c) {
  const Plan plan = plan_for(c, std::int64_t(1) << 30);
  return plan.splits > 1 ? std::size_t(plan.splits) * partial_bytes(c.p) : 0;
}

void launch_dense_decode(const ForwardCall& c) {
  const DenseProblem& p = c.p;
  if (p.B * p.H * p.Sq == 0) return;
  const std::int64_t most = c.workspace ? std::int64_t(c.workspace_bytes / partial_bytes(p)) : 1;
  const Plan plan = plan_for(c, std::max<std::int64_t>(most, 1));
  DecodeArgs a{p,
               c.q,
               c.k,
               c.v,
               c.out,
               c.lse,
               static_cast<float*>(c.workspace),
               plan.splits,
               plan.split_keys,
               unfinished_rows_flag(),
               c.p.paged ? c.table : PagedTable{}};
  auto stream = static_cast<cudaStream_t>(c.stream);
  by_shape(p, [&](auto t, auto d, auto nt) {
    using T = decltype(t);
    constexpr int D = decltype(d)::value, NT = decltype(nt)::value;
    allow_shared_bytes<decode_kernel<T, D, NT>>(Shape<D, NT>::kBytes);
    const dim3 grid(unsigned(plan.splits), unsigned(p.Hkv), unsigned(p.B));
    decode_kernel<T, D, NT><<<grid, kThreads, Shape<D, NT>::kBytes, stream>>>(a);
    FLASHTQ_CUDA_CHECK_LAUNCH("dense decode");
    if (plan.splits > 1) {
      const std::int64_t rows = p.B * p.H * p.Sq;
      launch_dependent(merge_kernel<T, D>, dim3(unsigned(rows)), dim3(kMergeThreads), stream, "dense decode merge", a);
    }
  });
}

}  // namespace flashtq::cuda

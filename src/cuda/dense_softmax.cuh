// The per-tile online softmax and the final store of the tiled dense forwards (mma.sync, wgmma, TF32
// and FFMA), written once for all: a thread holds scores s[a][nt][e] and outputs o[a][dt][e] of
// 2 A rows ("atoms" a, halves e / 2), which the kernel's layout maps to rows, keys and dims; the lanes
// sharing a row are `RowLanes` consecutive lanes. The tensor-core layout (mma_layout below): lane
// (g, tig) holds rows g and g + 8 of each atom, keys 8 nt + 2 tig + {0, 1}, dims likewise.
#pragma once

#include <cstdint>

#include "core/hash3.hpp"
#include "core/softcap.hpp"
#include "core/visibility.hpp"
#include "cuda/common.cuh"
#include "cuda/unfinished_rows.cuh"
#include "flashtq/problem.hpp"

namespace flashtq::cuda {

// Where this thread's scores sit: the (b, h) of its block and functors row_of(atom, half) (the query
// row), key_of(nt, x) (the key's offset in its tile, x = e % 2) and dim_of(dt, x) (the output dim).
template <typename RowOf, typename KeyOf, typename DimOf, int RowLanes>
struct ScoreTile {
  const DenseProblem& p;
  std::int64_t b, h;
  RowOf row_of;
  KeyOf key_of;
  DimOf dim_of;
  float scale_log2;  // p.scale * log2(e): the softmax runs on exp2
  float keep_scale;  // 1 / (1 - dropout_p)
  static constexpr int kRowLanes = RowLanes;
};

template <int RowLanes, typename RowOf, typename KeyOf, typename DimOf>
__device__ __forceinline__ ScoreTile<RowOf, KeyOf, DimOf, RowLanes> score_tile(const DenseProblem& p, std::int64_t b,
                                                                               std::int64_t h, RowOf row_of,
                                                                               KeyOf key_of, DimOf dim_of) {
  return {p, b, h, row_of, key_of, dim_of, p.scale * kLog2e, p.dropout_p > 0.0f ? 1.0f / (1.0f - p.dropout_p) : 1.0f};
}

// The tensor cores' C-fragment layout (mma.sync m16n8 and wgmma m64nN alike): lane (g, tig) holds
// keys and dims 8 n + 2 tig + {0, 1}; the 4 lanes of a g share its rows.
template <typename RowOf>
__device__ __forceinline__ auto mma_layout(const DenseProblem& p, std::int64_t b, std::int64_t h, int tig,
                                           RowOf row_of) {
  auto column = [tig](int n, int x) { return n * 8 + 2 * tig + x; };
  return score_tile<4>(p, b, h, row_of, column, column);
}

// Maximum and sum over the lanes sharing a row.
template <int RowLanes>
__device__ __forceinline__ float row_max(float x) {
#pragma unroll
  for (int m = 1; m < RowLanes; m <<= 1) x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, m));
  return x;
}
template <int RowLanes>
__device__ __forceinline__ float row_sum(float x) {
#pragma unroll
  for (int m = 1; m < RowLanes; m <<= 1) x += __shfl_xor_sync(0xFFFFFFFFu, x, m);
  return x;
}

// The scaled product x = scale * <q, k> after the softcap (docs/spec.md §1.8), in f32.
__device__ __forceinline__ float softcapped(const DenseProblem& p, float x) {
  return core::capped_with_slope(p.softcap, x).s;
}

// A row's statistics once every key tile is in: maximum m (log2 units) and sum l, with head h's sink
// logit (docs/spec.md §1.9) joined to both; `weight` is what the row's O / l must still be multiplied
// by (1 without a sink). A row that sees no key (l = 0) gets m = the sink, l = 1 and weight 0: out 0,
// lse the sink's logit. Rows that are neither finished nor empty are left as they are for the repair.
struct RowTotal {
  float m, l, weight;
};
__device__ __forceinline__ RowTotal with_sink(const DenseProblem& p, std::int64_t h, float m, float l) {
  if (p.sinks == nullptr) return {m, l, 1.0f};
  const float sink = p.sinks[h] * kLog2e;
  if (sink == -INFINITY || !isfinite(l) || isnan(m)) return {m, l, 1.0f};
  if (l == 0.0f || m == -INFINITY) return {sink, 1.0f, 0.0f};
  const float top = fmaxf(m, sink), keep = exp2f(m - top);
  return {top, l * keep + exp2f(sink - top), keep};
}

// How row i of head h ends, from its maximum (log2 units) and sum over its keys: `inv`, what its unnormalised O is
// multiplied by, and its LSE. A row that saw nothing (no key, or every score at most -1e30, which counts as masked:
// docs/spec.md §3) gets 0 and the sink's logit (or -inf). A row f32 cannot finish gets NaN in both and `unfinished`,
// for repair_dense_forward: among them a row with visible keys whose maximum is still -inf, where every f32 score
// fell to -inf (a dot product past f32's range, which the double repair may find finite). `p` is the row's own
// problem (a paged sequence's length and causal offset), for the keys it sees.
struct RowEnd {
  float inv, lse;
  bool unfinished;
};
__device__ __forceinline__ RowEnd end_of_row(const DenseProblem& p, std::int64_t h, std::int64_t i, float keys_max,
                                             float keys_sum) {
  const core::KeyRange keys = core::key_range(p, i, i + 1);
  const bool fell_out = keys_max == -INFINITY && keys.begin < keys.end;
  const bool seen_nothing = !fell_out && ((keys_max == -INFINITY && keys_sum == 0.0f) ||
                                          (isfinite(keys_sum) && isfinite(keys_max) && keys_max <= -1e30f * kLog2e));
  const RowTotal total = with_sink(p, h, keys_max, seen_nothing ? 0.0f : keys_sum);
  const bool finished = !fell_out && isfinite(total.l) && total.l > 0.0f && isfinite(total.m);
  const bool empty = seen_nothing && !finished;
  if (finished) return {total.weight / total.l, total.m * kLn2 + logf(total.l), false};
  if (empty) return {0.0f, -INFINITY, false};
  return {NAN, NAN, true};
}

// Turns one tile of raw scores S (keys j0 + [0, 8 NT)) into the weights P of O += P V, in place: scale,
// visibility and mask (per element only where the tile is not `interior`), the running maxima m and
// sums l of each row (in log2 units), O's rescale when a maximum grows, exp2, dropout.
template <int A, int NT, int DT, typename Tile>
__device__ __forceinline__ void softmax_tile(const Tile& t, std::int64_t j0, bool interior, float (&s)[A][NT][4],
                                             float (&m)[A][2], float (&l)[A][2], float (&o)[A][DT][4]) {
  const DenseProblem& p = t.p;
  float tile_max[A][2];
#pragma unroll
  for (int a = 0; a < A; ++a) {
    tile_max[a][0] = tile_max[a][1] = -INFINITY;
    if (interior && p.mask == nullptr && p.softcap == 0.0f) {  // the common case: one multiply per score
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[a][nt][e] *= t.scale_log2;
          tile_max[a][e / 2] = fmaxf(tile_max[a][e / 2], s[a][nt][e]);
        }
      }
    } else {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const std::int64_t i = t.row_of(a, e / 2), j = j0 + t.key_of(nt, e & 1);
          float v = softcapped(p, s[a][nt][e] * p.scale);
          // Rows past Sq (a block's last rows) are dropped before the mask is read: "interior" speaks
          // for the block's real rows only.
          if (i >= p.Sq || (!interior && !core::key_visible(p, i, j))) v = -INFINITY;
          if (p.mask != nullptr && v != -INFINITY) {
            const float mask = p.mask[t.b * p.mask_strides[0] + t.h * p.mask_strides[1] + i * p.mask_strides[2] +
                                      j * p.mask_strides[3]];
            v = mask == -INFINITY ? -INFINITY : v + mask;  // masked whatever the key holds (NaN + -inf is NaN)
            if (v <= -1e30f) v = -INFINITY;
          }
          v *= kLog2e;
          s[a][nt][e] = v;
          tile_max[a][e / 2] = fmaxf(tile_max[a][e / 2], v);
        }
      }
    }
  }
  float corr[A][2];
  bool rescale = false;
#pragma unroll
  for (int a = 0; a < A; ++a) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m[a][r], row_max<Tile::kRowLanes>(tile_max[a][r]));
      corr[a][r] = m_new == -INFINITY ? 1.0f : exp2_approx(m[a][r] - m_new);
      m[a][r] = m_new;
      l[a][r] *= corr[a][r];
      rescale |= corr[a][r] != 1.0f;
    }
  }
  if (__any_sync(0xFFFFFFFFu, rescale)) {
#pragma unroll
    for (int a = 0; a < A; ++a) {
#pragma unroll
      for (int nt = 0; nt < DT; ++nt) {
        o[a][nt][0] *= corr[a][0], o[a][nt][1] *= corr[a][0], o[a][nt][2] *= corr[a][1], o[a][nt][3] *= corr[a][1];
      }
    }
  }
  // Two loops, so that the common one (no dropout) stays short and free of the hash's code.
  if (p.dropout_p == 0.0f) {
#pragma unroll
    for (int a = 0; a < A; ++a) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float pr = s[a][nt][e] == -INFINITY ? 0.0f : exp2_approx(s[a][nt][e] - m[a][e / 2]);
          l[a][e / 2] += pr;
          s[a][nt][e] = pr;
        }
      }
    }
    return;
  }
#pragma unroll
  for (int a = 0; a < A; ++a) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pr = s[a][nt][e] == -INFINITY ? 0.0f : exp2_approx(s[a][nt][e] - m[a][e / 2]);
        l[a][e / 2] += pr;
        const std::int64_t i = t.row_of(a, e / 2), j = j0 + t.key_of(nt, e & 1);
        const bool keep =
            core::dropout_keep(p.dropout_p, p.seed, p.dropout_bh(t.b, t.h), std::uint32_t(i), std::uint32_t(j));
        s[a][nt][e] = keep ? pr * t.keep_scale : 0.0f;
      }
    }
  }
}

// O / l to `out` (rows past Sq dropped) and, when asked, LSE = m ln 2 + ln l (-inf for a row that sees
// no key, and for one whose every score is at most -1e30, docs/spec.md §3: the tiles do not skip such
// scores, the check is here, once per row). A row the tiles cannot finish in f32, or with an element
// that is not finite, raises `unfinished` for repair_dense_forward (dense_repair.cu).
template <typename T, int A, int DT, typename Tile>
__device__ __forceinline__ void store_rows(const Tile& t, const TensorView& ov, float* lse, const float (&o)[A][DT][4],
                                           const float (&m)[A][2], const float (&l)[A][2], unsigned* unfinished) {
  bool bad = false;
  const DenseProblem& p = t.p;
#pragma unroll
  for (int a = 0; a < A; ++a) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const std::int64_t i = t.row_of(a, r);
      const float keys_sum = row_sum<Tile::kRowLanes>(l[a][r]);
      if (i >= p.Sq) continue;
      const RowEnd end = end_of_row(p, t.h, i, m[a][r], keys_sum);
      const float inv = end.inv;
      bad |= end.unfinished;
      T* out = static_cast<T*>(ov.data) + row_offset(ov, t.b, i, t.h);
#pragma unroll
      for (int nt = 0; nt < DT; ++nt) {
        const float x0 = o[a][nt][2 * r] * inv, x1 = o[a][nt][2 * r + 1] * inv;
        bad |= !isfinite(x0) || !isfinite(x1);
        out[t.dim_of(nt, 0)] = from_float<T>(x0);
        out[t.dim_of(nt, 1)] = from_float<T>(x1);
      }
      if (lse != nullptr && threadIdx.x % Tile::kRowLanes == 0) {
        lse[p.lse_at(t.b, t.h, i)] = end.lse;
      }
    }
  }
  raise_unfinished(unfinished, bad);
}

}  // namespace flashtq::cuda

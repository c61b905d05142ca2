// The per-tile online softmax and the final store of the dense tensor-core forwards (mma.sync and
// wgmma), written once for both: scores arrive as the C fragments of 16-row products, lane (g, tig)
// of a warp holding rows g and g + 8 of each of its A atoms and keys 8 nt + 2 tig + {0, 1} of n-tile nt
// (mma.sync's m16n8 fragments and wgmma's m64nN accumulators place them alike).
#pragma once

#include <cstdint>

#include "core/hash3.hpp"
#include "core/visibility.hpp"
#include "cuda/common.cuh"
#include "flashtq/problem.hpp"

namespace flashtq::cuda {

// Where this thread's scores sit: the (b, h) of its block, its lane's column pair and a functor
// row_of(atom, half) giving the query row of half 0 (row g) or 1 (row g + 8) of an atom.
template <typename RowOf>
struct ScoreTile {
  const DenseProblem& p;
  std::int64_t b, h;
  int tig;
  RowOf row_of;
  float scale_log2;  // p.scale * log2(e): the softmax runs on exp2
  float keep_scale;  // 1 / (1 - dropout_p)
};

// Turns one tile of raw scores S (keys j0 + [0, 8 NT)) into the weights P of O += P V, in place: scale,
// visibility and mask (per element only where the tile is not `interior`), the running maxima m and
// sums l of each row (in log2 units), O's rescale when a maximum grows, exp2, dropout.
template <int A, int NT, int DT, typename RowOf>
__device__ __forceinline__ void softmax_tile(const ScoreTile<RowOf>& t, std::int64_t j0, bool interior, float (&s)[A][NT][4],
                                             float (&m)[A][2], float (&l)[A][2], float (&o)[A][DT][4]) {
  const DenseProblem& p = t.p;
  float tile_max[A][2];
#pragma unroll
  for (int a = 0; a < A; ++a) {
    tile_max[a][0] = tile_max[a][1] = -INFINITY;
    if (interior && p.mask == nullptr) {  // the common case: one multiply per score
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
          const std::int64_t i = t.row_of(a, e / 2), j = j0 + nt * 8 + 2 * t.tig + (e & 1);
          float v = s[a][nt][e] * p.scale;
          if (!interior && (i >= p.Sq || !core::key_visible(p, i, j))) v = -INFINITY;
          if (p.mask != nullptr && v != -INFINITY) {
            v += p.mask[t.b * p.mask_strides[0] + t.h * p.mask_strides[1] + i * p.mask_strides[2] + j * p.mask_strides[3]];
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
      float x = fmaxf(tile_max[a][r], __shfl_xor_sync(0xFFFFFFFFu, tile_max[a][r], 1));
      x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, 2));
      const float m_new = fmaxf(m[a][r], x);
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
#pragma unroll
  for (int a = 0; a < A; ++a) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pr = s[a][nt][e] == -INFINITY ? 0.0f : exp2_approx(s[a][nt][e] - m[a][e / 2]);
        l[a][e / 2] += pr;
        float w = pr;
        if (p.dropout_p > 0.0f && pr != 0.0f) {
          const std::int64_t i = t.row_of(a, e / 2), j = j0 + nt * 8 + 2 * t.tig + (e & 1);
          w = core::dropout_keep(p.dropout_p, p.seed, std::uint32_t(t.b * p.H + t.h), std::uint32_t(i), std::uint32_t(j))
                  ? pr * t.keep_scale
                  : 0.0f;
        }
        s[a][nt][e] = w;
      }
    }
  }
}

// O / l to `out` (rows past Sq dropped) and, when asked, LSE = m ln 2 + ln l (-inf for a row that sees no key).
template <typename T, int A, int DT, typename RowOf>
__device__ __forceinline__ void store_rows(const ScoreTile<RowOf>& t, const TensorView& ov, float* lse, const float (&o)[A][DT][4],
                                           const float (&m)[A][2], const float (&l)[A][2]) {
  const DenseProblem& p = t.p;
#pragma unroll
  for (int a = 0; a < A; ++a) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = l[a][r] + __shfl_xor_sync(0xFFFFFFFFu, l[a][r], 1);
      sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 2);
      const std::int64_t i = t.row_of(a, r);
      if (i >= p.Sq) continue;
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      T* out = static_cast<T*>(ov.data) + row_offset(ov, t.b, i, t.h);
#pragma unroll
      for (int nt = 0; nt < DT; ++nt) {
        const int d0 = nt * 8 + 2 * t.tig;
        out[d0] = from_float<T>(o[a][nt][2 * r] * inv);
        out[d0 + 1] = from_float<T>(o[a][nt][2 * r + 1] * inv);
      }
      if (lse != nullptr && t.tig == 0) {
        lse[(t.b * p.H + t.h) * p.Sq + i] = sum > 0.0f ? m[a][r] * kLn2 + logf(sum) : -INFINITY;
      }
    }
  }
}

}  // namespace flashtq::cuda

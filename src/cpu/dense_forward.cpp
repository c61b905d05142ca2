// Dense forward on the CPU: tiles of up to 48 query rows x 64 keys with an online softmax. The rows
// of a tile are the query positions of a block times every query head of one GQA group, so each K/V
// tile is converted once and serves them all (decode: the group's heads form the rows). Both
// products run through the SIMD GEMM kernel; tiles that no row can see are skipped. With fewer
// tasks than threads (decode), the keys are split across tasks too and merged by their LSEs.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "core/elements.hpp"
#include "core/hash3.hpp"
#include "core/visibility.hpp"
#include "cpu/careful_rows.hpp"
#include "cpu/dense.hpp"
#include "cpu/kernels.hpp"
#include "cpu/merge.hpp"

namespace flashtq::cpu {
namespace {

constexpr std::int64_t kBq = 48, kBk = 64;
constexpr std::int64_t kDirectRows = 8;  // up to this many rows, scores are dot products on key rows
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

// Whether no element is an infinity or a NaN (exponent bits all ones), as an OR of bits that vectorises.
bool all_finite(const float* x, std::size_t n) {
  std::uint32_t special = 0;
  for (std::size_t e = 0; e < n; ++e) {
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(x[e]);
    special |= std::uint32_t((bits & 0x7f800000u) == 0x7f800000u);
  }
  return special == 0;
}

struct Buffers {
  std::vector<float> q, kt, v, s, o, m, l;
  void size(std::int64_t rows, std::int64_t Dp) {
    q.assign(std::size_t(rows * Dp), 0.0f);
    kt.assign(std::size_t(Dp * kBk), 0.0f);
    v.assign(std::size_t(kBk * Dp), 0.0f);
    s.assign(std::size_t(rows * kBk), 0.0f);
    o.assign(std::size_t(rows * Dp), 0.0f);
    m.assign(std::size_t(rows), kNegInf);
    l.assign(std::size_t(rows), 0.0f);
  }
};

// Positions per block: rows = positions x group heads stay within kBq (at least one position).
std::int64_t positions_per_block(const DenseProblem& p) { return std::max<std::int64_t>(1, kBq / p.group()); }

// K and V of one (batch, kv head) converted to f32 once, K transposed tile by tile
// ([tile][D][kBk]), V row-major ([Sk][Dp]): shared by every row block when there are many.
struct ConvertedKv {
  std::vector<float> kt, v;
  bool ready = false;
};

void convert_tile(const ForwardCall& c, std::int64_t b, std::int64_t hk, std::int64_t j0, std::int64_t n, float* kt,
                  float* v, std::vector<float>& krow) {
  const DenseProblem& p = c.p;
  const std::int64_t D = p.D, Dp = (D + 15) / 16 * 16;
  const std::size_t esize = dtype_size(p.dtype);
  for (std::int64_t j = 0; j < kBk; ++j) {
    if (j < n) {
      const char* ks = static_cast<const char*>(c.k.data) + core::offset(c.k, b, j0 + j, hk) * std::int64_t(esize);
      load_row(ks, int(p.dtype), krow.data(), std::size_t(D), 1.0f);
      for (std::int64_t d = 0; d < D; ++d) kt[d * kBk + j] = krow[std::size_t(d)];
      const char* vs = static_cast<const char*>(c.v.data) + core::offset(c.v, b, j0 + j, hk) * std::int64_t(esize);
      load_row(vs, int(p.dtype), v + j * Dp, std::size_t(D), 1.0f);
    } else {
      for (std::int64_t d = 0; d < D; ++d) kt[d * kBk + j] = 0.0f;
      for (std::int64_t d = 0; d < D; ++d) v[j * Dp + d] = 0.0f;
    }
  }
}

// One task: positions [i0, i1) of every query head of kv head hk (row r = g * (i1 - i0) + i - i0)
// against keys [k0, k1); leaves m, l and the unnormalised O in t. `pre` holds the converted K/V
// when the caller made them, else each tile is converted here.
void attend_block(const ForwardCall& c, std::int64_t b, std::int64_t hk, std::int64_t i0, std::int64_t i1,
                  std::int64_t k0, std::int64_t k1, Buffers& t, const ConvertedKv& pre) {
  const DenseProblem& p = c.p;
  const std::int64_t D = p.D, Dp = round_up(D, 16), P = i1 - i0, G = p.group(), rows = G * P;
  const int dtype = int(p.dtype);
  const std::size_t esize = dtype_size(p.dtype);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t h = hk * G + r / P, i = i0 + r % P;
    const char* src = static_cast<const char*>(c.q.data) + core::offset(c.q, b, i, h) * std::int64_t(esize);
    load_row(src, dtype, t.q.data() + r * Dp, std::size_t(D), p.scale);
  }
  const float keep_scale = p.dropout_p > 0.0f ? 1.0f / (1.0f - p.dropout_p) : 1.0f;
  std::vector<float> krow(static_cast<std::size_t>(D));
  // Shared tiles start at multiples of kBk; keys of the first tile before k0 are invisible to every
  // row (k0 comes from the visibility rules), so the per-element checks drop them.
  const std::int64_t j_start = pre.ready ? k0 / kBk * kBk : k0;
  for (std::int64_t j0 = j_start; j0 < k1; j0 += kBk) {
    const std::int64_t n = std::min(kBk, k1 - j0);
    const float* kt = t.kt.data();
    const float* v = t.v.data();
    if (pre.ready) {  // tiles start at multiples of kBk (ranges are tile-aligned below)
      kt = pre.kt.data() + (j0 / kBk) * Dp * kBk;
      v = pre.v.data() + j0 * Dp;
      gemm(t.q.data(), std::size_t(Dp), kt, kBk, t.s.data(), kBk, std::size_t(rows), kBk, std::size_t(D), false);
    } else if (rows <= kDirectRows) {
      // Few rows (decode): score key rows straight from the caller's memory, no transpose.
      const char* k_first = static_cast<const char*>(c.k.data) + core::offset(c.k, b, j0, hk) * std::int64_t(esize);
      score_rows(t.q.data(), std::size_t(Dp), std::size_t(rows), k_first, std::size_t(c.k.strides[1]) * esize, dtype,
                 std::size_t(n), std::size_t(D), t.s.data(), kBk);
      for (std::int64_t j = 0; j < kBk; ++j) {
        if (j < n) {
          const char* vs = static_cast<const char*>(c.v.data) + core::offset(c.v, b, j0 + j, hk) * std::int64_t(esize);
          if (j + 8 < n) {  // as in score_rows: rows of one head are a token apart
            const char* ahead = vs + 8 * c.v.strides[1] * std::int64_t(esize);
            for (std::int64_t off = 0; off < D * std::int64_t(esize); off += 64) __builtin_prefetch(ahead + off);
          }
          load_row(vs, dtype, t.v.data() + j * Dp, std::size_t(D), 1.0f);
        } else {
          for (std::int64_t r = 0; r < rows; ++r) t.s[std::size_t(r * kBk + j)] = 0.0f;
          std::fill(t.v.begin() + j * Dp, t.v.begin() + j * Dp + D, 0.0f);
        }
      }
    } else {
      convert_tile(c, b, hk, j0, n, t.kt.data(), t.v.data(), krow);
      gemm(t.q.data(), std::size_t(Dp), kt, kBk, t.s.data(), kBk, std::size_t(rows), kBk, std::size_t(D), false);
    }
    const bool all_visible = n == kBk && core::tile_fully_visible(p, i0, i1, j0, j0 + n);
    for (std::int64_t r = 0; r < rows; ++r) {
      float* s = t.s.data() + r * kBk;
      const std::int64_t h = hk * G + r / P, i = i0 + r % P;
      // A product or partial sum past f32's range leaves +-inf or NaN (it never comes back to a finite
      // value), and so does a non-finite key: such a row is finished in double (finish_row), marked by
      // a NaN sum, which every later tile keeps.
      if (!all_finite(s, std::size_t(n))) t.l[std::size_t(r)] = std::numeric_limits<float>::quiet_NaN();
      if (p.softcap > 0.0f) softcap(s, std::size_t(n), p.softcap);  // before the mask (docs/spec.md §1.8)
      for (std::int64_t j = 0; (!all_visible || p.mask != nullptr) && j < kBk; ++j) {  // interior tiles skip this
        if (j >= n || (!all_visible && !core::key_visible(p, i, j0 + j))) {
          s[j] = kNegInf;
          continue;
        }
        if (p.mask != nullptr) {
          s[j] += p.mask[b * p.mask_strides[0] + h * p.mask_strides[1] + i * p.mask_strides[2] +
                         (j0 + j) * p.mask_strides[3]];
          if (s[j] <= -1e30f) s[j] = kNegInf;
        }
      }
      const float tile_max = max_of(s, kBk);
      // Scores at or below -1e30 count as masked (docs/spec.md §1) with or without a mask: a tile
      // whose best is that low adds nothing (a tile with a better key weighs those by exp(-1e30)).
      if (tile_max <= -1e30f) {  // this row sees nothing in this tile
        std::fill(s, s + kBk, 0.0f);
        continue;
      }
      const float m_new = std::max(t.m[std::size_t(r)], tile_max);
      const float corr = std::exp(t.m[std::size_t(r)] - m_new);
      const float sum = exp_shift_sum(s, kBk, m_new);
      t.l[std::size_t(r)] = t.l[std::size_t(r)] * corr + sum;
      if (corr != 1.0f) scale(t.o.data() + r * Dp, std::size_t(D), corr);
      t.m[std::size_t(r)] = m_new;
      if (p.dropout_p > 0.0f) {  // the denominator above does not see dropout; the values do
        const std::uint32_t bh = std::uint32_t((p.batch0 + b) * p.H + h);
        for (std::int64_t j = 0; j < n; ++j) {
          s[j] *=
              core::dropout_keep(p.dropout_p, p.seed, bh, std::uint32_t(i), std::uint32_t(j0 + j)) ? keep_scale : 0.0f;
        }
      }
    }
    gemm(t.s.data(), kBk, v, std::size_t(Dp), t.o.data(), std::size_t(Dp), std::size_t(rows), std::size_t(D),
         std::size_t(n), true);
  }
}

}  // namespace

void dense_forward(const ForwardCall& c, int threads) {
  const DenseProblem& p = c.p;
  const std::int64_t D = p.D, Dp = round_up(D, 16), G = p.group();
  const std::int64_t P = positions_per_block(p), rows_max = G * P;
  const std::int64_t q_blocks = (p.Sq + P - 1) / P;
  const std::int64_t row_tasks = p.B * p.Hkv * q_blocks;
  // Flash-decoding: with fewer row tasks than threads, split each task's keys as well.
  const std::int64_t max_splits = std::max<std::int64_t>(1, p.Sk / (4 * kBk));
  const bool share_kv = q_blocks >= 4;  // see below
  // Decode-like shapes split the keys so every thread gets work; the kv heads of one key range are
  // consecutive tasks (a thread's static share), so a thread streams whole tokens, all heads at once,
  // rather than one head's rows at a stride of every other head.
  const std::int64_t splits =
      share_kv ? 1 : std::clamp<std::int64_t>((2 * threads + p.B * q_blocks - 1) / (p.B * q_blocks), 1, max_splits);
  const std::int64_t stride = rows_max * (Dp + 2);  // one partial: O rows, each followed by m, l
  std::vector<float> partials(splits > 1 ? std::size_t(row_tasks * splits * stride) : 0);

  // Writes row r of a finished block of `n_pos` positions (normalised output and LSE). A row that
  // f32 could not finish (a score past its range, or a non-finite value of a key the row does not
  // see, which the products above multiply by a zero weight) is recomputed in double.
  // The head's sink logit joins the row's maximum and denominator here, once every key is in (m, l).
  auto finish_row = [&](std::int64_t b, std::int64_t hk, std::int64_t i0, std::int64_t n_pos, std::int64_t r,
                        const float* o, float m, float l) {
    const std::int64_t h = hk * G + r / n_pos, i = i0 + r % n_pos;
    float o_scale = 1.0f;  // exp(m_keys - m): the keys' O was accumulated relative to their own maximum
    if (p.sinks != nullptr && p.sinks[h] != kNegInf) {
      const float sink = p.sinks[h], m_new = std::max(m, sink);
      o_scale = m == kNegInf ? 0.0f : std::exp(m - m_new);
      l = l * o_scale + std::exp(sink - m_new);
      m = m_new;
    }
    const float inv = l > 0.0f ? o_scale / l : 0.0f;
    bool finished = (m == kNegInf && l == 0.0f) || (std::isfinite(m) && std::isfinite(l) && l > 0.0f);
    for (std::int64_t d = 0; d < D && finished; ++d) finished = std::isfinite(o[d] * inv);
    if (!finished) return dense_row_in_double(c, b, h, i);
    const std::int64_t at = core::offset(c.out, b, i, h);
    for (std::int64_t d = 0; d < D; ++d) core::store(c.out.data, p.dtype, at + d, o[d] * inv);
    if (c.lse) c.lse[(b * p.H + h) * p.Sq + i] = l > 0.0f ? m + std::log(l) : kNegInf;
  };

  // Many row blocks per (batch, kv head): convert its K/V once and share them (prefill). Few (decode):
  // each task converts the tiles it reads, and the keys are split across threads instead.
  // Task order: kv head fastest, then split, then row block and batch (see `splits`).
  auto run_task = [&](std::int64_t task, Buffers& t, const ConvertedKv& pre) {
    const std::int64_t hk = task % p.Hkv, rest = task / p.Hkv, split = rest % splits, bq = rest / splits;
    const std::int64_t qb = bq % q_blocks, b = bq / q_blocks;
    const std::int64_t rt = (b * p.Hkv + hk) * q_blocks + qb;
    const std::int64_t i0 = qb * P, i1 = std::min(p.Sq, i0 + P), rows = G * (i1 - i0);
    const core::KeyRange range = core::key_range(p, i0, i1);
    // Tile-aligned key ranges, so shared K/V tiles line up.
    const std::int64_t first_tile = range.begin / kBk, tiles = (range.end + kBk - 1) / kBk - first_tile;
    const std::int64_t per_split = (std::max<std::int64_t>(tiles, 0) + splits - 1) / splits;
    const std::int64_t k0 = std::max(range.begin, (first_tile + split * per_split) * kBk);
    const std::int64_t k1 = std::min(range.end, (first_tile + (split + 1) * per_split) * kBk);
    t.size(rows, Dp);
    if (k0 < k1) attend_block(c, b, hk, i0, i1, k0, k1, t, pre);
    for (std::int64_t r = 0; r < rows; ++r) {
      if (splits == 1) {
        finish_row(b, hk, i0, i1 - i0, r, t.o.data() + r * Dp, t.m[std::size_t(r)], t.l[std::size_t(r)]);
        continue;
      }
      float* out = partials.data() + (rt * splits + split) * stride + r * (Dp + 2);
      std::copy(t.o.begin() + r * Dp, t.o.begin() + r * Dp + D, out);
      out[Dp] = t.m[std::size_t(r)];
      out[Dp + 1] = t.l[std::size_t(r)];
    }
  };
  if (share_kv) {
    const std::int64_t n_tiles = (p.Sk + kBk - 1) / kBk;
    ConvertedKv kv;
    kv.kt.resize(std::size_t(n_tiles * Dp * kBk));
    kv.v.resize(std::size_t(n_tiles * kBk * Dp));
    for (std::int64_t bhk = 0; bhk < p.B * p.Hkv; ++bhk) {
      const std::int64_t b = bhk / p.Hkv, hk = bhk % p.Hkv;
      kv.ready = false;
#pragma omp parallel num_threads(threads)
      {
        std::vector<float> krow(static_cast<std::size_t>(D));
#pragma omp for schedule(static)
        for (std::int64_t tile = 0; tile < n_tiles; ++tile) {
          convert_tile(c, b, hk, tile * kBk, std::min(kBk, p.Sk - tile * kBk), kv.kt.data() + tile * Dp * kBk,
                       kv.v.data() + tile * kBk * Dp, krow);
        }
      }
      kv.ready = true;
#pragma omp parallel num_threads(threads)
      {
        Buffers t;
#pragma omp for schedule(dynamic)
        for (std::int64_t qb = 0; qb < q_blocks; ++qb) run_task((b * q_blocks + qb) * p.Hkv + hk, t, kv);
      }
    }
  }

#pragma omp parallel num_threads(threads)
  {
    Buffers t;
    const ConvertedKv none;
    if (!share_kv) {
#pragma omp for schedule(static)
      for (std::int64_t task = 0; task < row_tasks * splits; ++task) run_task(task, t, none);
    }
    // Merge the splits of each row by their LSEs.
    if (splits > 1) {
      std::vector<float> acc(static_cast<std::size_t>(D));
#pragma omp for schedule(static)
      for (std::int64_t rt = 0; rt < row_tasks; ++rt) {
        const std::int64_t qb = rt % q_blocks, bhk = rt / q_blocks, hk = bhk % p.Hkv, b = bhk / p.Hkv;
        const std::int64_t i0 = qb * P, n_pos = std::min(p.Sq, i0 + P) - i0, rows = G * n_pos;
        for (std::int64_t r = 0; r < rows; ++r) {
          const auto [M, L] = merge_partials(
              splits, D,
              [&](std::int64_t s) {
                const float* w = partials.data() + (rt * splits + s) * stride + r * (Dp + 2);
                return Partial{w[Dp], w[Dp + 1], w};
              },
              acc.data());
          finish_row(b, hk, i0, n_pos, r, acc.data(), M, L);
        }
      }
    }
  }
}

}  // namespace flashtq::cpu

// Dense backward on the CPU, FlashAttention-2 style: for each (batch, kv head) task, key tiles in
// the outer loop accumulate dK and dV for every query head of the group; query tiles in the inner
// loop recompute P from the saved LSE and add into dQ. Tasks own disjoint outputs: deterministic.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/dense_row.hpp"
#include "core/elements.hpp"
#include "core/hash3.hpp"
#include "core/visibility.hpp"
#include "cpu/careful_rows.hpp"
#include "cpu/dense.hpp"
#include "cpu/kernels.hpp"

namespace flashtq::cpu {
namespace {

constexpr std::int64_t kBq = 48, kBk = 64;

std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

// Rows [i0, i0 + rows) of a view into a [rows x Dp] f32 buffer, times factor.
void load_rows(const TensorView& t, std::int64_t b, std::int64_t i0, std::int64_t rows, std::int64_t h, std::int64_t D,
               std::int64_t Dp, float factor, float* dst) {
  const std::size_t esize = dtype_size(t.dtype);
  for (std::int64_t r = 0; r < rows; ++r) {
    const char* src = static_cast<const char*>(t.data) + core::offset(t, b, i0 + r, h) * std::int64_t(esize);
    load_row(src, int(t.dtype), dst + r * Dp, std::size_t(D), factor);
  }
}

bool all_finite(const float* x, std::int64_t n) {
  for (std::int64_t e = 0; e < n; ++e)
    if (!std::isfinite(x[e])) return false;
  return true;
}

void transpose(const float* src, std::int64_t rows, std::int64_t cols, std::int64_t ld_src, float* dst,
               std::int64_t ld_dst) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) dst[c * ld_dst + r] = src[r * ld_src + c];
}

}  // namespace

void dense_backward(const BackwardCall& c, int threads) {
  const DenseProblem& p = c.p;
  const std::int64_t D = p.D, Dp = round_up(D, 16), G = p.group();
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const float keep_scale = p.dropout_p > 0.0f ? 1.0f / (1.0f - p.dropout_p) : 1.0f;
  // Each (batch, head)'s part of the sinks' gradient, summed over the batch in a fixed order below.
  std::vector<double> sink_parts(c.dsinks != nullptr ? std::size_t(p.B * p.H) : 0, 0.0);

#pragma omp parallel for schedule(dynamic) num_threads(threads)
  for (std::int64_t task = 0; task < p.B * p.Hkv; ++task) {
    const std::int64_t b = task / p.Hkv, hk = task % p.Hkv;
    std::vector<float> dq(std::size_t(G * p.Sq * Dp), 0.0f), delta(std::size_t(G * p.Sq), 0.0f);
    std::vector<float> k(std::size_t(kBk * Dp)), kt(std::size_t(Dp * kBk)), vt(std::size_t(Dp * kBk));
    std::vector<float> dk(std::size_t(kBk * Dp)), dv(std::size_t(kBk * Dp));
    std::vector<float> qs(std::size_t(kBq * Dp)), q(std::size_t(kBq * Dp)), dout(std::size_t(kBq * Dp)),
        o(std::size_t(kBq * Dp));
    std::vector<float> s(std::size_t(kBq * kBk)), dp(std::size_t(kBq * kBk)), st(std::size_t(kBk * kBq));
    // D_i = <dout_i, out_i> for every row of every head of the group.
    for (std::int64_t g = 0; g < G; ++g) {
      const std::int64_t h = hk * G + g;
      for (std::int64_t i0 = 0; i0 < p.Sq; i0 += kBq) {
        const std::int64_t rows = std::min(kBq, p.Sq - i0);
        load_rows(c.dout, b, i0, rows, h, D, Dp, 1.0f, dout.data());
        load_rows(c.out, b, i0, rows, h, D, Dp, 1.0f, o.data());
        for (std::int64_t r = 0; r < rows; ++r) {
          float acc = 0.0f;
          for (std::int64_t d = 0; d < D; ++d) acc += dout[std::size_t(r * Dp + d)] * o[std::size_t(r * Dp + d)];
          delta[std::size_t(g * p.Sq + i0 + r)] = acc;
          if (c.dsinks != nullptr)
            sink_parts[std::size_t(b * p.H + h)] +=
                core::sink_gradient(p, h, c.lse[(b * p.H + h) * p.Sq + i0 + r], double(acc));
        }
      }
    }
    for (std::int64_t j0 = 0; j0 < p.Sk; j0 += kBk) {
      const std::int64_t n = std::min(kBk, p.Sk - j0);
      std::fill(k.begin(), k.end(), 0.0f);
      load_rows(c.k, b, j0, n, hk, D, Dp, 1.0f, k.data());
      std::fill(dv.begin(), dv.end(), 0.0f);
      load_rows(c.v, b, j0, n, hk, D, Dp, 1.0f, dv.data());  // v rows, transposed next
      std::fill(kt.begin(), kt.end(), 0.0f);
      std::fill(vt.begin(), vt.end(), 0.0f);
      transpose(k.data(), n, D, Dp, kt.data(), kBk);
      transpose(dv.data(), n, D, Dp, vt.data(), kBk);
      std::fill(dk.begin(), dk.end(), 0.0f);
      std::fill(dv.begin(), dv.end(), 0.0f);
      for (std::int64_t g = 0; g < G; ++g) {
        const std::int64_t h = hk * G + g;
        for (std::int64_t i0 = 0; i0 < p.Sq; i0 += kBq) {
          const std::int64_t rows = std::min(kBq, p.Sq - i0);
          const core::KeyRange range = core::key_range(p, i0, i0 + rows);
          if (range.end <= j0 || range.begin >= j0 + n) continue;  // no row of this block sees the tile
          load_rows(c.q, b, i0, rows, h, D, Dp, 1.0f, q.data());
          for (std::size_t e = 0; e < q.size(); ++e) qs[e] = q[e] * p.scale;
          load_rows(c.dout, b, i0, rows, h, D, Dp, 1.0f, dout.data());
          gemm(qs.data(), std::size_t(Dp), kt.data(), kBk, s.data(), kBk, std::size_t(rows), kBk, std::size_t(D),
               false);
          gemm(dout.data(), std::size_t(Dp), vt.data(), kBk, dp.data(), kBk, std::size_t(rows), kBk, std::size_t(D),
               false);
          if (p.softcap > 0.0f) softcap(s.data(), std::size_t(rows * kBk), p.softcap);  // before the mask
          for (std::int64_t r = 0; r < rows; ++r) {
            const std::int64_t i = i0 + r;
            const float lse = c.lse[(b * p.H + h) * p.Sq + i];
            const float di = delta[std::size_t(g * p.Sq + i)];
            for (std::int64_t j = 0; j < kBk; ++j) {
              float& sv = s[std::size_t(r * kBk + j)];
              float& dpv = dp[std::size_t(r * kBk + j)];
              float prob = 0.0f, z = 0.0f, slope = 1.0f;
              if (j < n && lse != neg_inf && core::key_visible(p, i, j0 + j)) {
                float score = sv;
                if (p.mask)
                  score += p.mask[b * p.mask_strides[0] + h * p.mask_strides[1] + i * p.mask_strides[2] +
                                  (j0 + j) * p.mask_strides[3]];
                if (p.softcap > 0.0f) {  // d(c tanh(x / c))/dx = 1 - tanh^2, from the capped score
                  const float t = sv / p.softcap;
                  slope = 1.0f - t * t;
                }
                if (score > -1e30f) {
                  // A probability: held at 1 where an lse a little below the f32 score (stored in f32,
                  // or from another backend) would scale the gradients by exp(score - lse).
                  prob = std::min(std::exp(score - lse), 1.0f);
                  z = p.dropout_p > 0.0f
                          ? (core::dropout_keep(p.dropout_p, p.seed, std::uint32_t((p.batch0 + b) * p.H + h),
                                                std::uint32_t(i), std::uint32_t(j0 + j))
                                 ? keep_scale
                                 : 0.0f)
                          : 1.0f;
                }
              }
              // A zero weight stays zero: a NaN in a value the row does not see must not reach dS.
              const float ds = prob != 0.0f ? prob * (dpv * z - di) * p.scale * slope : 0.0f;
              sv = prob * z;  // s now holds P * Z (for dV)
              dpv = ds;       // dp now holds dS
            }
          }
          // dV += (P Z)^T dout, dK += dS^T q, dQ += dS k.
          transpose(s.data(), rows, kBk, kBk, st.data(), kBq);
          gemm(st.data(), kBq, dout.data(), std::size_t(Dp), dv.data(), std::size_t(Dp), std::size_t(n), std::size_t(D),
               std::size_t(rows), true);
          transpose(dp.data(), rows, kBk, kBk, st.data(), kBq);
          gemm(st.data(), kBq, q.data(), std::size_t(Dp), dk.data(), std::size_t(Dp), std::size_t(n), std::size_t(D),
               std::size_t(rows), true);
          gemm(dp.data(), kBk, k.data(), std::size_t(Dp), dq.data() + (g * p.Sq + i0) * Dp, std::size_t(Dp),
               std::size_t(rows), std::size_t(D), std::size_t(n), true);
        }
      }
      for (std::int64_t j = 0; j < n; ++j) {
        const std::int64_t atk = core::offset(c.dk, b, j0 + j, hk), atv = core::offset(c.dv, b, j0 + j, hk);
        if (!all_finite(dk.data() + j * Dp, D) || !all_finite(dv.data() + j * Dp, D)) {
          dkv_row_in_double(c, b, hk, j0 + j);  // see careful_rows.hpp
          continue;
        }
        for (std::int64_t d = 0; d < D; ++d) {
          core::store(c.dk.data, p.dtype, atk + d, dk[std::size_t(j * Dp + d)]);
          core::store(c.dv.data, p.dtype, atv + d, dv[std::size_t(j * Dp + d)]);
        }
      }
    }
    for (std::int64_t g = 0; g < G; ++g) {
      const std::int64_t h = hk * G + g;
      for (std::int64_t i = 0; i < p.Sq; ++i) {
        const std::int64_t at = core::offset(c.dq, b, i, h);
        if (!all_finite(dq.data() + (g * p.Sq + i) * Dp, D)) {
          dq_row_in_double(c, b, h, i);  // a NaN in a key the row does not see (dq = dS K)
          continue;
        }
        for (std::int64_t d = 0; d < D; ++d)
          core::store(c.dq.data, p.dtype, at + d, dq[std::size_t((g * p.Sq + i) * Dp + d)]);
      }
    }
  }
  for (std::int64_t h = 0; h < p.H && c.dsinks != nullptr; ++h) {
    double sum = 0;
    for (std::int64_t b = 0; b < p.B; ++b) sum += sink_parts[std::size_t(b * p.H + h)];
    c.dsinks[h] = float(sum);
  }
}

}  // namespace flashtq::cpu

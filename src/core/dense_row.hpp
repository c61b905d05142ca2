// One query row of dense attention in double, as docs/spec.md §1 defines it: the oracle computes every
// row this way, and the fast host backends recompute with it the rows their f32 arithmetic cannot
// finish (a score past f32's range, a non-finite value in a key the row cannot see), so both reach
// the same answer wherever it is finite. Plain loops; the caller supplies the row's dot products
// and values, whatever its memory holds.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/hash3.hpp"
#include "core/softcap.hpp"
#include "core/visibility.hpp"
#include "flashtq/problem.hpp"

namespace flashtq::core {

inline constexpr double kNegInfD = -std::numeric_limits<double>::infinity();

// Head h's sink logit (docs/spec.md §1.9), -inf when there is none.
inline double sink_logit(const DenseProblem& p, std::int64_t h) { return p.sinks ? double(p.sinks[h]) : kNegInfD; }

// Score of (b, h, i, j) from its dot product <q_i, k_j> (dot(j)), or -inf when the key is invisible,
// masked, or scores at or below the masked-score rule. dot is only called for visible keys.
template <typename Dot>
double dense_score(const DenseProblem& p, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j, Dot dot) {
  if (!key_visible(p, i, j)) return kNegInfD;
  double mask = 0;
  if (p.mask != nullptr) {
    mask =
        double(p.mask[b * p.mask_strides[0] + h * p.mask_strides[1] + i * p.mask_strides[2] + j * p.mask_strides[3]]);
    if (mask == kNegInfD) return kNegInfD;  // whatever the key holds (a NaN would survive the sum)
  }
  const double s = softcapped(p, double(p.scale) * dot(j)) + mask;
  return s <= masked_score ? kNegInfD : s;
}

// keep / (1 - p) for weight (b, h, i, j).
inline double dropout_factor(const DenseProblem& p, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
  if (p.dropout_p <= 0.0f) return 1.0;
  const bool keep =
      dropout_keep(p.dropout_p, p.seed, std::uint32_t((p.batch0 + b) * p.H + h), std::uint32_t(i), std::uint32_t(j));
  return keep ? 1.0 / (1.0 - double(p.dropout_p)) : 0.0;
}

// Row (b, h, i): calls add(j, w) for every key with a nonzero weight w (dropout applied) and returns
// the row's lse (-inf when it sees nothing and has no sink). A key of weight 0 is never read: what an
// invisible or masked key holds cannot reach the row (docs/spec.md §3). The head's sink logit joins the
// maximum and the denominator and adds no value. `s` is scratch of Sk doubles.
template <typename Dot, typename Add>
double dense_row(const DenseProblem& p, std::int64_t b, std::int64_t h, std::int64_t i, Dot dot, Add add,
                 std::vector<double>& s) {
  s.resize(std::size_t(p.Sk));
  const double sink = sink_logit(p, h);
  double m = sink;
  for (std::int64_t j = 0; j < p.Sk; ++j) {
    s[std::size_t(j)] = dense_score(p, b, h, i, j, dot);
    m = std::max(m, s[std::size_t(j)]);
  }
  if (m == kNegInfD) return kNegInfD;
  double l = std::exp(sink - m);
  for (std::int64_t j = 0; j < p.Sk; ++j) l += std::exp(s[std::size_t(j)] - m);
  for (std::int64_t j = 0; j < p.Sk; ++j) {
    const double w = std::exp(s[std::size_t(j)] - m) / l * dropout_factor(p, b, h, i, j);
    if (w != 0.0) add(j, w);
  }
  return m + std::log(l);
}

// The backward's weights of (b, h, i, j) from its score s (dense_score), the row's lse, dp = <dout_i, v_j>,
// delta_i = <dout_i, out_i> and the softcap's slope at the key's scaled product (softcap_slope): P*Z (for dV)
// and dS with respect to <q, k> (for dQ and dK); a zero weight adds nothing (as
// in the forward, a key's values reach a gradient only through a nonzero weight). P = exp(s - lse) is a probability
// and is held at 1: an lse a little below the score (stored in f32, or from another backend's
// arithmetic) would otherwise scale the gradients by exp(s - lse), which at large scores is huge.
struct BackwardWeights {
  double pz = 0, ds = 0;
};
inline BackwardWeights backward_weights(const DenseProblem& p, double s, double lse, double dp, double delta, double z,
                                        double slope) {
  if (s == kNegInfD) return {};
  double prob = std::exp(s - lse);
  if (prob > 1.0) prob = 1.0;  // (a NaN stays NaN)
  return {prob * z, prob * (dp * z - delta) * double(p.scale) * slope};
}

// Row (b, h, i)'s part of head h's sink gradient, -P_sink * delta_i (docs/spec.md §1.9); P_sink is held
// at 1 like every probability of the backward.
inline double sink_gradient(const DenseProblem& p, std::int64_t h, double lse, double delta) {
  const double sink = sink_logit(p, h);
  if (sink == kNegInfD || lse == kNegInfD) return 0.0;
  return -std::min(std::exp(sink - lse), 1.0) * delta;
}

}  // namespace flashtq::core

#include "reference/dense.hpp"

#include <cmath>
#include <limits>
#include <vector>

#include "core/dense_row.hpp"

namespace flashtq::reference {
namespace {

std::int64_t at(const DenseProblem& p, std::int64_t S, std::int64_t heads, std::int64_t b, std::int64_t s,
                std::int64_t h) {
  return ((b * S + s) * heads + h) * p.D;
}

double dot(const double* x, const double* y, std::int64_t D) {
  double acc = 0;
  for (std::int64_t d = 0; d < D; ++d) acc += x[d] * y[d];
  return acc;
}

}  // namespace

void dense_forward(const DenseProblem& p, const double* q, const double* k, const double* v, double* out, double* lse) {
  std::vector<double> s;
  for (std::int64_t b = 0; b < p.B; ++b) {
    for (std::int64_t h = 0; h < p.H; ++h) {
      const std::int64_t hk = h / p.group();
      for (std::int64_t i = 0; i < p.Sq; ++i) {
        const double* qi = q + at(p, p.Sq, p.H, b, i, h);
        double* o = out + at(p, p.Sq, p.H, b, i, h);
        for (std::int64_t d = 0; d < p.D; ++d) o[d] = 0.0;
        const double row_lse = core::dense_row(
            p, b, h, i, [&](std::int64_t j) { return dot(qi, k + at(p, p.Sk, p.Hkv, b, j, hk), p.D); },
            [&](std::int64_t j, double w) {
              const double* vj = v + at(p, p.Sk, p.Hkv, b, j, hk);
              for (std::int64_t d = 0; d < p.D; ++d) o[d] += w * vj[d];
            },
            s);
        if (lse != nullptr) lse[(b * p.H + h) * p.Sq + i] = row_lse;  // -inf for a row that sees nothing
      }
    }
  }
}

void dense_backward(const DenseProblem& p, const double* q, const double* k, const double* v, const double* out,
                    const double* dout, const double* lse, double* dq, double* dk, double* dv, double* dsinks) {
  for (std::int64_t n = 0; n < p.B * p.Sq * p.H * p.D; ++n) dq[n] = 0.0;
  for (std::int64_t h = 0; h < p.H && dsinks != nullptr; ++h) dsinks[h] = 0.0;
  for (std::int64_t n = 0; n < p.B * p.Sk * p.Hkv * p.D; ++n) dk[n] = dv[n] = 0.0;
  for (std::int64_t b = 0; b < p.B; ++b) {
    for (std::int64_t h = 0; h < p.H; ++h) {
      const std::int64_t hk = h / p.group();
      for (std::int64_t i = 0; i < p.Sq; ++i) {
        const double row_lse = lse[(b * p.H + h) * p.Sq + i];
        if (row_lse == -std::numeric_limits<double>::infinity()) continue;  // sees no key
        const std::int64_t qo = at(p, p.Sq, p.H, b, i, h);
        // D_i = <dout_i, out_i>, which equals sum_j P_ij * dP_ij with dropout applied.
        const double delta = dot(dout + qo, out + qo, p.D);
        if (dsinks != nullptr) dsinks[h] += core::sink_gradient(p, h, row_lse, delta);
        for (std::int64_t j = 0; j < p.Sk; ++j) {
          const std::int64_t ko = at(p, p.Sk, p.Hkv, b, j, hk);
          const double qk = dot(q + qo, k + ko, p.D);
          const double s = core::dense_score(p, b, h, i, j, [&](std::int64_t) { return qk; });
          if (s == -std::numeric_limits<double>::infinity()) continue;
          const core::BackwardWeights w =
              core::backward_weights(p, s, row_lse, dot(dout + qo, v + ko, p.D), delta,
                                     core::dropout_factor(p, b, h, i, j), core::softcap_slope(p, double(p.scale) * qk));
          for (std::int64_t d = 0; d < p.D && w.pz != 0.0; ++d) dv[ko + d] += w.pz * dout[qo + d];
          for (std::int64_t d = 0; d < p.D && w.ds != 0.0; ++d) {
            dq[qo + d] += w.ds * k[ko + d];
            dk[ko + d] += w.ds * q[qo + d];
          }
        }
      }
    }
  }
}

}  // namespace flashtq::reference

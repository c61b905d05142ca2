#include "reference/dense.hpp"

#include <cmath>
#include <limits>
#include <vector>

#include "core/hash3.hpp"
#include "core/visibility.hpp"

namespace flashtq::reference {
namespace {

std::int64_t at(const DenseProblem& p, std::int64_t S, std::int64_t heads, std::int64_t b, std::int64_t s,
                std::int64_t h) {
  return ((b * S + s) * heads + h) * p.D;
}

// Score of (b, h, i, j), or -inf when the key is invisible or masked.
double score(const DenseProblem& p, const double* q, const double* k, std::int64_t b, std::int64_t h, std::int64_t i,
             std::int64_t j) {
  if (!core::key_visible(p, i, j)) return -std::numeric_limits<double>::infinity();
  const double* qi = q + at(p, p.Sq, p.H, b, i, h);
  const double* kj = k + at(p, p.Sk, p.Hkv, b, j, h / p.group());
  double dot = 0;
  for (std::int64_t d = 0; d < p.D; ++d) dot += qi[d] * kj[d];
  double s = double(p.scale) * dot;
  if (p.mask != nullptr) {
    s += double(p.mask[b * p.mask_strides[0] + h * p.mask_strides[1] + i * p.mask_strides[2] + j * p.mask_strides[3]]);
  }
  return s <= core::masked_score ? -std::numeric_limits<double>::infinity() : s;
}

// keep / (1 - p) for weight (b, h, i, j).
double dropout_factor(const DenseProblem& p, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
  if (p.dropout_p <= 0.0f) return 1.0;
  const bool keep =
      core::dropout_keep(p.dropout_p, p.seed, std::uint32_t(b * p.H + h), std::uint32_t(i), std::uint32_t(j));
  return keep ? 1.0 / (1.0 - double(p.dropout_p)) : 0.0;
}

}  // namespace

void dense_forward(const DenseProblem& p, const double* q, const double* k, const double* v, double* out, double* lse) {
  std::vector<double> s(p.Sk);
  for (std::int64_t b = 0; b < p.B; ++b) {
    for (std::int64_t h = 0; h < p.H; ++h) {
      for (std::int64_t i = 0; i < p.Sq; ++i) {
        double m = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < p.Sk; ++j) {
          s[j] = score(p, q, k, b, h, i, j);
          m = std::max(m, s[j]);
        }
        double* o = out + at(p, p.Sq, p.H, b, i, h);
        for (std::int64_t d = 0; d < p.D; ++d) o[d] = 0.0;
        if (lse != nullptr) lse[(b * p.H + h) * p.Sq + i] = m;  // -inf for a row that sees nothing
        if (m == -std::numeric_limits<double>::infinity()) continue;
        double l = 0;
        for (std::int64_t j = 0; j < p.Sk; ++j) l += std::exp(s[j] - m);
        for (std::int64_t j = 0; j < p.Sk; ++j) {
          const double w = std::exp(s[j] - m) / l * dropout_factor(p, b, h, i, j);
          if (w == 0.0) continue;
          const double* vj = v + at(p, p.Sk, p.Hkv, b, j, h / p.group());
          for (std::int64_t d = 0; d < p.D; ++d) o[d] += w * vj[d];
        }
        if (lse != nullptr) lse[(b * p.H + h) * p.Sq + i] = m + std::log(l);
      }
    }
  }
}

void dense_backward(const DenseProblem& p, const double* q, const double* k, const double* v, const double* out,
                    const double* dout, const double* lse, double* dq, double* dk, double* dv) {
  for (std::int64_t n = 0; n < p.B * p.Sq * p.H * p.D; ++n) dq[n] = 0.0;
  for (std::int64_t n = 0; n < p.B * p.Sk * p.Hkv * p.D; ++n) dk[n] = dv[n] = 0.0;
  for (std::int64_t b = 0; b < p.B; ++b) {
    for (std::int64_t h = 0; h < p.H; ++h) {
      const std::int64_t hk = h / p.group();
      for (std::int64_t i = 0; i < p.Sq; ++i) {
        const double row_lse = lse[(b * p.H + h) * p.Sq + i];
        if (row_lse == -std::numeric_limits<double>::infinity()) continue;  // sees no key
        const std::int64_t qo = at(p, p.Sq, p.H, b, i, h);
        // D_i = <dout_i, out_i>, which equals sum_j P_ij * dP_ij with dropout applied.
        double delta = 0;
        for (std::int64_t d = 0; d < p.D; ++d) delta += dout[qo + d] * out[qo + d];
        for (std::int64_t j = 0; j < p.Sk; ++j) {
          const double s = score(p, q, k, b, h, i, j);
          if (s == -std::numeric_limits<double>::infinity()) continue;
          const double prob = std::exp(s - row_lse);
          const double z = dropout_factor(p, b, h, i, j);
          const std::int64_t ko = at(p, p.Sk, p.Hkv, b, j, hk);
          double dp = 0;
          for (std::int64_t d = 0; d < p.D; ++d) dp += dout[qo + d] * v[ko + d];
          dp *= z;
          for (std::int64_t d = 0; d < p.D; ++d) dv[ko + d] += prob * z * dout[qo + d];
          const double ds = prob * (dp - delta) * double(p.scale);
          for (std::int64_t d = 0; d < p.D; ++d) {
            dq[qo + d] += ds * k[ko + d];
            dk[ko + d] += ds * q[qo + d];
          }
        }
      }
    }
  }
}

}  // namespace flashtq::reference

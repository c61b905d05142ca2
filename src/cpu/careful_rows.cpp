#include "cpu/careful_rows.hpp"

#include <vector>

#include "core/dense_row.hpp"
#include "core/elements.hpp"

namespace flashtq::cpu {
namespace {

// Row (b, s, h) of a view in double.
std::vector<double> row_of(const TensorView& t, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t D) {
  std::vector<double> x(static_cast<std::size_t>(D));
  const std::int64_t at = core::offset(t, b, s, h);
  for (std::int64_t d = 0; d < D; ++d) x[std::size_t(d)] = core::load(t.data, t.dtype, at + d);
  return x;
}

double dot(const std::vector<double>& x, const std::vector<double>& y) {
  double acc = 0;
  for (std::size_t d = 0; d < x.size(); ++d) acc += x[d] * y[d];
  return acc;
}

void store_row(const TensorView& t, std::int64_t b, std::int64_t s, std::int64_t h, const std::vector<double>& x) {
  const std::int64_t at = core::offset(t, b, s, h);
  for (std::size_t d = 0; d < x.size(); ++d) core::store(t.data, t.dtype, at + std::int64_t(d), float(x[d]));
}

// What the backward needs of row (b, h, i): q, dout and delta = <dout, out>.
struct BackwardRow {
  std::vector<double> q, dout;
  double delta = 0, lse = 0;
  BackwardRow(const BackwardCall& c, std::int64_t b, std::int64_t h, std::int64_t i)
      : q(row_of(c.q, b, i, h, c.p.D)), dout(row_of(c.dout, b, i, h, c.p.D)) {
    delta = dot(dout, row_of(c.out, b, i, h, c.p.D));
    lse = c.lse[(b * c.p.H + h) * c.p.Sq + i];
  }
  // The weights of key j, whose k and v rows are given.
  core::BackwardWeights weights(const BackwardCall& c, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j,
                                const std::vector<double>& k, const std::vector<double>& v) const {
    if (lse == core::kNegInfD) return {};
    const double qk = dot(q, k);
    const double s = core::dense_score(c.p, b, h, i, j, [&](std::int64_t) { return qk; });
    return core::backward_weights(c.p, s, lse, dot(dout, v), delta, core::dropout_factor(c.p, b, h, i, j),
                                  core::softcap_slope(c.p, double(c.p.scale) * qk));
  }
};

}  // namespace

void dense_row_in_double(const ForwardCall& c, std::int64_t b, std::int64_t h, std::int64_t i) {
  const DenseProblem& p = c.p;
  const std::int64_t hk = h / p.group();
  const std::vector<double> q = row_of(c.q, b, i, h, p.D);
  std::vector<double> o(std::size_t(p.D), 0.0), s;
  const double lse = core::dense_row(
      p, b, h, i, [&](std::int64_t j) { return dot(q, row_of(c.k, b, j, hk, p.D)); },
      [&](std::int64_t j, double w) {
        const std::vector<double> v = row_of(c.v, b, j, hk, p.D);
        for (std::size_t d = 0; d < o.size(); ++d) o[d] += w * v[d];
      },
      s);
  store_row(c.out, b, i, h, o);
  if (c.lse) c.lse[(b * p.H + h) * p.Sq + i] = float(lse);
}

void dq_row_in_double(const BackwardCall& c, std::int64_t b, std::int64_t h, std::int64_t i) {
  const DenseProblem& p = c.p;
  const std::int64_t hk = h / p.group();
  const BackwardRow row(c, b, h, i);
  std::vector<double> dq(std::size_t(p.D), 0.0);
  for (std::int64_t j = 0; j < p.Sk; ++j) {
    if (!core::key_visible(p, i, j)) continue;
    const std::vector<double> k = row_of(c.k, b, j, hk, p.D);
    const core::BackwardWeights w = row.weights(c, b, h, i, j, k, row_of(c.v, b, j, hk, p.D));
    for (std::size_t d = 0; d < dq.size() && w.ds != 0.0; ++d) dq[d] += w.ds * k[d];
  }
  store_row(c.dq, b, i, h, dq);
}

void dkv_row_in_double(const BackwardCall& c, std::int64_t b, std::int64_t hk, std::int64_t j) {
  const DenseProblem& p = c.p;
  const std::vector<double> k = row_of(c.k, b, j, hk, p.D), v = row_of(c.v, b, j, hk, p.D);
  std::vector<double> dk(std::size_t(p.D), 0.0), dv(std::size_t(p.D), 0.0);
  for (std::int64_t g = 0; g < p.group(); ++g) {
    const std::int64_t h = hk * p.group() + g;
    for (std::int64_t i = 0; i < p.Sq; ++i) {
      if (!core::key_visible(p, i, j)) continue;
      const BackwardRow row(c, b, h, i);
      const core::BackwardWeights w = row.weights(c, b, h, i, j, k, v);
      for (std::size_t d = 0; d < dk.size() && w.pz != 0.0; ++d) dv[d] += w.pz * row.dout[d];
      for (std::size_t d = 0; d < dk.size() && w.ds != 0.0; ++d) dk[d] += w.ds * row.q[d];
    }
  }
  store_row(c.dk, b, j, hk, dk);
  store_row(c.dv, b, j, hk, dv);
}

}  // namespace flashtq::cpu

#include "reference/quality.hpp"

#include <cmath>
#include <vector>

#include "core/codebook.hpp"
#include "core/rht.hpp"
#include "core/signs.hpp"
#include "flashtq/tensor.hpp"
#include "flashtq/turboquant.hpp"
#include "core/tq_rows.hpp"
#include "flashtq/backend.hpp"

namespace flashtq::reference {
namespace {

void random_unit(std::vector<double>& x, std::mt19937_64& rng) {
  std::normal_distribution<double> n(0, 1);
  double norm = 0;
  for (double& e : x) {
    e = n(rng);
    norm += e * e;
  }
  for (double& e : x) e /= std::sqrt(norm);
}

}  // namespace

double measure_mse(std::int64_t D, int bits, int trials, std::mt19937_64& rng) {
  const core::Codebook& cb = core::codebook(D, bits);
  const auto signs = core::sign_bits(rng(), 0, 0);
  std::vector<double> x(static_cast<std::size_t>(D)), y(x);
  double total = 0;
  for (int t = 0; t < trials; ++t) {
    random_unit(x, rng);
    y = x;
    core::rht(y.data(), D, signs);
    for (double& e : y)
      e = cb.centroids[std::size_t(core::quantize(e, cb.boundaries.data(), int(cb.boundaries.size())))];
    core::inverse_rht(y.data(), D, signs);
    for (std::int64_t d = 0; d < D; ++d) total += std::pow(y[std::size_t(d)] - x[std::size_t(d)], 2);
  }
  return total / trials;
}

EstimatorStats measure_key_estimator(std::int64_t D, int b_mse, std::int64_t pairs, std::mt19937_64& rng) {
  const TqLayout l{D, 1, pairs, b_mse, 2};
  const TqTables tables = make_tq_tables(l, rng(), 0);
  std::vector<float> k(std::size_t(pairs * D)), q(k.size());
  std::vector<double> kx(static_cast<std::size_t>(D)), qx(kx);
  std::vector<double> truth(static_cast<std::size_t>(pairs));
  for (std::int64_t i = 0; i < pairs; ++i) {
    random_unit(kx, rng);
    random_unit(qx, rng);
    // q = a k + sqrt(1 - a^2) noise with a uniform in [-1, 1]: unit queries whose true products span [-1, 1].
    const double a = std::uniform_real_distribution<double>(-1.0, 1.0)(rng);
    double qn = 0;
    for (std::int64_t d = 0; d < D; ++d) {
      qx[std::size_t(d)] = a * kx[std::size_t(d)] + std::sqrt(1 - a * a) * qx[std::size_t(d)];
      qn += qx[std::size_t(d)] * qx[std::size_t(d)];
    }
    double dot = 0;
    for (std::int64_t d = 0; d < D; ++d) {
      k[std::size_t(i * D + d)] = float(kx[std::size_t(d)]);
      q[std::size_t(i * D + d)] = float(qx[std::size_t(d)] / std::sqrt(qn));
      dot += double(k[std::size_t(i * D + d)]) * double(q[std::size_t(i * D + d)]);
    }
    truth[std::size_t(i)] = dot;
  }
  std::vector<std::uint32_t> words(std::size_t(l.key_words()));
  std::vector<float> scratch(std::size_t(tq_scratch_floats(pairs, 1, D)));
  Backend& oracle = flashtq::backend("reference");
  flashtq::tq_encode_keys(oracle,
                          {tables, TensorView::bshd(k.data(), DType::f32, 1, pairs, 1, D), 0, words.data(), nullptr});
  flashtq::tq_rotate_queries(
      oracle, {tables, TensorView::bshd(q.data(), DType::f32, 1, pairs, 1, D), pairs, scratch.data(), nullptr});
  const double qjl_scale = std::sqrt(std::acos(-1.0) / 2) / std::sqrt(double(D));
  const TqScratchLayout s{pairs, 1, D};
  double sx = 0, sy = 0, sxx = 0, sxy = 0, sq_err = 0;
  for (std::int64_t i = 0; i < pairs; ++i) {
    const double x = truth[std::size_t(i)];
    const double y = core::tq_key_dot(tables, scratch.data() + s.q_rot(i, 0), scratch.data() + s.q_jl(i, 0),
                                      scratch[std::size_t(s.sum(i, 0))], words.data(), i, qjl_scale);
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
    sq_err += (y - x) * (y - x);
  }
  const double n = double(pairs);
  return {(sxy - sx * sy / n) / (sxx - sx * sx / n), sq_err / n * double(D)};
}

}  // namespace flashtq::reference

// The oracle's backward against central finite differences of sum(out * dout), in double.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "conformance/host_tensor.hpp"
#include "reference/dense.hpp"
#include "seeded.hpp"

namespace flashtq {
namespace {

struct GradCase {
  const char* name;
  std::int64_t H, Hkv, D;
  bool causal, mask;
  std::int64_t window;
  float dropout;
  float softcap = 0;
  bool sinks = false;
};

class OracleBackward : public ::testing::TestWithParam<GradCase> {};

TEST_P(OracleBackward, MatchesCentralFiniteDifferences) {
  const GradCase gc = GetParam();
  std::mt19937_64 rng = test_rng();
  DenseProblem p;
  p.B = 2;
  p.Sq = 5;
  p.Sk = 7;
  p.H = gc.H;
  p.Hkv = gc.Hkv;
  p.D = gc.D;
  p.scale = 0.4f;
  p.causal = gc.causal;
  p.causal_offset = 2;
  p.window = gc.window;
  p.dropout_p = gc.dropout;
  p.seed = std::uint32_t(rng());
  std::normal_distribution<double> n(0, 1);
  std::vector<float> mask(std::size_t(p.Sq * p.Sk));
  for (float& m : mask) m = float(n(rng));
  if (gc.mask) {
    p.mask = mask.data();
    p.mask_strides = {0, 0, p.Sk, 1};
  }
  auto draw = [&](std::int64_t count) {
    std::vector<double> x(static_cast<std::size_t>(count));
    for (double& e : x) e = n(rng);
    return x;
  };
  p.softcap = gc.softcap;
  std::vector<float> sinks(std::size_t(p.H));
  for (std::size_t h = 0; h < sinks.size(); ++h) sinks[h] = h == 1 ? -INFINITY : float(n(rng) + 1.0);
  if (gc.sinks) p.sinks = sinks.data();
  std::vector<double> q = draw(p.B * p.Sq * p.H * p.D), k = draw(p.B * p.Sk * p.Hkv * p.D),
                      v = draw(std::int64_t(k.size())), dout = draw(std::int64_t(q.size()));
  std::vector<double> out(q.size()), lse(std::size_t(p.B * p.H * p.Sq));
  auto loss = [&]() {
    reference::dense_forward(p, q.data(), k.data(), v.data(), out.data(), lse.data());
    double s = 0;
    for (std::size_t i = 0; i < out.size(); ++i) s += out[i] * dout[i];
    return s;
  };
  loss();
  std::vector<double> dq(q.size()), dk(k.size()), dv(v.size()), dsinks(sinks.size());
  reference::dense_backward(p, q.data(), k.data(), v.data(), out.data(), dout.data(), lse.data(), dq.data(), dk.data(),
                            dv.data(), dsinks.data());
  const double h = 1e-5;
  auto numeric = [&](std::vector<double>& x) {
    std::vector<double> g(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double saved = x[i];
      x[i] = saved + h;
      const double up = loss();
      x[i] = saved - h;
      const double down = loss();
      x[i] = saved;
      g[i] = (up - down) / (2 * h);
    }
    return g;
  };
  std::string detail;
  EXPECT_LE(conformance::relative_error(numeric(q), dq, detail), 1e-6) << "dq " << detail;
  EXPECT_LE(conformance::relative_error(numeric(k), dk, detail), 1e-6) << "dk " << detail;
  EXPECT_LE(conformance::relative_error(numeric(v), dv, detail), 1e-6) << "dv " << detail;
  if (!gc.sinks) return;
  // The sinks are f32: each is moved by +-2^-14, exact in f32 for |sink| < 2^10, and the loss read in double.
  // A central difference is exact to about step^2 / 6 * the third derivative: at 2^-14 that is 1e-9 of the gradient,
  // while rounding in the double loss costs about 1e-16 / step = 2e-12. (At 2^-10 the truncation alone reached 1.5e-5.)
  std::vector<double> numeric_sinks(sinks.size());
  for (std::size_t h = 0; h < sinks.size(); ++h) {
    if (sinks[h] == -INFINITY) continue;  // no sink, no gradient (the oracle's is 0)
    const float saved = sinks[h], step = 1.0f / 16384;
    ASSERT_LT(std::fabs(saved), 1024.0f) << "a sink this large would not move by exactly the step";
    sinks[h] = saved + step;
    const double up = loss();
    sinks[h] = saved - step;
    const double down = loss();
    sinks[h] = saved;
    numeric_sinks[h] = (up - down) / (2 * double(step));
  }
  loss();
  EXPECT_LE(conformance::relative_error(numeric_sinks, dsinks, detail), 1e-7) << "dsinks " << detail;
}

INSTANTIATE_TEST_SUITE_P(Features, OracleBackward,
                         ::testing::Values(GradCase{"plain", 2, 2, 8, false, false, 0, 0.0f},
                                           GradCase{"gqa", 4, 2, 8, false, false, 0, 0.0f},
                                           GradCase{"mqa_causal", 3, 1, 17, true, false, 0, 0.0f},
                                           GradCase{"dropout", 2, 2, 8, false, false, 0, 0.3f},
                                           GradCase{"dropout_gqa", 4, 1, 8, true, true, 0, 0.2f},
                                           GradCase{"mask_window", 2, 1, 5, true, true, 3, 0.0f},
                                           GradCase{"window_not_causal", 2, 2, 8, false, false, 2, 0.1f},
                                           GradCase{"softcap", 2, 2, 8, false, false, 0, 0.0f, 0.8f},
                                           GradCase{"softcap_mask_dropout", 4, 2, 8, true, true, 0, 0.2f, 3.0f},
                                           GradCase{"sinks", 3, 1, 8, false, false, 0, 0.0f, 0.0f, true},
                                           GradCase{"sinks_causal_window", 2, 2, 5, true, true, 2, 0.1f, 0.0f, true},
                                           GradCase{"softcap_sinks_gqa", 4, 2, 8, true, false, 0, 0.0f, 2.0f, true}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace flashtq

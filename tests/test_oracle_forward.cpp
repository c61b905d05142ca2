// The oracle's dense forward against the brute-force formula, over a randomized feature matrix.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "brute_force.hpp"
#include "conformance/host_tensor.hpp"
#include "flashtq/flashtq.hpp"
#include "reference/dense.hpp"
#include "seeded.hpp"

namespace flashtq {
namespace {

using conformance::HostTensor;

struct FeatureCase {
  int index;
  std::int64_t D;
  DType dtype;
};

std::string name_of(const ::testing::TestParamInfo<FeatureCase>& info) {
  return "case" + std::to_string(info.param.index) + "_D" + std::to_string(info.param.D) + "_" +
         dtype_name(info.param.dtype);
}

std::vector<FeatureCase> feature_matrix() {
  std::vector<FeatureCase> cases;
  const std::int64_t dims[] = {1, 17, 32, 64, 96, 128, 256};
  const DType types[] = {DType::f32, DType::f16, DType::bf16};
  int index = 0;
  for (int round = 0; round < 4; ++round)
    for (std::int64_t D : dims) cases.push_back({index++, D, types[(index + round) % 3]});
  return cases;
}

class OracleForward : public ::testing::TestWithParam<FeatureCase> {};

// One case: features cycle with the index (so GQA, MQA, causal offsets, windows, every mask
// broadcast pattern and dropout all occur), sizes and data are fresh random draws.
TEST_P(OracleForward, MatchesBruteForce) {
  const FeatureCase fc = GetParam();
  std::mt19937_64 rng = test_rng();
  const int i = fc.index;
  const std::int64_t B = 1 + i % 2, Hkv = 1 + (i / 2) % 2, H = Hkv * (std::int64_t(1) << (i % 3));
  const std::int64_t Sq = std::uniform_int_distribution<std::int64_t>(1, 20)(rng);
  const std::int64_t Sk = (i % 5 == 0) ? Sq : std::uniform_int_distribution<std::int64_t>(1, 30)(rng);
  AttentionParams params;
  params.causal = i % 2 == 0;
  switch (i % 4) {
    case 0: break;  // default: Sk - Sq
    case 1: params.causal_offset = 0; break;
    case 2: params.causal_offset = Sk - Sq; break;
    default: params.causal_offset = std::uniform_int_distribution<std::int64_t>(-3, Sk + 3)(rng);
  }
  if (i % 3 == 1) params.window = std::uniform_int_distribution<std::int64_t>(1, 8)(rng);
  std::vector<float> mask;
  if (i % 20 < 16) {  // the mask on; over the matrix, patterns i % 20 cover all 16 broadcast combinations
    const int pattern = i % 20;
    const std::array<std::int64_t, 4> extent{B, H, Sq, Sk};
    std::int64_t stride = 1;
    for (int d = 3; d >= 0; --d) {
      params.mask_strides[std::size_t(d)] = ((pattern >> d) & 1) ? 0 : stride;
      stride *= extent[std::size_t(d)];
    }
    mask.resize(std::size_t(stride));
    std::normal_distribution<float> n(0, 1);
    for (std::size_t m = 0; m < mask.size(); ++m)
      mask[m] = (m % 7 == 3) ? -std::numeric_limits<float>::infinity() : n(rng);
    params.mask = mask.data();
    params.mask_elements = std::int64_t(mask.size());
  }
  if (i % 5 == 2) {
    params.dropout_p = 0.3f;
    params.seed = std::uint32_t(rng());
  }
  if (i % 3 == 2) params.softcap = i % 2 ? 0.7f : 5.0f;  // a cap that bends every score, and a mild one
  std::vector<float> sinks(static_cast<std::size_t>(H));
  if (i % 4 == 1 || i % 7 == 3) {
    std::normal_distribution<float> logit(1.0f, 2.0f);
    for (std::size_t h = 0; h < sinks.size(); ++h) sinks[h] = h % 3 == 2 ? -INFINITY : logit(rng);
    params.sinks = sinks.data();
  }
  HostTensor q({B, Sq, H, fc.D}, fc.dtype, i % 2 == 1), k({B, Sk, Hkv, fc.D}, fc.dtype, false), v(k);
  q.fill_normal(rng);
  k.fill_normal(rng);
  v.fill_normal(rng);
  HostTensor out(q);
  out.poison();
  std::vector<float> lse(std::size_t(B * H * Sq), std::numeric_limits<float>::quiet_NaN());

  Backend& ref = backend("reference");
  attention_forward(ref, {q.view, k.view, v.view, out.view, lse.data()}, params);

  DenseProblem p;
  p.B = B;
  p.Sq = Sq;
  p.Sk = Sk;
  p.H = H;
  p.Hkv = Hkv;
  p.D = fc.D;
  p.scale = float(1.0 / std::sqrt(double(fc.D)));
  p.causal = params.causal;
  p.causal_offset = params.causal_offset.value_or(Sk - Sq);
  p.window = params.window;
  p.mask = params.mask;
  p.mask_strides = params.mask_strides;
  p.dropout_p = params.dropout_p;
  p.seed = params.seed;
  p.softcap = params.softcap;
  p.sinks = params.sinks;
  const auto expect = testing::brute_force_attention(p, q.values(), k.values(), v.values());

  // The oracle's own double result must agree with the formula to rounding.
  std::vector<double> out_d(expect.out.size()), lse_d(expect.lse.size());
  reference::dense_forward(p, q.values().data(), k.values().data(), v.values().data(), out_d.data(), lse_d.data());
  std::string detail;
  EXPECT_LE(conformance::relative_error(expect.out, out_d, detail), 1e-12) << detail;
  EXPECT_LE(conformance::relative_error(expect.lse, lse_d, detail), 1e-12) << detail;

  // Through the public API the output is rounded into the dtype.
  const double tol = fc.dtype == DType::f32 ? 1e-6 : fc.dtype == DType::f16 ? 1e-3 : 8e-3;
  EXPECT_LE(conformance::relative_error(expect.out, out.values(), detail), tol) << detail;
  EXPECT_LE(conformance::relative_error(expect.lse, std::vector<double>(lse.begin(), lse.end()), detail), 1e-6)
      << detail;
  for (double x : out.values()) ASSERT_FALSE(std::isnan(x));
}

INSTANTIATE_TEST_SUITE_P(FeatureMatrix, OracleForward, ::testing::ValuesIn(feature_matrix()), name_of);

TEST(OracleForward, RowsThatSeeNoKeyWriteZeroAndMinusInfinity) {
  // Causal with a negative offset: rows 0..2 sit at positions -3..-1 and see nothing; a fully
  // -inf mask row sees nothing either.
  const std::int64_t Sq = 6, Sk = 5, D = 8;
  HostTensor q({1, Sq, 1, D}, DType::f32, false), k({1, Sk, 1, D}, DType::f32, false), v(k);
  std::mt19937_64 rng = test_rng();
  q.fill_normal(rng);
  k.fill_normal(rng);
  v.fill_normal(rng);
  std::vector<float> mask(std::size_t(Sq * Sk), 0.0f);
  for (std::int64_t j = 0; j < Sk; ++j) mask[std::size_t(4 * Sk + j)] = -std::numeric_limits<float>::infinity();
  AttentionParams params;
  params.causal = true;
  params.causal_offset = -3;
  params.mask = mask.data();
  params.mask_strides = {0, 0, Sk, 1};
  params.mask_elements = std::int64_t(mask.size());
  HostTensor out(q);
  out.poison();
  std::vector<float> lse(Sq, 0.0f);
  attention_forward(backend("reference"), {q.view, k.view, v.view, out.view, lse.data()}, params);
  const auto o = out.values();
  for (std::int64_t i : {0, 1, 2, 4}) {
    EXPECT_EQ(lse[std::size_t(i)], -std::numeric_limits<float>::infinity()) << i;
    for (std::int64_t d = 0; d < D; ++d) EXPECT_EQ(o[std::size_t(i * D + d)], 0.0) << i;
  }
  for (std::int64_t i : {3, 5}) EXPECT_TRUE(std::isfinite(lse[std::size_t(i)])) << i;
}

}  // namespace
}  // namespace flashtq

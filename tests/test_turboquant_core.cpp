// TurboQuant building blocks: packing, word offsets, signs, RHT, codebooks, the key estimator.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <numeric>
#include <random>

#include "conformance/host_tensor.hpp"
#include "core/codebook.hpp"
#include "core/packing.hpp"
#include "core/rht.hpp"
#include "core/signs.hpp"
#include "flashtq/flashtq.hpp"
#include "reference/quality.hpp"
#include "seeded.hpp"

namespace flashtq {
namespace {

using conformance::HostTensor;

class Packing : public ::testing::TestWithParam<int> {};

TEST_P(Packing, CodesRoundTrip) {
  const int bits = GetParam();
  const std::int64_t D = 128;
  std::mt19937 rng{static_cast<std::uint32_t>(fresh_seed())};
  std::vector<std::uint32_t> codes(D), words(std::size_t(D * bits / 32), 0u);
  for (auto& c : codes) c = rng() & ((1u << bits) - 1u);
  for (std::int64_t d = 0; d < D; ++d) core::put_code(words.data(), d, bits, codes[std::size_t(d)]);
  for (std::int64_t d = 0; d < D; ++d) ASSERT_EQ(core::get_code(words.data(), d, bits), codes[std::size_t(d)]) << d;
}
INSTANTIATE_TEST_SUITE_P(Bits, Packing, ::testing::Values(1, 2, 3, 4));

TEST(Packing, TwoBitCodesFollowTheSeedLayout) {
  std::vector<std::uint32_t> words(8, 0u);
  core::put_code(words.data(), 17, 2, 3);  // element 1 of word 1: bits 2..3
  core::put_code(words.data(), 15, 2, 2);  // element 15 of word 0: bits 30..31
  EXPECT_EQ(words[1], 0b1100u);
  EXPECT_EQ(words[0], 0x80000000u);
  std::vector<std::uint32_t> three(12, 0u);
  core::put_code(three.data(), 10, 3, 0b101);  // bits 30..32 straddle words 0 and 1
  EXPECT_EQ(three[0], 0x40000000u);
  EXPECT_EQ(three[1], 0x1u);
}

TEST(Layout, HandComputedOffsetsOfEveryRegion) {
  TqLayout l{128, 2, 10, 2, 2};
  EXPECT_EQ(l.key_code_words(), 8);
  EXPECT_EQ(l.key_jl_offset(), 160);
  EXPECT_EQ(l.key_norm_offset(), 240);
  EXPECT_EQ(l.key_words(), 260);
  EXPECT_EQ(l.value_norm_offset(), 160);
  EXPECT_EQ(l.value_words(), 180);
  EXPECT_EQ(l.bytes_per_token_per_head(), 88);
  EXPECT_NEAR(l.compression_vs_bf16(), 512.0 / 88.0, 1e-12);

  // Encode one timestep (t = 3) where kv head 0 is zero and head 1 is not: only slot 13's words
  // change: codes 104..111, QJL 212..215, norm 253 (keys); codes 104..111, norm 173 (values).
  HostTensor x({1, 1, 2, 128}, DType::f32, false);
  std::mt19937_64 rng = test_rng();
  std::vector<double> v(256, 0.0);
  std::normal_distribution<double> n(0, 1);
  for (int d = 128; d < 256; ++d) v[std::size_t(d)] = n(rng);
  x.fill(v);
  const TqTables t = make_tq_tables(l, 7, 0);
  std::vector<std::uint32_t> keys(std::size_t(l.key_words()), 0u), values(std::size_t(l.value_words()), 0u);
  tq_encode_keys(backend("reference"), {t, x.view, 3, keys.data(), nullptr});
  tq_encode_values(backend("reference"), {t, x.view, 3, values.data(), nullptr});
  auto in = [](std::int64_t w, std::int64_t lo, std::int64_t hi) { return w >= lo && w < hi; };
  for (std::int64_t w = 0; w < l.key_words(); ++w) {
    if (!(in(w, 104, 112) || in(w, 212, 216) || w == 253)) {
      EXPECT_EQ(keys[std::size_t(w)], 0u) << w;
    }
  }
  EXPECT_NE(keys[253], 0u);
  EXPECT_NE(keys[253] >> 16, 0u);  // residual norm in the high half
  for (std::int64_t w = 0; w < l.value_words(); ++w) {
    if (!(in(w, 104, 112) || w == 173)) {
      EXPECT_EQ(values[std::size_t(w)], 0u) << w;
    }
  }
  EXPECT_NE(values[173], 0u);
  EXPECT_EQ(values[173] >> 16, 0u);  // values: high half 0
}

TEST(Signs, DeterministicDistinctAndBalanced) {
  EXPECT_EQ(core::sign_bits(5, 3, 0), core::sign_bits(5, 3, 0));
  EXPECT_NE(core::sign_bits(5, 3, 0), core::sign_bits(5, 3, 1));
  EXPECT_NE(core::sign_bits(5, 3, 0), core::sign_bits(5, 4, 0));
  EXPECT_NE(core::sign_bits(5, 3, 0), core::sign_bits(6, 3, 0));
  int negative = 0;
  for (auto w : core::sign_bits(11, 0, 0)) negative += std::popcount(w);
  EXPECT_NEAR(negative, 128, 4 * 8);
}

class Rht : public ::testing::TestWithParam<std::int64_t> {};

TEST_P(Rht, IsTheOrthonormalMatrixAndItsInverseInverts) {
  const std::int64_t D = GetParam();
  const auto s = core::sign_bits(fresh_seed(), 0, 0);
  std::mt19937_64 rng = test_rng();
  std::normal_distribution<double> n(0, 1);
  std::vector<double> x(static_cast<std::size_t>(D));
  for (double& e : x) e = n(rng);
  // Against the definition: H[i][j] = (-1)^popcount(i & j), RHT = H diag(s) / sqrt(D).
  std::vector<double> y = x;
  core::rht(y.data(), D, s);
  for (std::int64_t i = 0; i < D; ++i) {
    double expect = 0;
    for (std::int64_t j = 0; j < D; ++j) {
      expect += (std::popcount(std::uint64_t(i & j)) % 2 ? -1.0 : 1.0) * core::sign_of(s, j) * x[std::size_t(j)];
    }
    ASSERT_NEAR(y[std::size_t(i)], expect / std::sqrt(double(D)), 1e-12);
  }
  const double nx = std::sqrt(std::inner_product(x.begin(), x.end(), x.begin(), 0.0));
  const double ny = std::sqrt(std::inner_product(y.begin(), y.end(), y.begin(), 0.0));
  EXPECT_NEAR(nx, ny, 1e-12 * nx);
  core::inverse_rht(y.data(), D, s);
  for (std::int64_t i = 0; i < D; ++i) ASSERT_NEAR(y[std::size_t(i)], x[std::size_t(i)], 1e-12);
}
INSTANTIATE_TEST_SUITE_P(Dims, Rht, ::testing::Values(1, 2, 32, 64, 128, 256));

TEST(Codebook, CheckValuesAtD128) {
  const double r = std::sqrt(128.0);
  const std::vector<std::vector<double>> expect = {{0.7994}, {0.4524, 1.5052}, {0.2444, 0.7533, 1.3365, 2.1314}};
  for (int b = 1; b <= 3; ++b) {
    const auto& c = core::codebook(128, b).centroids;
    const int levels = 1 << b;
    for (int i = 0; i < levels / 2; ++i) {
      EXPECT_NEAR(c[std::size_t(levels / 2 + i)] * r, expect[std::size_t(b - 1)][std::size_t(i)], 5e-4) << b;
      EXPECT_NEAR(c[std::size_t(levels / 2 - 1 - i)] * r, -expect[std::size_t(b - 1)][std::size_t(i)], 5e-4) << b;
    }
  }
}

// D_mse measured by quantizing random unit vectors, within 3 % of the values in docs/spec.md §2.
class CodebookMse : public ::testing::TestWithParam<int> {};
TEST_P(CodebookMse, MeasuredDistortionMatchesSpec) {
  const int b = GetParam();
  const double spec[] = {0, 0.361, 0.116, 0.034, 0.0093};
  std::mt19937_64 rng = test_rng();
  EXPECT_NEAR(reference::measure_mse(128, b, 4000, rng), spec[b], 0.03 * spec[b]);
  EXPECT_NEAR(core::codebook(128, b).mse_per_coordinate * 128, spec[b], 0.03 * spec[b]);  // the exact integral
}
INSTANTIATE_TEST_SUITE_P(Bits, CodebookMse, ::testing::Values(1, 2, 3, 4));

// The key estimator is unbiased and its error is within the paper's bound for b = b_mse + 1 bits.
class KeyEstimator : public ::testing::TestWithParam<int> {};
TEST_P(KeyEstimator, UnbiasedWithBoundedError) {
  const int b_mse = GetParam();
  std::mt19937_64 rng = test_rng();
  const auto stats = reference::measure_key_estimator(128, b_mse, 20000, rng);
  EXPECT_GE(stats.slope, 0.99);
  EXPECT_LE(stats.slope, 1.01);
  EXPECT_LT(stats.dprod_d, std::sqrt(3.0) * std::pow(std::acos(-1.0), 2) * std::pow(4.0, -(b_mse + 1)));
}
INSTANTIATE_TEST_SUITE_P(Bits, KeyEstimator, ::testing::Values(1, 2, 3));

}  // namespace
}  // namespace flashtq

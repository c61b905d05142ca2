// f16/bf16 rounding and the dropout hash, against values computed independently (Python's struct
// module for f16, a Python transcription of the seed's WGSL for hash3).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "core/half.hpp"
#include "core/hash3.hpp"

namespace flashtq::core {
namespace {

TEST(Half, F16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3C00);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);  // rounds to infinity
  EXPECT_EQ(f32_to_f16(1e-8f), 0x0000);
  EXPECT_EQ(f32_to_f16(6e-8f), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16(3e-5f), 0x01F7);  // subnormal
  EXPECT_EQ(f32_to_f16(0.1f), 0x2E66);
  EXPECT_EQ(f32_to_f16(-2.5f), 0xC100);
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3C00);      // tie to even (down)
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3C02);  // tie to even (up)
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Half, F16RoundTripsEveryFiniteHalf) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7C00) == 0x7C00) continue;  // inf / NaN
    ASSERT_EQ(f32_to_f16(f16_to_f32(std::uint16_t(h))), h) << std::hex << h;
  }
}

TEST(Half, F16ErrorIsAtMostHalfAnUlp) {
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(-60000.0f, 60000.0f);
  for (int i = 0; i < 100000; ++i) {
    const float x = dist(rng) * (i % 2 ? 1e-4f : 1.0f);
    const float y = f16_to_f32(f32_to_f16(x));
    const float ulp = std::max(std::abs(x) * 0x1p-10f, 0x1p-24f);
    ASSERT_LE(std::abs(y - x), 0.5f * ulp * 1.0001f) << x;
  }
}

TEST(Half, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f), 0x3F80);      // tie to even (down)
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);  // tie to even (up)
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);
  EXPECT_EQ(bf16_to_f32(0x4049), 3.140625f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Hash3, MatchesHandComputedValues) {
  EXPECT_EQ(hash3(0, 0, 0), 0.3011174499988556f);
  EXPECT_EQ(hash3(1, 2, 3), 0.6823646426200867f);
  EXPECT_EQ(hash3(7, 11, 123456789), 0.7768926024436951f);
  EXPECT_EQ(hash3(4294967295u, 5, 17), 0.8956308364868164f);
}

class DropoutRate : public ::testing::TestWithParam<float> {};

TEST_P(DropoutRate, KeepRateWithinFourSigma) {
  const float p = GetParam();
  const int n = 200000;
  int kept = 0;
  for (int i = 0; i < n; ++i)
    kept += dropout_keep(p, 1234u, std::uint32_t(i % 7), std::uint32_t(i / 997), std::uint32_t(i % 997));
  const double sigma = std::sqrt(n * p * (1 - p));
  EXPECT_NEAR(kept, n * (1 - p), 4 * sigma);
}
INSTANTIATE_TEST_SUITE_P(Probabilities, DropoutRate, ::testing::Values(0.1f, 0.25f, 0.5f, 0.9f));

TEST(Dropout, DecisionsDependOnSeedAndReproduce) {
  int same = 0, n = 10000;
  for (int j = 0; j < n; ++j) {
    const bool a = dropout_keep(0.5f, 1u, 3, 4, std::uint32_t(j));
    EXPECT_EQ(a, dropout_keep(0.5f, 1u, 3, 4, std::uint32_t(j)));
    same += a == dropout_keep(0.5f, 2u, 3, 4, std::uint32_t(j));
  }
  EXPECT_NEAR(same, n / 2, 4 * std::sqrt(n / 4.0));  // independent decisions under another seed
  EXPECT_TRUE(dropout_keep(0.0f, 9u, 1, 2, 3));
}

}  // namespace
}  // namespace flashtq::core

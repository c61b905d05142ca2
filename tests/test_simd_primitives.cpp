// The cpu backend's SIMD primitives (src/cpu/kernels.cpp) against scalar twins, on every Highway
// target compiled in that this machine runs (each forced in turn), on fresh random inputs with
// lengths that leave vector remainders.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/half.hpp"
#include "cpu/kernels.hpp"
#include "hwy/targets.h"
#include "seeded.hpp"

namespace flashtq {
namespace {

std::vector<float> normal(std::mt19937_64& rng, std::size_t n) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& e : x) e = dist(rng);
  return x;
}

// Relative error of got against a double twin.
double relative(const std::vector<double>& want, const std::vector<float>& got) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// Runs `check` once per compiled-in target this CPU supports, with dispatch forced to it.
template <typename F>
void on_every_target(F&& check) {
  const std::vector<std::int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  for (std::int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    ASSERT_EQ(std::string(cpu::simd_target()), hwy::TargetName(target)) << "dispatch did not follow the forced target";
    check();
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(SimdPrimitives, GemmEqualsTripleLoop) {
  std::mt19937_64 rng = test_rng();
  on_every_target([&] {
    for (const bool accumulate : {false, true}) {
      const std::size_t M = 1 + rng() % 37, N = 1 + rng() % 45, K = 1 + rng() % 70;
      const std::vector<float> A = normal(rng, M * K), B = normal(rng, K * N), C0 = normal(rng, M * N);
      std::vector<float> C = C0;
      cpu::gemm(A.data(), K, B.data(), N, C.data(), N, M, N, K, accumulate);
      std::vector<double> want(M * N);
      for (std::size_t i = 0; i < M; ++i)
        for (std::size_t j = 0; j < N; ++j) {
          double s = accumulate ? C0[i * N + j] : 0.0;
          for (std::size_t k = 0; k < K; ++k) s += double(A[i * K + k]) * B[k * N + j];
          want[i * N + j] = s;
        }
      EXPECT_LT(relative(want, C), 1e-6) << M << "x" << N << "x" << K << " accumulate " << accumulate;
    }
  });
}

TEST(SimdPrimitives, ScoreRowsEqualsDotProductsInEveryDtype) {
  std::mt19937_64 rng = test_rng();
  on_every_target([&] {
    for (int dtype = 0; dtype < 3; ++dtype) {
      const std::size_t rows = 1 + rng() % 4, n = 1 + rng() % 50, dim = 1 + rng() % 130;
      const std::vector<float> Q = normal(rng, rows * dim), K = normal(rng, n * dim);
      std::vector<std::uint16_t> K16(K.size());
      std::vector<float> Kf(K.size());  // the keys as the kernel sees them, widened exactly
      for (std::size_t i = 0; i < K.size(); ++i) {
        K16[i] = dtype == 1 ? core::f32_to_f16(K[i]) : core::f32_to_bf16(K[i]);
        Kf[i] = dtype == 0 ? K[i] : dtype == 1 ? core::f16_to_f32(K16[i]) : core::bf16_to_f32(K16[i]);
      }
      const void* keys = dtype == 0 ? static_cast<const void*>(K.data()) : K16.data();
      const std::size_t lds = n + 3;
      std::vector<float> S(rows * lds, std::numeric_limits<float>::quiet_NaN());
      cpu::score_rows(Q.data(), dim, rows, keys, dim * (dtype == 0 ? 4 : 2), dtype, n, dim, S.data(), lds);
      std::vector<double> want;
      std::vector<float> got;
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t j = 0; j < n; ++j) {
          double s = 0;
          for (std::size_t d = 0; d < dim; ++d) s += double(Q[r * dim + d]) * Kf[j * dim + d];
          want.push_back(s);
          got.push_back(S[r * lds + j]);
        }
      EXPECT_LT(relative(want, got), 1e-6) << "dtype " << dtype << " rows " << rows << " n " << n << " dim " << dim;
    }
  });
}

TEST(SimdPrimitives, ExpShiftSumMaxOfScaleLoadRow) {
  std::mt19937_64 rng = test_rng();
  on_every_target([&] {
    const std::size_t n = 1 + rng() % 200;
    std::vector<float> x = normal(rng, n);
    x[rng() % n] = -std::numeric_limits<float>::infinity();  // exp(-inf - shift) must be 0
    const std::vector<float> x0 = x;
    float mx = -std::numeric_limits<float>::infinity();
    for (float e : x0) mx = std::max(mx, e);
    EXPECT_EQ(cpu::max_of(x.data(), n), mx);
    EXPECT_EQ(cpu::max_of(x.data(), 0), -std::numeric_limits<float>::infinity());
    const float shift = 0.37f;
    const float sum = cpu::exp_shift_sum(x.data(), n, shift);
    std::vector<double> want(n);
    double want_sum = 0;
    for (std::size_t i = 0; i < n; ++i) want_sum += want[i] = std::exp(double(x0[i]) - shift);
    EXPECT_LT(relative(want, x), 1e-6);
    EXPECT_NEAR(sum, want_sum, 1e-5 * want_sum);
    std::vector<float> y = x0;
    cpu::scale(y.data(), n, 1.75f);
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(y[i], x0[i] * 1.75f) << i;
    for (int dtype = 0; dtype < 3; ++dtype) {
      std::vector<std::uint16_t> h(n);
      for (std::size_t i = 0; i < n; ++i) h[i] = dtype == 1 ? core::f32_to_f16(x0[i]) : core::f32_to_bf16(x0[i]);
      std::vector<float> row(n, std::numeric_limits<float>::quiet_NaN());
      cpu::load_row(dtype == 0 ? static_cast<const void*>(x0.data()) : h.data(), dtype, row.data(), n, 0.5f);
      for (std::size_t i = 0; i < n; ++i) {
        const float w = dtype == 0 ? x0[i] : dtype == 1 ? core::f16_to_f32(h[i]) : core::bf16_to_f32(h[i]);
        ASSERT_EQ(row[i], w * 0.5f) << "dtype " << dtype << " element " << i;
      }
    }
  });
}

}  // namespace
}  // namespace flashtq

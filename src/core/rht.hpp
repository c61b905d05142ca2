// Fast Walsh–Hadamard transform (Sylvester, natural order) and the randomized Hadamard transform
// RHT_s(x) = H diag(s) x / sqrt(D), inverse diag(s) H y / sqrt(D). D is a power of two.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

#include "core/signs.hpp"

namespace flashtq::core {

template <typename T>
void fwht(T* x, std::int64_t n) {
  for (std::int64_t len = 1; len < n; len <<= 1) {
    for (std::int64_t i = 0; i < n; i += 2 * len) {
      for (std::int64_t j = i; j < i + len; ++j) {
        const T a = x[j], b = x[j + len];
        x[j] = a + b;
        x[j + len] = a - b;
      }
    }
  }
}

// `first`: the signs of coordinates [first, first + n), for a part of a vector (outlier channels).
template <typename T>
void rht(T* x, std::int64_t n, const std::array<std::uint32_t, 8>& signs, std::int64_t first = 0) {
  for (std::int64_t d = 0; d < n; ++d) x[d] *= T(sign_of(signs, first + d));
  fwht(x, n);
  const T inv = T(1.0 / std::sqrt(double(n)));
  for (std::int64_t d = 0; d < n; ++d) x[d] *= inv;
}

template <typename T>
void inverse_rht(T* x, std::int64_t n, const std::array<std::uint32_t, 8>& signs, std::int64_t first = 0) {
  fwht(x, n);
  const T inv = T(1.0 / std::sqrt(double(n)));
  for (std::int64_t d = 0; d < n; ++d) x[d] *= inv * T(sign_of(signs, first + d));
}

}  // namespace flashtq::core

// Helpers of the TurboQuant oracle tests: rows decoded from packed words by the documented formula
// (docs/turboquant_layout.md), a relative error, and a check that a call fails naming its argument.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/codebook.hpp"
#include "core/half.hpp"
#include "core/packing.hpp"
#include "core/rht.hpp"
#include "flashtq/flashtq.hpp"

namespace flashtq::testing_tq {

// Half `which` (0 low, 1 high) of a norm word, as f16.
inline double half_value(std::uint32_t word, int which) {
  return double(core::f16_to_f32(std::uint16_t(word >> (16 * which))));
}

// Row t of kv head h decoded from MSE-only words with one part (keys without outlier channels, or values):
// n * RHT^-1(c[idx]).
inline std::vector<double> decode(const TqLayout& l, const TqTables& t, const std::vector<std::uint32_t>& words,
                                  bool keys, std::int64_t h, std::int64_t time) {
  const std::int64_t D = l.head_dim, slot = h * l.capacity + time;
  const int bits = keys ? l.key_bits : l.value_bits;
  const core::Codebook& cb = core::codebook(D, bits);
  const std::uint32_t* codes = words.data() + slot * (keys ? l.key_code_words() : l.value_code_words());
  const double n = half_value(words[std::size_t((keys ? l.key_norm_offset() : l.value_norm_offset()) + slot)], 0);
  std::vector<double> x(static_cast<std::size_t>(D));
  for (std::int64_t d = 0; d < D; ++d) x[std::size_t(d)] = n * cb.centroids[core::get_code(codes, d, bits)];
  core::inverse_rht(x.data(), D, t.polar_sign_bits);
  return x;
}

// Relative error of got against want (norms over all elements).
inline double relative_error(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

// A view of rows [start, start + n) of x [1, T, H, D] (f32, contiguous).
inline TensorView rows_of(const TensorView& x, std::int64_t start, std::int64_t n) {
  TensorView v = x;
  v.shape[1] = n;
  v.data = static_cast<float*>(x.data) + start * v.shape[2] * v.shape[3];
  return v;
}

// Random chunk lengths in [1, longest] that add up to T (contiguous appends, as a serving loop's steps make them).
inline std::vector<std::int64_t> chunks(std::int64_t T, std::mt19937_64& rng, std::int64_t longest = 40) {
  std::uniform_int_distribution<std::int64_t> len(1, longest);
  std::vector<std::int64_t> out;
  for (std::int64_t done = 0; done < T;) out.push_back(std::min(len(rng), T - done)), done += out.back();
  return out;
}

// f() must throw a flashtq::Error naming `argument` whose message contains rule_part.
template <typename F>
void expect_error(F&& f, const std::string& argument, const std::string& rule_part) {
  try {
    f();
    ADD_FAILURE() << "no error (expected one naming '" << argument << "')";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
    EXPECT_NE(std::string(e.what()).find(rule_part), std::string::npos) << e.what();
  }
}

}  // namespace flashtq::testing_tq

// Merging split-K partials by their LSEs (flash-decoding), shared by the cpu backend's dense and
// TurboQuant attention.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace flashtq::cpu {

struct Partial {
  float m;           // running maximum of the split's scores (-inf: saw nothing)
  float l;           // sum of exp(score - m)
  const float* acc;  // unnormalised output rows, D values
};

// acc_out = sum_s acc_s exp(m_s - M) (unnormalised) and returns {M, L}; partial(s) gives split s.
template <typename PartialOf>
std::pair<float, float> merge_partials(std::int64_t splits, std::int64_t D, PartialOf partial, float* acc_out) {
  float M = -std::numeric_limits<float>::infinity();
  for (std::int64_t s = 0; s < splits; ++s) M = std::max(M, partial(s).m);
  float L = 0.0f;
  std::fill(acc_out, acc_out + D, 0.0f);
  // A split that could not finish its scores in f32 marks its sum NaN; the merged row keeps the mark.
  for (std::int64_t s = 0; s < splits; ++s)
    if (std::isnan(partial(s).l)) return {M, std::numeric_limits<float>::quiet_NaN()};
  for (std::int64_t s = 0; s < splits && M != -std::numeric_limits<float>::infinity(); ++s) {
    const Partial w = partial(s);
    if (w.l == 0.0f) continue;
    const float f = std::exp(w.m - M);
    L += w.l * f;
    for (std::int64_t d = 0; d < D; ++d) acc_out[d] += w.acc[d] * f;
  }
  return {M, L};
}

// A sink logit (docs/spec.md §1.9; -inf = none) joined to a merged row {M, L} and its unnormalised acc:
// one more partial, with no value. A row that saw nothing (L = 0) gets {sink, 1} and keeps acc = 0.
inline std::pair<float, float> join_sink(float sink, std::pair<float, float> row, std::int64_t D, float* acc) {
  const auto [M, L] = row;
  if (sink == -std::numeric_limits<float>::infinity() || std::isnan(L)) return row;
  if (L == 0.0f) return {sink, 1.0f};
  const float top = std::max(M, sink), keep = std::exp(M - top);
  if (keep != 1.0f)
    for (std::int64_t d = 0; d < D; ++d) acc[d] *= keep;
  return {top, L * keep + std::exp(sink - top)};
}

}  // namespace flashtq::cpu

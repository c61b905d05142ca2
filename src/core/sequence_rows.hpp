// Rows of one sequence in a packed [1, T, heads, D] view, for the host paths that run a batch as one call
// per sequence (core/varlen.cpp, core/paged.cpp).
#pragma once

#include <cstdint>
#include <limits>

#include "core/elements.hpp"
#include "flashtq/attention.hpp"

namespace flashtq::core {

// Rows [first, first + n) of dimension 1 of a view (the data pointer moved, the shape cut).
inline TensorView rows_of(const TensorView& t, std::int64_t first, std::int64_t n) {
  TensorView s = t;
  s.data = static_cast<char*>(t.data) + first * t.strides[1] * std::int64_t(dtype_size(t.dtype));
  s.shape[1] = n;
  return s;
}

// Batch b of a [B, S, heads, D] view as a [1, S, heads, D] one.
inline TensorView batch_of(const TensorView& t, std::int64_t b) {
  TensorView s = t;
  s.data = static_cast<char*>(t.data) + b * t.strides[0] * std::int64_t(dtype_size(t.dtype));
  s.shape[0] = 1;
  return s;
}

inline void zero_rows(const TensorView& t, std::int64_t b, std::int64_t first, std::int64_t n) {
  for (std::int64_t s = first; s < first + n; ++s)
    for (std::int64_t h = 0; h < t.shape[2]; ++h)
      for (std::int64_t d = 0; d < t.shape[3]; ++d) store(t.data, t.dtype, offset(t, b, s, h) + d, 0.0f);
}

// Rows [first, first + n) of batch b that see no key (their sequence has none): out = 0 and, where lse is
// given (head h's rows at lse + h * lse_head_stride), lse = the head's sink or -inf (docs/spec.md §1, §1.9).
inline void write_rows_without_keys(const TensorView& out, std::int64_t b, std::int64_t first, std::int64_t n,
                                    const AttentionParams& params, float* lse, std::int64_t lse_head_stride) {
  zero_rows(out, b, first, n);
  for (std::int64_t h = 0; h < out.shape[2] && lse != nullptr; ++h)
    for (std::int64_t i = 0; i < n; ++i)
      lse[h * lse_head_stride + i] =
          params.sinks != nullptr ? params.sinks[h] : -std::numeric_limits<float>::infinity();
}

}  // namespace flashtq::core

// Which keys a query row sees (docs/spec.md §1), in one place for every host backend.
#pragma once

#include <cstdint>

#include "core/hd.hpp"

#include "flashtq/problem.hpp"

namespace flashtq::core {

// Scores at or below this count as masked, exactly like an invisible key.
inline constexpr double masked_score = -1e30;

FLASHTQ_HD bool key_visible(const DenseProblem& p, std::int64_t i, std::int64_t j) {
  const std::int64_t pos = i + p.causal_offset;
  if (j < 0 || j >= p.Sk) return false;
  if (p.causal && j > pos) return false;
  if (p.window > 0 && (pos > j ? pos - j : j - pos) >= p.window) return false;
  return true;
}

// The half-open key range [begin, end) that can be visible to rows [i0, i1); empty when begin >= end.
struct KeyRange {
  std::int64_t begin, end;
};
FLASHTQ_HD KeyRange key_range(const DenseProblem& p, std::int64_t i0, std::int64_t i1) {
  const std::int64_t first = i0 + p.causal_offset, last = i1 - 1 + p.causal_offset;
  std::int64_t begin = 0, end = p.Sk;
  if (p.causal && last + 1 < end) end = last + 1;
  if (p.window > 0) {
    if (first - p.window + 1 > begin) begin = first - p.window + 1;
    if (!p.causal && last + p.window < end) end = last + p.window;
  }
  return {begin, end > begin ? end : begin};
}

// The half-open query row range [begin, end) that can see any key of [j0, j1); empty when begin >= end.
FLASHTQ_HD KeyRange row_range(const DenseProblem& p, std::int64_t j0, std::int64_t j1) {
  std::int64_t begin = 0, end = p.Sq;
  if (p.causal && j0 - p.causal_offset > begin) begin = j0 - p.causal_offset;  // i + offset >= j
  if (p.window > 0) {                                                          // |i + offset - j| < window
    if (j0 - p.causal_offset - p.window + 1 > begin) begin = j0 - p.causal_offset - p.window + 1;
    if (j1 - 1 - p.causal_offset + p.window < end) end = j1 - 1 - p.causal_offset + p.window;
  }
  return {begin, end > begin ? end : begin};
}

// Whether every key of [j0, j1) is visible to every row of [i0, i1): the visible set is convex
// (half-planes and a band), so the four corners decide. Used to skip per-element checks on interior tiles.
FLASHTQ_HD bool tile_fully_visible(const DenseProblem& p, std::int64_t i0, std::int64_t i1, std::int64_t j0,
                                   std::int64_t j1) {
  return key_visible(p, i0, j0) && key_visible(p, i0, j1 - 1) && key_visible(p, i1 - 1, j0) &&
         key_visible(p, i1 - 1, j1 - 1);
}

}  // namespace flashtq::core

// The tile-range helpers the tiled kernels skip work by (src/core/visibility.hpp), against the
// per-element rule itself on random problems: key_range must hold every key some row of a block
// sees, row_range every row that sees some key of a block, tile_fully_visible only tiles whose
// every element is visible.
#include <gtest/gtest.h>

#include <random>

#include "core/visibility.hpp"
#include "seeded.hpp"

namespace flashtq {
namespace {

DenseProblem random_problem(std::mt19937_64& rng) {
  auto range = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  DenseProblem p;
  p.Sq = range(1, 90);
  p.Sk = range(1, 90);
  p.causal = range(0, 1) == 1;
  p.causal_offset = range(-100, 100);
  p.window = range(0, 2) == 0 ? range(1, 40) : 0;
  return p;
}

TEST(Visibility, RangesHoldEveryVisiblePairAndFullTilesAreFull) {
  std::mt19937_64 rng = test_rng();
  for (int trial = 0; trial < 400; ++trial) {
    const DenseProblem p = random_problem(rng);
    auto range = [&](std::int64_t lo, std::int64_t hi) {
      return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
    };
    const std::int64_t i0 = range(0, p.Sq - 1), i1 = range(i0 + 1, p.Sq);
    const std::int64_t j0 = range(0, p.Sk - 1), j1 = range(j0 + 1, p.Sk);
    const core::KeyRange keys = core::key_range(p, i0, i1), rows = core::row_range(p, j0, j1);
    bool all_visible = true;
    for (std::int64_t i = 0; i < p.Sq; ++i) {
      for (std::int64_t j = 0; j < p.Sk; ++j) {
        if (!core::key_visible(p, i, j)) {
          if (i >= i0 && i < i1 && j >= j0 && j < j1) all_visible = false;
          continue;
        }
        if (i >= i0 && i < i1) {
          EXPECT_TRUE(j >= keys.begin && j < keys.end) << "key " << j << " of row " << i;
        }
        if (j >= j0 && j < j1) {
          EXPECT_TRUE(i >= rows.begin && i < rows.end) << "row " << i << " of key " << j;
        }
      }
    }
    if (core::tile_fully_visible(p, i0, i1, j0, j1)) {
      EXPECT_TRUE(all_visible) << "rows " << i0 << ".." << i1 << " keys " << j0 << ".." << j1;
    }
    // A non-empty range stays inside the tensor (the kernels derive tile counts from it).
    if (rows.begin < rows.end) {
      EXPECT_GE(rows.begin, 0);
      EXPECT_LE(rows.end, p.Sq);
    }
    if (keys.begin < keys.end) {
      EXPECT_GE(keys.begin, 0);
      EXPECT_LE(keys.end, p.Sk);
    }
  }
}

}  // namespace
}  // namespace flashtq

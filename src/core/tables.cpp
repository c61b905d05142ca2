// make_tq_tables: the per-layer constants (signs, codebooks in f32) every backend receives.
#include <algorithm>
#include <string>

#include "core/codebook.hpp"
#include "core/entry_guard.hpp"
#include "core/signs.hpp"
#include "core/validate.hpp"
#include "flashtq/error.hpp"
#include "flashtq/turboquant.hpp"

namespace flashtq {

namespace {
TqCodebook exact_codebook(const core::Codebook& cb) {
  TqCodebook t;
  t.levels = int(cb.centroids.size());
  std::copy(cb.centroids.begin(), cb.centroids.end(), t.centroids.begin());
  std::copy(cb.boundaries.begin(), cb.boundaries.end(), t.boundaries.begin());
  return t;
}
}  // namespace

TqTables make_tq_tables(const TqLayout& layout, std::uint64_t seed, std::int64_t layer) try {
  core::validate_tq_layout(layout);
  if (layer < 0) throw Error("layer", "must be >= 0");
  TqTables t;
  t.layout = layout;
  t.polar_sign_bits = core::sign_bits(seed, layer, 0);
  t.jl_sign_bits = core::sign_bits(seed, layer, 1);
  t.key_codebook = exact_codebook(core::codebook(layout.head_dim, layout.key_bits));
  t.value_codebook = exact_codebook(core::codebook(layout.head_dim, layout.value_bits));
  for (int i = 0; i < t.key_codebook.levels; ++i)
    t.key_centroids[std::size_t(i)] = float(t.key_codebook.centroids[std::size_t(i)]);
  for (int i = 0; i < t.value_codebook.levels; ++i)
    t.value_centroids[std::size_t(i)] = float(t.value_codebook.centroids[std::size_t(i)]);
  if (layout.key_outliers) {
    t.outlier_codebook = exact_codebook(core::codebook(layout.head_dim, layout.key_outlier_bits));
    for (int i = 0; i < t.outlier_codebook.levels; ++i)
      t.outlier_centroids[std::size_t(i)] = float(t.outlier_codebook.centroids[std::size_t(i)]);
  }
  return t;
} catch (...) {
  core::rethrow_as_error("layout");
}

}  // namespace flashtq

// make_tq_tables: the per-layer constants (signs, codebooks in f32) every backend receives.
#include <string>

#include "core/codebook.hpp"
#include "core/signs.hpp"
#include "core/validate.hpp"
#include "flashtq/error.hpp"
#include "flashtq/turboquant.hpp"

namespace flashtq {

TqTables make_tq_tables(const TqLayout& layout, std::uint64_t seed, std::int64_t layer) {
  core::validate_tq_layout(layout);
  if (layer < 0) throw Error("layer", "must be >= 0");
  TqTables t;
  t.head_dim = layout.head_dim;
  t.key_bits = layout.key_bits;
  t.value_bits = layout.value_bits;
  t.polar_sign_bits = core::sign_bits(seed, layer, 0);
  t.jl_sign_bits = core::sign_bits(seed, layer, 1);
  const core::Codebook& kc = core::codebook(layout.head_dim, layout.key_bits);
  const core::Codebook& vc = core::codebook(layout.head_dim, layout.value_bits);
  for (std::size_t i = 0; i < kc.centroids.size(); ++i) t.key_centroids[i] = float(kc.centroids[i]);
  for (std::size_t i = 0; i < kc.boundaries.size(); ++i) t.key_boundaries[i] = float(kc.boundaries[i]);
  for (std::size_t i = 0; i < vc.centroids.size(); ++i) t.value_centroids[i] = float(vc.centroids[i]);
  for (std::size_t i = 0; i < vc.boundaries.size(); ++i) t.value_boundaries[i] = float(vc.boundaries[i]);
  return t;
}

}  // namespace flashtq

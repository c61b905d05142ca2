// TurboQuant stores every row's norm in f16 (docs/turboquant_layout.md): the rule that each encoded row
// must meet, which the validator checks before any word of a cache is written (docs/spec.md §4).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "flashtq/backend.hpp"

namespace flashtq::core {

// f16's largest finite value. A norm word above it would round to 65504 up to 65520, but the rule is
// 65504 so that backends whose arithmetic differs from the oracle's in the last bits (cuda's sums in
// another order, webgpu's double-float) never cross into an f16 inf for a row the rule accepted.
inline constexpr double kF16Max = 65504.0;

// With block means a residual (a row minus its block's mean of bf16 rows) is at most this many times
// the block's longest row.
inline constexpr double kBlockResidualGrowth = 2.02;

// What a row's norm word would hold, computed as the oracle's encoder computes it (encode_row).
struct RowNorm {
  double norm = 0;    // |x|: NaN or inf for a row that holds one
  double stored = 0;  // norm, or norm / |c[idx]| with norm correction; 0 for a zero row
};
// order: a key's channel order, for keys with outlier channels (whose norm word holds one half per part).
RowNorm row_norm(const std::vector<double>& row, const TqTables& tables, bool keys,
                 const std::int32_t* order = nullptr);
bool norm_fits(const RowNorm& r);
// Rows of at most this norm fit whatever their codes: 65504 without norm correction, else 65504 times
// the shortest decoded unit vector the codebook can give (sqrt(head_dim) times its smallest |centroid|),
// a little less for rounding; with outlier channels, for the smallest part. Only rows above it need
// their codes to be decided.
double norm_always_fits(const TqTables& tables, bool keys);

// The first row of the call's x (timestep-major, then kv head) that does not fit; x in host memory. Keys with
// outlier channels need their masks (n_kv_heads * head_dim / 32 words): `masks`, or the call's cache's own.
std::optional<TqRowNorm> first_unstorable_row(const TqEncodeCall& call, const std::uint32_t* masks = nullptr);
// The rule a row broke, for the Error naming the view.
std::string unstorable_rule(const TqRowNorm& row, const TqEncodeCall& call);

}  // namespace flashtq::core

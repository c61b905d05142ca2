#include "core/tq_norm_rule.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/elements.hpp"
#include "core/tq_outliers.hpp"
#include "core/tq_rows.hpp"

namespace flashtq::core {
namespace {

// The same sum, in the same order, as encode_row's norm: the decision is the encoder's own.
double length(const std::vector<double>& x) {
  double s = 0;
  for (double e : x) s += e * e;
  return std::sqrt(s);
}

std::string number(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.9g", x);
  return text;
}

}  // namespace

RowNorm row_norm(const std::vector<double>& row, const TqTables& tables, bool keys, const std::int32_t* order) {
  RowNorm r;
  r.norm = length(row);
  if (!std::isfinite(r.norm)) {
    r.stored = r.norm;
  } else if (r.norm < kZeroNorm) {
    r.stored = 0;  // a zero row: every word of its slot is 0
  } else if (!tables.layout.norm_correction && !(keys && tables.layout.key_outliers)) {
    r.stored = r.norm;
  } else {
    r.stored = encode_row(row, tables, keys, order).stored_norm;  // n / |c[idx]|, or the parts' halves
  }
  return r;
}

bool norm_fits(const RowNorm& r) { return std::isfinite(r.norm) && r.stored <= kF16Max; }

double norm_always_fits(const TqTables& tables, bool keys) {
  const TqLayout& l = tables.layout;
  const bool parts = keys && l.key_outliers;
  if (!l.norm_correction && !parts) return kF16Max;
  // A part of size n holds at most |x| / sqrt(n / D) without norm correction (the outlier part is the
  // smallest), and at most |x| / (sqrt(n) * smallest |centroid|) with it.
  const double n = double(parts ? l.key_outliers : l.head_dim);
  if (!l.norm_correction) return kF16Max * std::sqrt(n / double(l.head_dim)) * (1 - 1e-9);
  const TqCodebook& cb = keys ? tables.key_codebook : tables.value_codebook;
  double smallest = std::abs(cb.centroids[0]);
  for (int i = 1; i < cb.levels; ++i) smallest = std::min(smallest, std::abs(cb.centroids[std::size_t(i)]));
  if (parts)
    for (int i = 0; i < tables.outlier_codebook.levels; ++i)
      smallest = std::min(smallest, std::abs(tables.outlier_codebook.centroids[std::size_t(i)]));
  return kF16Max * std::sqrt(n) * smallest * (1 - 1e-9);
}

std::optional<TqRowNorm> first_unstorable_row(const TqEncodeCall& c, const std::uint32_t* masks) {
  const TqLayout& l = c.layout();
  if (masks == nullptr && c.keys && l.key_outliers) masks = c.cache + l.key_mask_offset();
  const double always = norm_always_fits(c.tables, c.keys);
  // With block means the codes hold a row minus its block's mean, whose length is at most twice the
  // longest row of the block (bf16 copies a little more): a sure bound, decided before any block is complete.
  const bool blocks = l.mean_block(c.keys) > 0;
  std::vector<double> row(static_cast<std::size_t>(l.head_dim));
  std::vector<std::int32_t> order(static_cast<std::size_t>(l.head_dim));
  for (std::int64_t t = 0; t < c.tokens(); ++t) {
    for (std::int64_t h = 0; h < l.n_kv_heads; ++h) {
      const std::int64_t base = offset(c.x, 0, t, h);
      for (std::size_t d = 0; d < row.size(); ++d) row[d] = load(c.x.data, c.x.dtype, base + std::int64_t(d));
      if (blocks) {
        if (!(length(row) <= always / kBlockResidualGrowth)) return TqRowNorm{t, h, length(row), length(row)};
        continue;
      }
      if (length(row) <= always) continue;  // the common case: no codes needed
      if (c.keys && l.key_outliers) key_channel_order(l, masks + h * (l.head_dim / 32), order.data());
      const RowNorm r = row_norm(row, c.tables, c.keys, order.data());
      if (!norm_fits(r)) return TqRowNorm{t, h, r.norm, r.stored};
    }
  }
  return std::nullopt;
}

std::string unstorable_rule(const TqRowNorm& r, const TqEncodeCall& c) {
  std::string what = "row (0, " + std::to_string(r.timestep) + ", " + std::to_string(r.kv_head) +
                     ") [batch, timestep, kv head] (cache timestep " + std::to_string(c.start_pos + r.timestep) + ") ";
  if (!std::isfinite(r.norm)) {
    what += "holds a NaN or an infinity (norm " + number(r.norm) + ")";
  } else if (c.layout().mean_block(c.keys)) {
    return what + "has norm " + number(r.norm) + "; with block means a row's norm must be at most " +
           number(norm_always_fits(c.tables, c.keys) / kBlockResidualGrowth) +
           " (65504, or what norm correction and outlier parts leave of it, divided by " +
           number(kBlockResidualGrowth) + "), so that a row minus its block's mean has an f16 norm word";
  } else if (c.keys && c.layout().key_outliers) {
    what += "has norm " + number(r.norm) + " and, with outlier channels, a part whose norm half holds " +
            number(r.stored) + " (its norm / sqrt(part size / head_dim), or / |c[idx]| with norm correction)";
  } else if (c.layout().norm_correction) {
    what += "has norm " + number(r.norm) +
            " and, with norm correction, a norm word of norm / |c[idx]| = " + number(r.stored);
  } else {
    what += "has norm " + number(r.norm);
  }
  return what + "; TurboQuant stores norms in f16: every row's norm must be finite and its norm word (the norm, " +
         "divided by the decoded unit vector's length with norm correction) at most 65504";
}

}  // namespace flashtq::core

#include "core/tq_rows.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/codebook.hpp"
#include "core/dense_row.hpp"
#include "core/elements.hpp"
#include "core/half.hpp"
#include "core/packing.hpp"
#include "core/rht.hpp"
#include "core/tq_outliers.hpp"

namespace flashtq::core {
namespace {

// Reads row (t, h) of x [1, T, H, D] into doubles.
void read_row(const TensorView& x, std::int64_t t, std::int64_t h, std::vector<double>& row) {
  const std::int64_t base = offset(x, 0, t, h);
  for (std::size_t d = 0; d < row.size(); ++d) row[d] = load(x.data, x.dtype, base + std::int64_t(d));
}

double norm(const std::vector<double>& x) {
  double s = 0;
  for (double e : x) s += e * e;
  return std::sqrt(s);
}

// The f16 of a norm as a GPU computing in f32 stores it: rounded to f32, then to f16 (RNE).
std::uint32_t f16_bits(double x) { return f32_to_f16(float(x)); }
// A block mean's f16 (the sign of a sum that cancels is not one every backend's arithmetic reproduces).
std::uint32_t mean_bits(double x) { return block_mean_half(f16_bits(x)); }
double f16_value(std::uint32_t bits) { return double(f16_to_f32(std::uint16_t(bits & 0xFFFFu))); }

// The exact copy of a row: its rotated vector n * RHT(x / n) in bf16 (a zero vector is zeros).
void write_exact_row(const TqEncodeCall& c, std::int64_t h, std::int64_t row, const EncodedRow& e) {
  const TqLayout& l = c.layout();
  std::uint32_t* words = c.cache + (c.keys ? l.key_exact_offset() : l.value_exact_offset()) +
                         l.exact_row_at(c.sequence().exact_set, h, row);
  for (std::int64_t i = 0; i < l.exact_row_words(); ++i) {
    std::uint32_t word = 0;
    if (!e.rotated.empty()) {
      word = f32_to_bf16(float(e.norm * e.rotated[std::size_t(2 * i)])) |
             std::uint32_t(f32_to_bf16(float(e.norm * e.rotated[std::size_t(2 * i + 1)]))) << 16;
    }
    words[i] = word;
  }
}

// A key with outlier channels, part by part: each part of the permuted key is a TurboQuant vector
// of its own size, rotated over its slice of the signs, its coordinates scaled by sqrt(size / D) to the
// spread of head_dim's codebook (one codebook per width serves every part); the norm half holds
// n_p / sqrt(size / D), or n_p / |c[idx_p]| with norm correction, so that half * c[idx] decodes it.
EncodedRow encode_key_parts(const std::vector<double>& x, const TqTables& t, const std::int32_t* order) {
  const TqLayout& l = t.layout;
  const std::int64_t D = l.head_dim;
  EncodedRow e;
  e.norm = norm(x);
  if (e.norm < kZeroNorm) return e;  // a zero vector: every word of its slot is 0
  e.rotated.assign(std::size_t(D), 0.0);
  e.codes.assign(std::size_t(D), 0);
  e.part_norms.assign(std::size_t(l.key_parts()), 0.0);
  std::vector<double> part;
  for (int p = 0; p < l.key_parts(); ++p) {
    const TqLayout::KeyPart kp = l.key_part(p);
    const TqCodebook& cb = p == 0 ? t.outlier_codebook : t.key_codebook;
    part.resize(std::size_t(kp.size));
    for (std::int32_t i = 0; i < kp.size; ++i) part[std::size_t(i)] = x[std::size_t(order[kp.offset + i])];
    const double n = norm(part);
    if (n < kZeroNorm) continue;  // a zero part: codes and norm 0, which decode to zeros
    for (double& v : part) v /= n;
    rht(part.data(), kp.size, t.polar_sign_bits, kp.offset);
    const double spread = std::sqrt(double(kp.size) / double(D));
    double decoded2 = 0;
    for (std::int32_t i = 0; i < kp.size; ++i) {
      const std::size_t at = std::size_t(kp.offset + i);
      e.rotated[at] = part[std::size_t(i)] * (n / e.norm);
      e.codes[at] = quantize(part[std::size_t(i)] * spread, cb.boundaries.data(), cb.levels - 1);
      const double c = cb.centroids[std::size_t(e.codes[at])];
      decoded2 += c * c;
    }
    e.part_norms[std::size_t(p)] = l.norm_correction ? n / std::sqrt(decoded2) : n / spread;
  }
  e.stored_norm = *std::max_element(e.part_norms.begin(), e.part_norms.end());
  return e;
}

// A key slot's codes and norm words with outlier channels (zero-initialised words).
void put_key_parts(const TqLayout& l, const EncodedRow& e, std::uint32_t* codes, std::uint32_t* norms) {
  for (int p = 0; p < l.key_parts(); ++p) {
    const TqLayout::KeyPart kp = l.key_part(p);
    for (std::int32_t i = 0; i < kp.size; ++i)
      put_bits(codes, kp.bit_offset + std::int64_t(i) * kp.bits, kp.bits,
               std::uint32_t(e.codes[std::size_t(kp.offset + i)]));
    norms[p / 2] |= f16_bits(e.part_norms[std::size_t(p)]) << (16 * (p % 2));
  }
}

// Element d of a block mean (f16 pairs, element 2i in the low half of word i).
double mean_element(const std::uint32_t* words, std::int64_t d) { return f16_value(words[d / 2] >> (16 * (d % 2))); }

// The codes and norm words of slot `slot` for a residual r (a row minus its block's mean) in the exact
// rows' coordinates: with outlier channels the permuted key, each part already rotated, so each part
// is its slice of r, normalised and scaled to the spread of head_dim's codebook as encode_key_parts does.
void put_residual(const TqEncodeCall& c, std::int64_t slot, const std::vector<double>& r) {
  const TqLayout& l = c.layout();
  const std::int64_t D = l.head_dim;
  const bool parts = c.keys && l.key_outliers;
  const std::int64_t code_words = c.keys ? l.key_code_words() : l.value_code_words();
  const std::int64_t norm_words = c.keys ? l.key_norm_words() : 1;
  std::uint32_t* codes = c.cache + slot * code_words;
  std::uint32_t* norms = c.cache + (c.keys ? l.key_norm_offset() : l.value_norm_offset()) + slot * norm_words;
  for (std::int64_t w = 0; w < code_words; ++w) codes[w] = 0;
  for (std::int64_t w = 0; w < norm_words; ++w) norms[w] = 0;
  const int n_parts = parts ? l.key_parts() : 1;
  for (int p = 0; p < n_parts; ++p) {
    const TqLayout::KeyPart kp =
        parts ? l.key_part(p) : TqLayout::KeyPart{0, std::int32_t(D), c.keys ? l.key_bits : l.value_bits, 0};
    const TqCodebook& cb =
        parts && p == 0 ? c.tables.outlier_codebook : (c.keys ? c.tables.key_codebook : c.tables.value_codebook);
    double n2 = 0;
    for (std::int32_t i = 0; i < kp.size; ++i) n2 += r[std::size_t(kp.offset + i)] * r[std::size_t(kp.offset + i)];
    const double n = std::sqrt(n2);
    if (n < kZeroNorm) continue;  // a zero part: codes and norm 0, which decode to the mean alone
    const double spread = std::sqrt(double(kp.size) / double(D));
    double decoded2 = 0;
    for (std::int32_t i = 0; i < kp.size; ++i) {
      const int code = quantize(r[std::size_t(kp.offset + i)] / n * spread, cb.boundaries.data(), cb.levels - 1);
      put_bits(codes, kp.bit_offset + std::int64_t(i) * kp.bits, kp.bits, std::uint32_t(code));
      decoded2 += cb.centroids[std::size_t(code)] * cb.centroids[std::size_t(code)];
    }
    norms[p / 2] |= f16_bits(l.norm_correction ? n / std::sqrt(decoded2) : n / spread) << (16 * (p % 2));
  }
}

}  // namespace

double exact_element(const std::uint32_t* row_words, std::int64_t d) {
  return double(bf16_to_f32(std::uint16_t(row_words[d / 2] >> (16 * (d % 2)))));
}

EncodedRow encode_row(std::vector<double> x, const TqTables& t, bool keys, const std::int32_t* order) {
  if (keys && t.layout.key_outliers) return encode_key_parts(x, t, order);
  const std::int64_t D = std::int64_t(x.size());
  const TqCodebook& cb = keys ? t.key_codebook : t.value_codebook;
  EncodedRow e;
  e.norm = norm(x);
  if (e.norm < kZeroNorm) return e;  // a zero vector: every word of its slot is 0
  for (double& v : x) v /= e.norm;
  rht(x.data(), D, t.polar_sign_bits);
  e.rotated = x;
  e.codes.resize(x.size());
  double decoded2 = 0;
  for (std::size_t d = 0; d < x.size(); ++d) {
    e.codes[d] = quantize(x[d], cb.boundaries.data(), cb.levels - 1);
    const double c = cb.centroids[std::size_t(e.codes[d])];
    decoded2 += c * c;
    x[d] -= c;  // x becomes the residual
  }
  e.stored_norm = t.layout.norm_correction ? e.norm / std::sqrt(decoded2) : e.norm;
  if (!keys || !t.layout.qjl) return e;
  e.gamma = norm(x);
  if (e.gamma >= kZeroNorm) {
    // Only the signs of H diag(s_jl) e matter, so the 1/sqrt(D) of the RHT is irrelevant.
    rht(x.data(), D, t.jl_sign_bits);
    e.projected = x;
  }
  return e;
}

void tq_encode_rows(const TqEncodeCall& c, std::int64_t first, std::int64_t end) {
  const TqLayout& l = c.layout();
  const std::int64_t D = l.head_dim;
  const int bits = c.keys ? l.key_bits : l.value_bits;
  const std::int64_t code_words = c.keys ? l.key_code_words() : l.value_code_words();
  const std::int64_t norm_off = c.keys ? l.key_norm_offset() : l.value_norm_offset();
  const std::int64_t norm_words = c.keys ? l.key_norm_words() : 1;
  const bool parts = c.keys && l.key_outliers;
  const TqSequence seq = c.sequence();
  std::vector<double> r(static_cast<std::size_t>(D));
  std::vector<std::int32_t> order(static_cast<std::size_t>(parts ? D : 0));
  for (std::int64_t h = 0; h < l.n_kv_heads; ++h) {
    if (parts) key_channel_order(l, key_outlier_mask(l, c.cache, h), order.data());
    for (std::int64_t t = first; t < end; ++t) {
      const std::int64_t slot = h * l.capacity + seq.timestep(c.start_pos + t);
      std::uint32_t* codes = c.cache + slot * code_words;
      std::uint32_t* jl = c.cache + l.key_jl_offset() + slot * l.jl_words();
      std::uint32_t* norms = c.cache + norm_off + slot * norm_words;
      for (std::int64_t w = 0; w < code_words; ++w) codes[w] = 0;
      if (c.keys)
        for (std::int64_t w = 0; w < l.jl_words(); ++w) jl[w] = 0;
      for (std::int64_t w = 0; w < norm_words; ++w) norms[w] = 0;
      read_row(c.x, t, h, r);
      const EncodedRow e = encode_row(r, c.tables, c.keys, order.data());
      const std::int64_t exact = l.exact_row(c.start_pos + t, c.start_pos + c.tokens());
      if (exact >= 0) write_exact_row(c, h, exact, e);
      if (e.codes.empty()) continue;  // a zero vector
      if (parts) {
        put_key_parts(l, e, codes, norms);
        continue;
      }
      for (std::int64_t d = 0; d < D; ++d) put_code(codes, d, bits, std::uint32_t(e.codes[std::size_t(d)]));
      std::uint32_t word = f16_bits(e.stored_norm);
      if (c.keys && l.qjl) {
        for (std::size_t d = 0; d < e.projected.size(); ++d) {
          if (e.projected[d] >= 0) jl[d / 32] |= 1u << (d % 32);
        }
        word |= f16_bits(e.gamma) << 16;
      }
      norms[0] = word;
    }
  }
}

bool tq_encode_uses_block_means(const TqEncodeCall& c) { return c.layout().mean_block(c.keys) > 0; }

void tq_encode_head_with_means(const TqEncodeCall& c, std::int64_t h) {
  const TqLayout& l = c.layout();
  const std::int64_t D = l.head_dim, g = l.mean_block(c.keys), w = l.recent_tokens;
  const std::int64_t L = c.start_pos, T = c.tokens(), end = L + T;
  const std::int64_t exact_offset = c.keys ? l.key_exact_offset() : l.value_exact_offset();
  const bool parts = c.keys && l.key_outliers;
  const TqSequence seq = c.sequence();
  std::vector<std::int32_t> order(static_cast<std::size_t>(parts ? D : 0));
  if (parts) key_channel_order(l, key_outlier_mask(l, c.cache, h), order.data());
  // The new rows as their exact rows hold them (bf16 of n * RHT(x / n); a float holds a bf16 exactly).
  std::vector<float> fresh(static_cast<std::size_t>(T * D));
  std::vector<double> r(static_cast<std::size_t>(D)), sum(static_cast<std::size_t>(D));
  for (std::int64_t t = 0; t < T; ++t) {
    read_row(c.x, t, h, r);
    const EncodedRow e = encode_row(r, c.tables, c.keys, order.data());
    if (e.rotated.empty()) continue;  // a zero vector: zeros (fresh starts so)
    for (std::int64_t d = 0; d < D; ++d)
      fresh[std::size_t(t * D + d)] = bf16_to_f32(f32_to_bf16(float(e.norm * e.rotated[std::size_t(d)])));
  }
  // Timestep u's exact row: a new one, or one the cache holds (the sinks and the recent window before this call).
  auto source = [&](std::int64_t u, std::vector<double>& out) {
    if (u >= L) {
      for (std::int64_t d = 0; d < D; ++d) out[std::size_t(d)] = double(fresh[std::size_t((u - L) * D + d)]);
      return;
    }
    const std::uint32_t* words = c.cache + exact_offset + l.exact_row_at(seq.exact_set, h, l.exact_row(u, L));
    for (std::int64_t d = 0; d < D; ++d) out[std::size_t(d)] = exact_element(words, d);
  };
  // The timesteps that leave the recent window in this call, in order: a block's first timestep comes
  // first, and then its whole block is there (block <= recent_tokens), so its mean is written then.
  for (std::int64_t t = std::max<std::int64_t>(0, L - w); t < end - w; ++t) {
    const std::int64_t at = seq.timestep(t);  // a block never straddles pages (page_size >= block)
    std::uint32_t* mean = c.cache + (c.keys ? l.key_mean(h, at) : l.value_mean(h, at));
    if (t % g == 0) {
      std::fill(sum.begin(), sum.end(), 0.0);
      for (std::int64_t u = t; u < t + g; ++u) {
        source(u, r);
        for (std::int64_t d = 0; d < D; ++d) sum[std::size_t(d)] += r[std::size_t(d)];
      }
      for (std::int64_t i = 0; i < D / 2; ++i)
        mean[i] = mean_bits(sum[std::size_t(2 * i)] / double(g)) | mean_bits(sum[std::size_t(2 * i + 1)] / double(g))
                                                                       << 16;
    }
    source(t, r);
    for (std::int64_t d = 0; d < D; ++d) r[std::size_t(d)] -= mean_element(mean, d);
    put_residual(c, h * l.capacity + at, r);
  }
  // The new rows' exact copies, after the codes above have read the rows they replace.
  for (std::int64_t t = L; t < end; ++t) {
    const std::int64_t row = l.exact_row(t, end);
    if (row < 0) continue;
    std::uint32_t* words = c.cache + exact_offset + l.exact_row_at(seq.exact_set, h, row);
    const float* x = fresh.data() + (t - L) * D;
    for (std::int64_t i = 0; i < D / 2; ++i)
      words[i] = f32_to_bf16(x[2 * i]) | std::uint32_t(f32_to_bf16(x[2 * i + 1])) << 16;
  }
}

void tq_rotate_rows(const TqRotateCall& c, std::int64_t first, std::int64_t end) {
  const TqScratchLayout& s = c.scratch_layout;
  const TqLayout& l = c.tables.layout;
  const std::int64_t D = s.head_dim, nq = c.q.shape[1], H = s.n_heads;
  std::vector<double> x(static_cast<std::size_t>(D)), permuted(static_cast<std::size_t>(D));
  std::vector<std::int32_t> order(static_cast<std::size_t>(D));
  for (std::int64_t row = first; row < end; ++row) {
    const std::int64_t b = row / nq, j = row % nq;
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t base = offset(c.q, b, j, h);
      for (std::int64_t d = 0; d < D; ++d) x[std::size_t(d)] = load(c.q.data, c.q.dtype, base + d);
      if (l.key_outliers) {  // the key's order and parts: q_rot[i] pairs with the key's coordinate i
        key_channel_order(l, key_outlier_mask(l, c.k_cache + tq_sequence_base(l, b, true), h / (H / l.n_kv_heads)),
                          order.data());
        for (std::int64_t i = 0; i < D; ++i) permuted[std::size_t(i)] = x[std::size_t(order[std::size_t(i)])];
        for (int p = 0; p < l.key_parts(); ++p) {
          const TqLayout::KeyPart kp = l.key_part(p);
          rht(permuted.data() + kp.offset, kp.size, c.tables.polar_sign_bits, kp.offset);
        }
        float* q_rot = c.scratch + s.q_rot(row, h);
        for (std::int64_t d = 0; d < D; ++d) q_rot[d] = float(permuted[std::size_t(d)]);
        float* q_jl = c.scratch + s.q_jl(row, h);  // keys with outliers have no QJL bits
        for (std::int64_t d = 0; d < D; ++d) q_jl[d] = 0.0f;
        c.scratch[s.sum(row, h)] = 0.0f;
        continue;
      }
      rht(x.data(), D, c.tables.polar_sign_bits);
      float* q_rot = c.scratch + s.q_rot(row, h);
      for (std::int64_t d = 0; d < D; ++d) q_rot[d] = float(x[std::size_t(d)]);
      rht(x.data(), D, c.tables.jl_sign_bits);
      float* q_jl = c.scratch + s.q_jl(row, h);
      double sum = 0;
      for (std::int64_t d = 0; d < D; ++d) {
        q_jl[d] = float(x[std::size_t(d)]);
        sum += x[std::size_t(d)];
      }
      c.scratch[s.sum(row, h)] = float(sum);
    }
  }
}

double tq_key_dot(const TqTables& t, const float* q_rot, const float* q_jl, double q_jl_sum,
                  const std::uint32_t* k_cache, std::int64_t slot, double qjl_scale) {
  const TqLayout& l = t.layout;
  if (l.key_outliers) {  // part by part: each part's norm half times its codes' dot with q_rot
    const std::uint32_t* norms = k_cache + l.key_norm_offset() + slot * l.key_norm_words();
    const std::uint32_t* codes = k_cache + slot * l.key_code_words();
    double dot = 0;
    for (int p = 0; p < l.key_parts(); ++p) {
      const TqLayout::KeyPart kp = l.key_part(p);
      const TqCodebook& cb = p == 0 ? t.outlier_codebook : t.key_codebook;
      double part = 0;
      for (std::int32_t i = 0; i < kp.size; ++i)
        part += double(q_rot[kp.offset + i]) *
                cb.centroids[get_bits(codes, kp.bit_offset + std::int64_t(i) * kp.bits, kp.bits)];
      dot += f16_value(norms[p / 2] >> (16 * (p % 2))) * part;
    }
    return dot;
  }
  const std::uint32_t nw = k_cache[l.key_norm_offset() + slot];
  const double n = f16_value(nw), gamma = f16_value(nw >> 16);
  const std::uint32_t* codes = k_cache + slot * l.key_code_words();
  const std::uint32_t* jl = k_cache + l.key_jl_offset() + slot * l.jl_words();
  double polar = 0, positive = 0;
  for (std::int64_t d = 0; d < l.head_dim; ++d) {
    polar += double(q_rot[d]) * t.key_codebook.centroids[get_code(codes, d, l.key_bits)];
    if (l.qjl && ((jl[d / 32] >> (d % 32)) & 1u)) positive += double(q_jl[d]);
  }
  if (!l.qjl) return n * polar;
  return n * (polar + gamma * qjl_scale * (2.0 * positive - q_jl_sum));
}

void tq_attend_row_head(const TqAttendCall& a, std::int64_t row, std::int64_t h) {
  const TqLayout& l = a.layout();
  const TqScratchLayout& s = a.scratch_layout;
  const std::int64_t D = l.head_dim;
  const TqCodebook& vcb = a.tables.value_codebook;
  const double scale = double(a.scale), qjl_scale = double(a.qjl_scale);
  const std::int64_t b = row / a.n_queries, j = row % a.n_queries;
  const std::uint32_t* k_cache = a.keys(b);
  const std::uint32_t* v_cache = a.values(b);
  const TqSequence seq = a.sequence(b);
  const std::int64_t start = a.start_positions ? std::int64_t(a.start_positions[b]) : a.start_pos;
  // Clamped like the kernels, so a bad per-sequence start position never reads out of bounds.
  const std::int64_t seq_len = std::max<std::int64_t>(0, std::min({start + j + 1, a.max_seq, a.reach}));
  const std::int64_t first = std::min(a.first_visible(start + j), seq_len);
  const float* q_rot = a.scratch + s.q_rot(row, h);
  const float* q_jl = a.scratch + s.q_jl(row, h);
  const double q_jl_sum = a.scratch[s.sum(row, h)];
  const std::int64_t kv_head = h / a.group(), slot0 = kv_head * l.capacity;
  const std::int64_t end = a.sequence_end(start);
  // The exact copy of timestep t (keys or values), or null when attention reads its codes.
  auto exact = [&](const std::uint32_t* cache, std::int64_t offset, std::int64_t t) -> const std::uint32_t* {
    const std::int64_t row = l.exact_row(t, end);
    return row < 0 ? nullptr : cache + offset + l.exact_row_at(seq.exact_set, kv_head, row);
  };
  std::vector<double> scores(static_cast<std::size_t>(seq_len)), acc(static_cast<std::size_t>(D), 0.0);
  double m = -std::numeric_limits<double>::infinity();
  for (std::int64_t t = first; t < seq_len; ++t) {
    double dot = 0;
    if (const std::uint32_t* k = exact(k_cache, l.key_exact_offset(), t)) {
      for (std::int64_t d = 0; d < D; ++d) dot += double(q_rot[d]) * exact_element(k, d);
    } else {
      dot = tq_key_dot(a.tables, q_rot, q_jl, q_jl_sum, k_cache, slot0 + seq.timestep(t), qjl_scale);
      if (l.key_block) {  // the block's mean, which the codes do not hold
        const std::uint32_t* mean = k_cache + l.key_mean(kv_head, seq.timestep(t));
        for (std::int64_t d = 0; d < D; ++d) dot += double(q_rot[d]) * mean_element(mean, d);
      }
    }
    scores[std::size_t(t)] = softcapped(a.softcap, scale * dot);
    m = std::max(m, scores[std::size_t(t)]);
  }
  float* out = static_cast<float*>(a.out.data) + offset(a.out, b, j, h);
  if (first == seq_len) {  // nothing visible (a sink alone has no value: zeros too)
    for (std::int64_t d = 0; d < D; ++d) out[d] = 0.0f;
    return;
  }
  // Head h's sink logit joins the maximum and the sum (docs/spec.md §1.9); it has no value.
  const double sink = a.sinks != nullptr ? double(a.sinks[h]) : -std::numeric_limits<double>::infinity();
  m = std::max(m, sink);
  double sum = std::exp(sink - m);
  for (std::int64_t t = first; t < seq_len; ++t) {
    const std::int64_t slot = slot0 + seq.timestep(t);
    const double p = std::exp(scores[std::size_t(t)] - m);
    sum += p;
    if (const std::uint32_t* v = exact(v_cache, l.value_exact_offset(), t)) {
      for (std::int64_t d = 0; d < D; ++d) acc[std::size_t(d)] += p * exact_element(v, d);
      continue;
    }
    const double vn = f16_value(v_cache[l.value_norm_offset() + slot]);
    const std::uint32_t* codes = v_cache + slot * l.value_code_words();
    for (std::int64_t d = 0; d < D; ++d)
      acc[std::size_t(d)] += p * vn * vcb.centroids[get_code(codes, d, l.value_bits)];
    if (l.value_block) {
      const std::uint32_t* mean = v_cache + l.value_mean(kv_head, seq.timestep(t));
      for (std::int64_t d = 0; d < D; ++d) acc[std::size_t(d)] += p * mean_element(mean, d);
    }
  }
  for (double& e : acc) e /= sum;
  inverse_rht(acc.data(), D, a.tables.polar_sign_bits);  // back from rotated space, once
  for (std::int64_t d = 0; d < D; ++d) out[d] = float(acc[std::size_t(d)]);
}

}  // namespace flashtq::core

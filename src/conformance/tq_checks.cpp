// Conformance checks of TurboQuant encode, query rotation and attention against the oracle.
#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <functional>
#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <sstream>

#include "conformance/conformance.hpp"
#include "conformance/device_buffer.hpp"
#include "conformance/host_tensor.hpp"
#include "core/codebook.hpp"
#include "core/half.hpp"
#include "core/packing.hpp"
#include "core/rht.hpp"
#include "core/tq_outliers.hpp"
#include "core/tq_rows.hpp"

namespace flashtq::conformance {

std::string TqCase::describe() const {
  std::ostringstream s;
  s << dtype_name(dtype) << " D" << layout.head_dim << " H" << H << "/" << layout.n_kv_heads << " k" << layout.key_bits
    << (layout.qjl ? "" : "mse") << "v" << layout.value_bits << " cap" << layout.capacity << " T" << tokens << " nq"
    << n_queries << " pos" << start_pos;
  if (max_seq) s << " max_seq" << *max_seq;
  if (window) s << " win" << window;
  if (layout.exact_rows()) s << " sink" << layout.sink_tokens << " recent" << layout.recent_tokens;
  if (layout.norm_correction) s << " nc";
  if (layout.key_outliers) s << " outliers" << layout.key_outliers << "x" << layout.key_outlier_bits;
  if (layout.key_block) s << " key_block" << layout.key_block;
  if (layout.value_block) s << " value_block" << layout.value_block;
  if (exact) s << " exact";
  if (softcap > 0) s << " softcap" << softcap;
  if (sinks) s << " sinks";
  if (zero_rows) s << " zeros";
  if (batch > 1) s << " batch" << batch << (starts.empty() ? "" : " own-starts");
  s << " seed=" << seed << " data_seed=" << data_seed;
  return s.str();
}

namespace {

constexpr std::uint32_t kPoisonWord = 0xA5A5A5A5u;

// "<what> differs: <got> for the oracle's <want>", the words in hex.
std::string word_differs(const std::string& what, std::uint32_t got, std::uint32_t want) {
  std::ostringstream s;
  s << what << " differs: 0x" << std::hex << got << " for the oracle's 0x" << want;
  return s.str();
}

// Keys or values [1, tokens, Hkv, D] (of sequence `salt / 4` of a batch), some rows zero when the
// case asks for it.
HostTensor kv_rows(const TqCase& c, std::uint64_t salt) {
  HostTensor x({1, c.tokens, c.layout.n_kv_heads, c.layout.head_dim}, c.dtype, false);
  std::mt19937_64 rng(c.data_seed ^ salt);
  x.fill_normal(rng, 2.0);
  if (c.zero_rows) {
    std::vector<double> v = x.values();
    for (std::int64_t t = 0; t < c.tokens; t += 3)
      for (std::int64_t d = 0; d < c.layout.head_dim; ++d)
        v[std::size_t(t * c.layout.n_kv_heads * c.layout.head_dim + d)] = 0.0;  // head 0 of every 3rd
    x.fill(v);
  }
  return x;
}

// Timestep where a case's tokens start: the end of the cache, so the last slot is exercised.
std::int64_t encode_start(const TqCase& c) { return c.layout.capacity - c.tokens; }

// With outlier channels: sequence b's key words get a calibration of key_outliers random channels per kv head
// (its mask region), in every buffer of the case, before anything is encoded.
void put_outlier_masks(const TqCase& c, std::int64_t b, std::uint32_t* key_words) {
  const TqLayout& l = c.layout;
  if (!l.key_outliers) return;
  std::mt19937_64 rng(c.data_seed ^ (7 + 4 * std::uint64_t(b)));
  std::uint32_t* mask = key_words + l.key_mask_offset();
  for (std::int64_t w = 0; w < l.key_mask_words(); ++w) mask[w] = 0;
  for (std::int64_t h = 0; h < l.n_kv_heads; ++h) {
    std::vector<std::int32_t> channels(static_cast<std::size_t>(l.head_dim));
    for (std::int32_t i = 0; i < std::int32_t(l.head_dim); ++i) channels[std::size_t(i)] = i;
    std::shuffle(channels.begin(), channels.end(), rng);
    for (std::int32_t i = 0; i < l.key_outliers; ++i) {
      const std::int32_t ch = channels[std::size_t(i)];
      mask[h * (l.head_dim / 32) + ch / 32] |= 1u << (ch % 32);
    }
  }
}
std::vector<std::uint32_t> poisoned_keys(const TqCase& c, std::int64_t sequences) {
  std::vector<std::uint32_t> words(std::size_t(sequences * c.layout.key_words()), kPoisonWord);
  for (std::int64_t b = 0; b < sequences; ++b) put_outlier_masks(c, b, words.data() + b * c.layout.key_words());
  return words;
}

// The packed caches the oracle writes for a case, over a poisoned background.
struct OracleCache {
  std::vector<std::uint32_t> keys, values;
};
OracleCache oracle_cache(const TqCase& c, const TqTables& tables, std::int64_t sequences = 1) {
  const TqLayout& l = c.layout;
  Backend& oracle = flashtq::backend("reference");
  OracleCache o{poisoned_keys(c, sequences),
                std::vector<std::uint32_t>(std::size_t(sequences * l.value_words()), kPoisonWord)};
  for (std::int64_t b = 0; b < sequences; ++b) {
    const HostTensor k = kv_rows(c, 1 + 4 * std::uint64_t(b)), v = kv_rows(c, 2 + 4 * std::uint64_t(b));
    tq_encode_keys(oracle, {tables, k.view, encode_start(c), o.keys.data() + b * l.key_words(), nullptr});
    tq_encode_values(oracle, {tables, v.view, encode_start(c), o.values.data() + b * l.value_words(), nullptr});
  }
  return o;
}

// The parts a side is coded in: keys with outlier channels have the layout's, every other side one part.
std::vector<TqLayout::KeyPart> coded_parts(const TqLayout& l, bool keys) {
  if (!(keys && l.key_outliers)) return {{0, std::int32_t(l.head_dim), keys ? l.key_bits : l.value_bits, 0}};
  std::vector<TqLayout::KeyPart> parts;
  for (int p = 0; p < l.key_parts(); ++p) parts.push_back(l.key_part(p));
  return parts;
}

// What the oracle's quantizer compares with the boundaries (core::encode_row, core::put_residual) for a
// vector y in the coded order: each part's slice over its norm, rotated over its slice of the signs when y is
// a row of x (a residual is rotated already), times sqrt(size / D); NaN for a part the oracle does not code.
std::vector<double> quantizer_inputs(const TqLayout& l, const TqTables& tables, bool keys, std::vector<double> y,
                                     bool rotate) {
  for (const TqLayout::KeyPart& kp : coded_parts(l, keys)) {
    double* part = y.data() + kp.offset;
    double n2 = 0;
    for (std::int32_t i = 0; i < kp.size; ++i) n2 += part[i] * part[i];
    const double n = std::sqrt(n2);
    for (std::int32_t i = 0; i < kp.size; ++i)
      part[i] = n < core::kZeroNorm ? std::numeric_limits<double>::quiet_NaN() : part[i] / n;
    if (n < core::kZeroNorm) continue;
    if (rotate) core::rht(part, kp.size, tables.polar_sign_bits, kp.offset);
    const double spread = std::sqrt(double(kp.size) / double(l.head_dim));
    for (std::int32_t i = 0; i < kp.size; ++i) part[i] *= spread;
  }
  return y;
}

// The oracle's quantizer inputs (quantizer_inputs) and, for keys with QJL, the projections of the residual
// (what its sign bits keep), per slot [slot * D + i], i a coordinate of the coded vector (the permuted key
// with outlier channels); NaN where the oracle codes nothing. They tell which differing codes and bits are
// flips at a boundary, which docs/spec.md §3 allows: a coordinate that lies within rounding of a boundary,
// and the QJL bits of a slot whose code flipped that way (its residual is another vector).
// With block means the coded vectors are the residuals of the timesteps that leave the recent window, from
// their exact rows (the call's own rows, or what `before`, the words before the call, holds) minus their
// block's mean as `ref` holds it (compared with the backend's before this is needed).
struct OracleRotations {
  std::vector<double> rotated, projected;
};
OracleRotations oracle_rotations(const TqLayout& l, const TqTables& tables, const HostTensor& x, std::int64_t start,
                                 bool keys, const std::vector<std::uint32_t>& before,
                                 const std::vector<std::uint32_t>& ref) {
  const std::int64_t D = l.head_dim, T = x.view.shape[1], end = start + T, g = l.mean_block(keys);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  OracleRotations o{std::vector<double>(std::size_t(l.slots() * D), nan),
                    std::vector<double>(std::size_t(l.slots() * D), nan)};
  const std::vector<double> v = x.values();
  std::vector<std::int32_t> order(static_cast<std::size_t>(D));
  std::vector<double> coded(static_cast<std::size_t>(D));
  for (std::int64_t h = 0; h < l.n_kv_heads; ++h) {
    if (keys && l.key_outliers) core::key_channel_order(l, core::key_outlier_mask(l, before.data(), h), order.data());
    std::vector<std::vector<double>> exact(static_cast<std::size_t>(T));  // the call's rows as exact rows hold them
    for (std::int64_t t = 0; t < T; ++t) {
      const auto row = v.begin() + (t * l.n_kv_heads + h) * D;
      const core::EncodedRow e = core::encode_row(std::vector<double>(row, row + D), tables, keys, order.data());
      const std::int64_t slot = h * l.capacity + start + t;
      exact[std::size_t(t)].assign(std::size_t(D), 0.0);
      for (std::size_t d = 0; d < e.rotated.size(); ++d)
        exact[std::size_t(t)][d] = double(core::bf16_to_f32(core::f32_to_bf16(float(e.norm * e.rotated[d]))));
      std::copy(e.projected.begin(), e.projected.end(), o.projected.begin() + slot * D);
      if (g || e.rotated.empty()) continue;
      for (std::int64_t i = 0; i < D; ++i)
        coded[std::size_t(i)] = row[keys && l.key_outliers ? order[std::size_t(i)] : i];
      const std::vector<double> in = quantizer_inputs(l, tables, keys, coded, true);
      std::copy(in.begin(), in.end(), o.rotated.begin() + slot * D);
    }
    for (std::int64_t u = std::max<std::int64_t>(0, start - l.recent_tokens); g && u < end - l.recent_tokens; ++u) {
      const std::uint32_t* mean = ref.data() + (keys ? l.key_mean(h, u) : l.value_mean(h, u));
      const std::uint32_t* old = u >= start ? nullptr
                                            : before.data() + (keys ? l.key_exact_offset() : l.value_exact_offset()) +
                                                  (h * l.exact_rows() + l.exact_row(u, start)) * l.exact_row_words();
      for (std::int64_t d = 0; d < D; ++d) {
        const double r = old ? core::exact_element(old, d) : exact[std::size_t(u - start)][std::size_t(d)];
        coded[std::size_t(d)] = r - double(core::f16_to_f32(std::uint16_t(mean[d / 2] >> (16 * (d % 2)))));
      }
      const std::vector<double> in = quantizer_inputs(l, tables, keys, coded, false);
      std::copy(in.begin(), in.end(), o.rotated.begin() + (h * l.capacity + u) * D);
    }
  }
  return o;
}

// What a block mean (of `block` timesteps) over rows encoded from `x` may differ by: of the rows it averages, those
// this encode wrote (at most min(tokens, block)) are held to one bf16 unit in the last place per element (below),
// at most that of the largest row norm; the others are the same words on both sides.
double mean_allowance(const HostTensor& x, std::int64_t block) {
  if (block == 0) return 0.0;
  const std::int64_t S = x.view.shape[1], H = x.view.shape[2], D = x.view.shape[3];
  double largest = 0;
  for (std::int64_t t = 0; t < S; ++t)
    for (std::int64_t h = 0; h < H; ++h) {
      double n2 = 0;
      for (std::int64_t d = 0; d < D; ++d) {
        const double e = core::load(x.view.data, x.view.dtype, core::offset(x.view, 0, t, h) + d);
        n2 += e * e;
      }
      largest = std::max(largest, std::sqrt(n2));
    }
  if (largest == 0) return 0.0;
  return std::ldexp(1.0, std::ilogb(largest) - 7) * double(std::min(S, block)) / double(block);
}

// Whether block mean word `got` (two f16) equals the oracle's `want` within `allowance` and one f16 unit in the last
// place per element; the bits of a non-finite element (or either word's, poisoned) must match.
bool means_agree(std::uint32_t got, std::uint32_t want, double allowance) {
  if (got == want) return true;
  for (int i = 0; i < 2; ++i) {
    const float a = core::f16_to_f32(std::uint16_t(got >> (16 * i))),
                b = core::f16_to_f32(std::uint16_t(want >> (16 * i)));
    if (!std::isfinite(a) || !std::isfinite(b)) return false;
    const double unit = std::ldexp(1.0, std::max(std::ilogb(std::max(std::fabs(a), std::fabs(b))), -14) - 10);
    if (std::fabs(double(a) - double(b)) > allowance + unit) return false;
  }
  return true;
}

// Compares a backend's words with the oracle's: norm words and untouched words exactly; block means within
// `mean_allowance` (what the exact rows they average may move them by); codes and QJL bits at >= 99.9 %
// agreement, not counting flips at a boundary (see OracleRotations). Returns the fraction of codes and bits that
// differ otherwise. `rotations` is called (once) only when a code or bit differs.
double compare_words(const TqLayout& l, const std::vector<std::uint32_t>& ref, const std::vector<std::uint32_t>& got,
                     bool keys, const std::function<OracleRotations()>& rotations, double mean_allowance,
                     std::string& detail) {
  constexpr double kRounding = 1e-9;  // far above the arithmetic's error, far below the codebook's spacing
  const std::int64_t code_words = keys ? l.key_code_words() : l.value_code_words();
  const std::int64_t norm_off = keys ? l.key_norm_offset() : l.value_norm_offset();
  const std::int64_t norm_words = keys ? l.key_norm_words() : 1;
  const std::vector<TqLayout::KeyPart> parts = coded_parts(l, keys);
  auto at_boundary = [&](int bits, double x) {
    for (double b : core::codebook(l.head_dim, bits).boundaries)
      if (std::fabs(x - b) < kRounding) return true;
    return false;
  };
  std::optional<OracleRotations> rot_storage;
  auto rot = [&]() -> const OracleRotations& {
    if (!rot_storage) rot_storage = rotations();
    return *rot_storage;
  };
  std::int64_t codes = 0, differ = 0, flips = 0;
  for (std::int64_t w = l.key_mask_offset(); keys && w < l.key_words(); ++w) {
    const bool mean = w >= l.key_mean_offset() && l.key_block != 0;
    if (mean ? !means_agree(got[std::size_t(w)], ref[std::size_t(w)], mean_allowance)
             : ref[std::size_t(w)] != got[std::size_t(w)]) {
      detail = word_differs("key word " + std::to_string(w) + " (outlier masks, then block means)", got[std::size_t(w)],
                            ref[std::size_t(w)]);
      return std::numeric_limits<double>::infinity();
    }
  }
  for (std::int64_t w = l.value_mean_offset(); !keys && w < l.value_words(); ++w) {
    if (!means_agree(got[std::size_t(w)], ref[std::size_t(w)], mean_allowance)) {
      detail = word_differs("value block mean word " + std::to_string(w - l.value_mean_offset()), got[std::size_t(w)],
                            ref[std::size_t(w)]);
      return std::numeric_limits<double>::infinity();
    }
  }
  for (std::int64_t slot = 0; slot < l.slots(); ++slot) {
    for (std::int64_t w = 0; w < norm_words; ++w) {
      if (ref[std::size_t(norm_off + slot * norm_words + w)] != got[std::size_t(norm_off + slot * norm_words + w)]) {
        detail = std::string(keys ? "key" : "value") + " norm word of slot " + std::to_string(slot) + " differs";
        return std::numeric_limits<double>::infinity();
      }
    }
    const std::uint32_t* r = ref.data() + slot * code_words;
    const std::uint32_t* g = got.data() + slot * code_words;
    if (r[0] == kPoisonWord && ref[std::size_t(norm_off + slot * norm_words)] == kPoisonWord) {  // not written
      for (std::int64_t w = 0; w < code_words; ++w)
        if (g[w] != kPoisonWord) {
          detail = "slot " + std::to_string(slot) + " outside the appended timesteps was written";
          return std::numeric_limits<double>::infinity();
        }
      continue;
    }
    bool flipped = false;                        // a code of this slot flipped at a boundary
    for (const TqLayout::KeyPart& kp : parts) {  // part by part, each at its own width and codebook
      for (std::int32_t i = 0; i < kp.size; ++i) {
        const std::int64_t pos = kp.bit_offset + std::int64_t(i) * kp.bits;
        ++codes;
        if (core::get_bits(r, pos, kp.bits) == core::get_bits(g, pos, kp.bits)) continue;
        if (at_boundary(kp.bits, rot().rotated[std::size_t(slot * l.head_dim + kp.offset + i)])) {
          ++flips;
          flipped = true;
        } else {
          ++differ;
        }
      }
    }
    if (!keys || !l.qjl) continue;
    const std::uint32_t* rj = ref.data() + l.key_jl_offset() + slot * l.jl_words();
    const std::uint32_t* gj = got.data() + l.key_jl_offset() + slot * l.jl_words();
    for (std::int64_t d = 0; d < l.head_dim; ++d) {
      ++codes;
      if (((rj[d / 32] ^ gj[d / 32]) >> (d % 32)) & 1u) {
        if (flipped || std::fabs(rot().projected[std::size_t(slot * l.head_dim + d)]) < kRounding) {
          ++flips;
        } else {
          ++differ;
        }
      }
    }
  }
  // Exact rows (sink and recent timesteps): each bf16 within one unit in the last place of the oracle's
  // (it rounds n * r from double; a device computes the same value in another order or in double-float),
  // or within 1e-9 of the row's length (a coordinate that cancels to about 0 comes out as a different
  // tiny number in each arithmetic); rows the oracle left alone stay untouched.
  const std::int64_t exact_off = keys ? l.key_exact_offset() : l.value_exact_offset();
  const std::int64_t row_words = l.exact_row_words();
  auto half = [](std::uint32_t w, int i) { return std::uint16_t(w >> (16 * i)); };
  for (std::int64_t row = 0; row < l.n_kv_heads * l.exact_rows(); ++row) {
    const std::uint32_t* r = ref.data() + exact_off + row * row_words;
    const std::uint32_t* g = got.data() + exact_off + row * row_words;
    double length2 = 0;
    for (std::int64_t w = 0; w < row_words; ++w)
      for (int i = 0; i < 2 && r[w] != kPoisonWord; ++i)
        length2 += double(core::bf16_to_f32(half(r[w], i))) * double(core::bf16_to_f32(half(r[w], i)));
    for (std::int64_t w = 0; w < row_words; ++w) {
      bool ok = r[w] == kPoisonWord ? g[w] == kPoisonWord : true;
      for (int i = 0; i < 2 && r[w] != kPoisonWord; ++i) {
        const auto a = std::int32_t(std::int16_t(half(r[w], i))), b = std::int32_t(std::int16_t(half(g[w], i)));
        const double fa = core::bf16_to_f32(half(r[w], i)), fb = core::bf16_to_f32(half(g[w], i));
        const bool ulp = (a < 0) == (b < 0) && std::abs(a - b) <= 1;
        ok = ok && (ulp || std::fabs(fa - fb) <= 1e-9 * std::sqrt(length2));
      }
      if (!ok) {
        detail = std::string(keys ? "key" : "value") + " exact-region word " + std::to_string(row * row_words + w) +
                 " is " + std::to_string(g[w]) + ", the oracle's " + std::to_string(r[w]);
        return std::numeric_limits<double>::infinity();
      }
    }
  }
  const double fraction = codes ? double(differ) / double(codes) : 0.0;
  if (fraction > 1e-3) {
    detail = std::to_string(differ) + " of " + std::to_string(codes) + " codes differ (besides " +
             std::to_string(flips) + " flips at a boundary)";
  }
  return fraction;
}

// The oracle's rotated queries for a case, laid out in a scratch of q_cap = batch * n_queries rows.
// With outlier channels the rotation reads each sequence's masks from its key words (`keys`).
std::vector<float> oracle_scratch(const TqCase& c, const TqTables& tables, const HostTensor& q,
                                  const std::vector<std::uint32_t>& keys) {
  std::vector<float> s(std::size_t(tq_scratch_floats(c.batch * c.n_queries, c.H, c.layout.head_dim)));
  tq_rotate_queries(flashtq::backend("reference"),
                    {tables, q.view, c.batch * c.n_queries, s.data(), nullptr, keys.data()});
  return s;
}

HostTensor queries(const TqCase& c) {
  HostTensor q({c.batch, c.n_queries, c.H, c.layout.head_dim}, c.dtype, false);
  std::mt19937_64 rng(c.data_seed ^ 3);
  q.fill_normal(rng);
  return q;
}

}  // namespace

CheckResult check_tq_encode(Backend& backend, const TqCase& c) {
  CheckResult r{"tq_encode", c.describe(), 0, 1e-3, false, "", 0, ""};
  const TqLayout& l = c.layout;
  const TqTables tables = make_tq_tables(l, c.seed, 0);
  const OracleCache ref = oracle_cache(c, tables);
  const HostTensor k = kv_rows(c, 1), v = kv_rows(c, 2);
  DeviceBuffer dk(backend, k.bytes), dv(backend, v.bytes), kc(backend, poisoned_keys(c, 1)),
      vc(backend, std::vector<std::uint32_t>(ref.values.size(), kPoisonWord));
  const Memory mem = backend.memory();
  const auto t0 = std::chrono::steady_clock::now();
  tq_encode_keys(backend,
                 {tables, k.on(dk.get(), mem), encode_start(c), static_cast<std::uint32_t*>(kc.get()), nullptr});
  tq_encode_values(backend,
                   {tables, v.on(dv.get(), mem), encode_start(c), static_cast<std::uint32_t*>(vc.get()), nullptr});
  backend.synchronize();
  r.seconds = seconds_since(t0);
  const std::vector<std::uint32_t> keys_before = poisoned_keys(c, 1), values_before(ref.values.size(), kPoisonWord);
  auto rotations = [&](const HostTensor& x, bool keys) {
    return [&, rows = &x, keys] {
      return oracle_rotations(l, tables, *rows, encode_start(c), keys, keys ? keys_before : values_before,
                              keys ? ref.keys : ref.values);
    };
  };
  r.error = std::max(compare_words(l, ref.keys, kc.read<std::uint32_t>(), true, rotations(k, true),
                                   mean_allowance(k, l.key_block), r.detail),
                     compare_words(l, ref.values, vc.read<std::uint32_t>(), false, rotations(v, false),
                                   mean_allowance(v, l.value_block), r.detail));
  r.passed = r.error <= r.tolerance;
  return r;
}

CheckResult check_tq_rotate(Backend& backend, const TqCase& c) {
  CheckResult r{"tq_rotate", c.describe(), 0, 1e-5, false, "", 0, ""};
  const TqTables tables = make_tq_tables(c.layout, c.seed, 0);
  const HostTensor q = queries(c);
  const std::vector<std::uint32_t> keys = poisoned_keys(c, c.batch);
  const std::vector<float> ref = oracle_scratch(c, tables, q, keys);
  DeviceBuffer dq(backend, q.bytes), dk(backend, keys),
      scratch(backend, std::vector<float>(ref.size(), std::numeric_limits<float>::quiet_NaN()));
  const auto t0 = std::chrono::steady_clock::now();
  tq_rotate_queries(
      backend, {tables, q.on(dq.get(), backend.memory()), c.batch * c.n_queries, static_cast<float*>(scratch.get()),
                nullptr, static_cast<const std::uint32_t*>(dk.get())});
  backend.synchronize();
  r.seconds = seconds_since(t0);
  const std::vector<float> got = scratch.read<float>();
  r.error = relative_error(std::vector<double>(ref.begin(), ref.end()), std::vector<double>(got.begin(), got.end()),
                           r.detail);
  r.passed = r.error <= r.tolerance;
  return r;
}

CheckResult check_tq_attend(Backend& backend, const TqCase& c) {
  // docs/spec.md §3: TurboQuant attention is held to 1e-2 against the oracle on the same packed words
  // (room for bf16-class arithmetic); the f32 kernels of today are far inside it (docs/backends.md).
  CheckResult r{"tq_attend", c.describe(), 0, 1e-2, false, "", 0, ""};
  const TqLayout& l = c.layout;
  const TqTables tables = make_tq_tables(l, c.seed, 0);
  const OracleCache cache = oracle_cache(c, tables, c.batch);
  const HostTensor q = queries(c);
  const std::vector<float> scratch = oracle_scratch(c, tables, q, cache.keys);
  TqAttendArgs a;
  a.tables = tables;
  a.scratch = scratch.data();
  a.n_heads = c.H;
  a.n_queries = c.n_queries;
  a.start_pos = c.start_pos;
  a.max_seq = c.max_seq;
  a.window = c.window;
  a.batch = c.batch;
  a.start_positions = c.starts.empty() ? nullptr : c.starts.data();
  a.exact = c.exact;
  a.softcap = c.softcap;
  std::vector<float> sinks;
  if (c.sinks) {  // about the scores' size, a quarter of the heads without one
    std::mt19937_64 rng(c.data_seed ^ 0x51a4c0de51a4c0deull);
    std::normal_distribution<float> logit(0.5f, 1.5f);
    sinks.resize(std::size_t(c.H));
    for (float& x : sinks) x = rng() % 4 == 0 ? -std::numeric_limits<float>::infinity() : logit(rng);
    a.sinks = sinks.data();
  }
  a.k_cache = cache.keys.data();
  a.v_cache = cache.values.data();
  HostTensor out({c.batch, c.n_queries, c.H, c.layout.head_dim}, DType::f32, false);
  a.out = out.view;
  tq_attend(flashtq::backend("reference"), a);
  const std::vector<double> ref = out.values();

  out.poison();
  DeviceBuffer ds(backend, scratch), dk(backend, cache.keys), dv(backend, cache.values), dout(backend, out.bytes),
      dstarts(backend, c.starts), dsinks(backend, sinks);
  a.scratch = static_cast<const float*>(ds.get());
  if (c.sinks) a.sinks = static_cast<const float*>(dsinks.get());
  if (!c.starts.empty()) a.start_positions = static_cast<const std::int32_t*>(dstarts.get());
  a.k_cache = static_cast<const std::uint32_t*>(dk.get());
  a.v_cache = static_cast<const std::uint32_t*>(dv.get());
  a.out = out.on(dout.get(), backend.memory());
  // The workspace is poisoned too (all bytes 0xFF: NaN floats): nothing may read what no kernel wrote.
  DeviceBuffer workspace(backend, std::vector<std::uint8_t>(tq_attend_workspace_bytes(backend, a), 0xFF));
  a.workspace = workspace.get();
  a.workspace_bytes = tq_attend_workspace_bytes(backend, a);
  const auto t0 = std::chrono::steady_clock::now();
  tq_attend(backend, a);
  backend.synchronize();
  r.seconds = seconds_since(t0);
  r.kernel = backend.last_kernel();
  out.assign(dout.read<std::uint8_t>());
  r.error = relative_error(ref, out.values(), r.detail);
  r.passed = r.error <= r.tolerance;
  return r;
}

namespace {
// A sixth of the cases cap their scores (docs/spec.md §1.8; Gemma 2 caps at 50), a sixth have sinks (§1.9).
template <typename Range>
void draw_softcap_and_sinks(TqCase& c, Range&& range) {
  if (range(0, 5) == 0) c.softcap = std::array{0.5f, 5.0f, 30.0f}[std::size_t(range(0, 2))];
  c.sinks = range(0, 5) == 0;
}

// Half the cases attend a batch of 2..4 sequences, half of those with their own start positions.
template <typename Range>
void draw_batch(TqCase& c, Range&& range) {
  if (range(0, 1) == 0) return;
  c.batch = range(2, 4);
  if (range(0, 1) == 0) return;
  for (std::int64_t b = 0; b < c.batch; ++b)
    c.starts.push_back(std::int32_t(range(0, c.layout.capacity - c.n_queries)));
}
}  // namespace

TqCase draw_tq_case(std::mt19937_64& rng, const Backend& backend) {
  auto range = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  for (;;) {
    TqCase c;
    const std::int64_t dims[] = {32, 64, 128, 256};
    c.layout.head_dim = dims[range(0, 3)];
    c.layout.key_bits = int(range(1, 3));
    c.layout.value_bits = int(range(2, 4));
    if (range(0, 2) == 0) c.layout.key_bits = c.layout.value_bits = 2;  // the seed's configuration, often
    if (range(0, 3) == 0) {  // MSE-only keys: codes of 1 to 4 bits, no QJL sketch
      c.layout.qjl = false;
      c.layout.key_bits = int(range(1, 4));
      c.layout.norm_correction = range(0, 1) == 1;
      if (range(0, 2) == 0) {  // outlier channels: 16 up to head_dim / 2 of them, at key_bits to 4 bits
        c.layout.key_outliers = std::int32_t(16) << range(0, std::bit_width(std::uint64_t(c.layout.head_dim / 32)) - 1);
        c.layout.key_outlier_bits = int(range(c.layout.key_bits, 4));
      }
    }
    c.layout.n_kv_heads = range(1, 2);
    c.H = c.layout.n_kv_heads * (std::int64_t(1) << range(0, 2));
    c.tokens = range(1, c.layout.head_dim >= 256 ? 80 : 200);
    c.layout.capacity = c.tokens + range(0, 16);
    if (range(0, 2) == 0) {  // exact sink and recent tokens (docs/spec.md §2.6), as a preset has them
      c.layout.sink_tokens = std::int32_t(range(0, std::min<std::int64_t>(4, c.layout.capacity)));
      c.layout.recent_tokens =
          std::int32_t(range(0, std::min<std::int64_t>(40, c.layout.capacity - c.layout.sink_tokens)));
    }
    if (c.layout.recent_tokens >= 8 && range(0, 1) == 0) {  // block means, of at most recent_tokens timesteps
      const std::int64_t most = std::min<std::int64_t>(c.layout.recent_tokens, 2 * c.layout.head_dim);
      auto block = [&] { return std::int32_t(8) << range(0, std::bit_width(std::uint64_t(most / 8)) - 1); };
      if (!c.layout.qjl && range(0, 1) == 0) c.layout.key_block = block();
      if (range(0, 1) == 0) c.layout.value_block = block();
    }
    if (range(0, 5) == 0) {  // a named preset's layout at this case's shape
      const std::vector<TqPreset>& presets = tq_presets();
      const char* name = presets[std::size_t(range(0, std::int64_t(presets.size()) - 1))].name;
      const TqLayout widths = tq_preset_layout(name, c.layout.head_dim, c.layout.n_kv_heads, 1 << 16);
      const TqLayout p = tq_preset_layout(name, c.layout.head_dim, c.layout.n_kv_heads,
                                          std::max<std::int64_t>(c.layout.capacity, widths.exact_rows()));
      c.layout = p;
      c.tokens = std::min<std::int64_t>(c.tokens, c.layout.capacity);
    }
    c.n_queries = range(1, std::min<std::int64_t>(8, c.layout.capacity));
    c.start_pos = range(0, c.layout.capacity - c.n_queries);
    if (range(0, 3) == 0) c.max_seq = range(0, c.layout.capacity);
    if (range(0, 3) == 0) c.window = range(1, c.layout.capacity);
    c.dtype = std::array{DType::f32, DType::f16, DType::bf16}[std::size_t(range(0, 2))];
    c.zero_rows = range(0, 3) == 0;
    draw_batch(c, range);
    draw_softcap_and_sinks(c, range);
    c.seed = rng();
    c.data_seed = rng();
    if (!backend.unsupported(c.layout)) return c;
  }
}

TqCase draw_tq_decode_case(std::mt19937_64& rng, const Backend& backend) {
  auto range = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  TqCase c;
  c.layout.head_dim = 128;
  c.layout.key_bits = c.layout.value_bits = 2;
  c.layout.n_kv_heads = range(1, 2);
  c.H = c.layout.n_kv_heads * (range(0, 1) ? 8 : 4);
  c.tokens = range(1, 3000);
  c.layout.capacity = c.tokens + range(0, 40);
  if (range(0, 1) == 1) {  // half: a preset's layout, its exact tokens and block means, GQA groups of 1 to 16
    const std::vector<TqPreset>& presets = tq_presets();
    const char* name = presets[std::size_t(range(0, std::int64_t(presets.size()) - 1))].name;
    const std::int64_t dims[] = {64, 128, 256}, groups[] = {1, 3, 4, 6, 8, 16};
    const std::int64_t D = dims[range(0, 2)];
    c.H = c.layout.n_kv_heads * groups[range(0, 5)];
    if (D == 256) c.tokens = range(1, 1500);
    const TqLayout widths = tq_preset_layout(name, D, c.layout.n_kv_heads, 1 << 16);
    const TqLayout p = tq_preset_layout(name, D, c.layout.n_kv_heads,
                                        std::max<std::int64_t>(c.tokens + range(0, 40), widths.exact_rows()));
    if (!backend.unsupported(p)) c.layout = p;
  }
  c.n_queries = range(1, std::min<std::int64_t>(3, c.layout.capacity));
  c.start_pos = std::max<std::int64_t>(0, std::min(c.tokens - 1, c.layout.capacity - c.n_queries) - range(0, 3));
  if (range(0, 4) == 0) c.max_seq = range(0, c.layout.capacity);
  if (range(0, 4) == 0) c.window = range(1, 2 * c.tokens);
  c.dtype = std::array{DType::f32, DType::f16, DType::bf16}[std::size_t(range(0, 2))];
  c.zero_rows = range(0, 3) == 0;
  draw_batch(c, range);
  draw_softcap_and_sinks(c, range);
  c.seed = rng();
  c.data_seed = rng();
  return c;
}

TqCase draw_tq_prefill_case(std::mt19937_64& rng, const Backend& backend) {
  auto range = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  TqCase c = draw_tq_case(rng, backend);  // its layout (a capacity only grows: exact rows and blocks still fit)
  c.layout.capacity = std::max<std::int64_t>(c.layout.capacity, range(32, c.layout.head_dim >= 256 ? 128 : 256));
  c.tokens = range(1, c.layout.capacity);
  c.n_queries = range(16, std::min<std::int64_t>(96, c.layout.capacity));
  c.start_pos = range(0, c.layout.capacity - c.n_queries);
  c.max_seq.reset();
  c.starts.clear();
  if (range(0, 3) == 0) c.window = range(1, c.layout.capacity);
  c.seed = rng();
  c.data_seed = rng();
  return c;
}

std::vector<CheckResult> run_suite(Backend& backend, int cases, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<CheckResult> results;
  for (int i = 0; i < cases; ++i) {
    const DenseCase dc = draw_dense_case(rng, backend);
    results.push_back(check_forward(backend, dc));
    results.push_back(check_backward(backend, backward_case(dc)));
    const TqCase tc = draw_tq_case(rng, backend);
    results.push_back(check_tq_encode(backend, tc));
    results.push_back(check_tq_rotate(backend, tc));
    results.push_back(check_tq_attend(backend, tc));
    if (i % 4 == 0) results.push_back(check_tq_attend(backend, draw_tq_decode_case(rng, backend)));
    if (i % 8 == 2) results.push_back(check_tq_attend(backend, draw_tq_prefill_case(rng, backend)));
    if (i % 10 == 0) results.push_back(check_dropout(backend, std::uint32_t(rng()), 0.1f + 0.08f * float(i % 10)));
  }
  return results;
}

}  // namespace flashtq::conformance

// Outlier channels of keys (docs/spec.md §2.6, docs/turboquant_layout.md) on the oracle: attention over a
// cache with outlier channels against a softmax written here over keys decoded part by part from the packed
// words by the documented formula (the mask's order, each part's width, norm half and rotation); calibration;
// the documented sizes; the file keeps the masks; bad configurations and calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "conformance/host_tensor.hpp"
#include "core/codebook.hpp"
#include "core/half.hpp"
#include "core/packing.hpp"
#include "core/rht.hpp"
#include "flashtq/flashtq.hpp"
#include "seeded.hpp"
#include "tq_test_support.hpp"

namespace flashtq {
namespace {

using conformance::HostTensor;
using testing_tq::expect_error;
using testing_tq::half_value;
using testing_tq::relative_error;

// A kv head's permutation and parts, as docs/turboquant_layout.md says: the mask's channels first (ascending),
// then the rest (ascending); parts of key_outliers, then the rest in powers of two, largest first.
struct Parts {
  std::vector<std::int64_t> order, sizes;
};
Parts parts_of(const TqLayout& l, const std::vector<std::uint32_t>& words, std::int64_t h) {
  const std::int64_t D = l.head_dim, N = l.key_outliers;
  const std::uint32_t* mask = words.data() + l.key_mask_offset() + h * D / 32;
  std::int64_t set = 0;
  for (std::int64_t c = 0; c < D; ++c) set += (mask[c / 32] >> (c % 32)) & 1u;
  Parts p;
  for (int pass = 0; pass < 2; ++pass)
    for (std::int64_t c = 0; c < D; ++c) {
      const bool outlier = set == N ? ((mask[c / 32] >> (c % 32)) & 1u) != 0 : c < N;
      if (outlier == (pass == 0)) p.order.push_back(c);
    }
  p.sizes.push_back(N);
  for (std::int64_t rest = D - N; rest > 0; rest -= p.sizes.back())
    p.sizes.push_back(std::int64_t(std::bit_floor(std::uint64_t(rest))));
  return p;
}

// A row in the permuted, part-rotated coordinates back in the key's own: each part rotated back over its slice
// of the signs, then every coordinate to its channel.
std::vector<double> unrotate(const Parts& p, const TqTables& t, std::vector<double> y) {
  std::vector<double> x(y.size());
  std::int64_t offset = 0;
  for (std::int64_t size : p.sizes) {
    core::inverse_rht(y.data() + offset, size, t.polar_sign_bits, offset);
    offset += size;
  }
  for (std::size_t i = 0; i < y.size(); ++i) x[std::size_t(p.order[i])] = y[i];
  return x;
}

// Row t of kv head h of keys with outlier channels, decoded from its codes: part p is its norm half times the
// head_dim codebook's centroids of its codes (b_o bits for part 0, b_k for the others, part after part).
std::vector<double> decode_key(const TqLayout& l, const TqTables& t, const std::vector<std::uint32_t>& words,
                               std::int64_t h, std::int64_t time) {
  const std::int64_t D = l.head_dim, slot = h * l.capacity + time;
  const Parts parts = parts_of(l, words, h);
  const std::uint32_t* codes = words.data() + slot * l.key_code_words();
  const std::uint32_t* norms = words.data() + l.key_norm_offset() + slot * ((std::int64_t(parts.sizes.size()) + 1) / 2);
  std::vector<double> y(static_cast<std::size_t>(D));
  std::int64_t offset = 0, pos = 0;
  for (std::size_t p = 0; p < parts.sizes.size(); ++p) {
    const int bits = p == 0 ? l.key_outlier_bits : l.key_bits;
    const core::Codebook& cb = core::codebook(D, bits);
    const double n = half_value(norms[p / 2], int(p % 2));
    for (std::int64_t i = 0; i < parts.sizes[p]; ++i, pos += bits)
      y[std::size_t(offset + i)] = n * cb.centroids[core::get_bits(codes, pos, bits)];
    offset += parts.sizes[p];
  }
  return unrotate(parts, t, y);
}

// The exact row of a sink or recent timestep (bf16 pairs of the rotated row): keys in their parts, values
// rotated as a whole.
std::vector<double> exact_row(const TqLayout& l, const TqTables& t, const std::vector<std::uint32_t>& words, bool keys,
                              std::int64_t h, std::int64_t row) {
  const std::int64_t D = l.head_dim;
  const std::uint32_t* w =
      words.data() + (keys ? l.key_exact_offset() : l.value_exact_offset()) + (h * l.exact_rows() + row) * (D / 2);
  std::vector<double> y(static_cast<std::size_t>(D));
  for (std::int64_t d = 0; d < D; ++d)
    y[std::size_t(d)] = double(core::bf16_to_f32(std::uint16_t(w[d / 2] >> (16 * (d % 2)))));
  if (keys) return unrotate(parts_of(l, words, h), t, y);
  core::inverse_rht(y.data(), D, t.polar_sign_bits);
  return y;
}

// Keys whose channels `loud` (per kv head) are 8x the others: what calibration must find.
HostTensor loud_keys(std::int64_t T, std::int64_t Hkv, std::int64_t D, const std::vector<std::vector<int>>& loud,
                     std::mt19937_64& rng) {
  HostTensor k({1, T, Hkv, D}, DType::f32, false);
  k.fill_normal(rng);
  std::vector<double> v = k.values();
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t h = 0; h < Hkv; ++h)
      for (int c : loud[std::size_t(h)]) v[std::size_t((t * Hkv + h) * D + c)] *= 8.0;
  k.fill(v);
  return k;
}

struct Case {
  std::int64_t D;
  int key_bits, outliers, outlier_bits;
  bool norm_correction, calibrate;
  std::int32_t sinks, recent;
};

// Appends in chunks, attends each chunk's rows, and compares with softmax(q . k~) v~ over keys and values
// decoded here (from the exact region for sink and recent timesteps). Returns the relative error.
double run(const Case& cs, std::mt19937_64& rng) {
  const std::int64_t D = cs.D, Hkv = 2, H = 4, L = 70, chunk = 9;
  TqLayout l{D, Hkv, L, cs.key_bits, 3};
  l.qjl = false;
  l.norm_correction = cs.norm_correction;
  l.key_outliers = cs.outliers;
  l.key_outlier_bits = cs.outlier_bits;
  l.sink_tokens = cs.sinks;
  l.recent_tokens = cs.recent;
  const std::uint64_t seed = rng();
  TqKvCache cache({1, l, seed}, &backend("reference"));
  const TqTables tables = make_tq_tables(l, seed, 0);
  std::vector<std::vector<int>> loud(2);
  for (std::int64_t h = 0; h < Hkv; ++h)
    for (int i = 0; i < cs.outliers / 2; ++i) loud[std::size_t(h)].push_back(int((7 * i + 3 * h + 1) % D));
  HostTensor k = loud_keys(L, Hkv, D, loud, rng), v({1, L, Hkv, D}, DType::f32, false),
             q({1, L, H, D}, DType::f32, false);
  v.fill_normal(rng);
  q.fill_normal(rng);
  if (cs.calibrate) cache.calibrate(0, k.view);
  const std::vector<double> kv = k.values(), qv = q.values();
  std::vector<double> got, want;
  const double scale = 1.0 / std::sqrt(double(D));
  for (std::int64_t start = 0; start < L; start += chunk) {
    const std::int64_t n = std::min(chunk, L - start), end = start + n;
    TensorView kc = k.view, vc = v.view, qc = q.view;
    kc.shape[1] = vc.shape[1] = qc.shape[1] = n;
    kc.data = static_cast<float*>(k.view.data) + start * Hkv * D;
    vc.data = static_cast<float*>(v.view.data) + start * Hkv * D;
    qc.data = static_cast<float*>(q.view.data) + start * H * D;
    cache.append(0, kc, vc, start);
    HostTensor out({1, n, H, D}, DType::f32, false);
    out.poison();
    cache.attend(0, qc, start, out.view);
    const std::vector<double> o = out.values();
    got.insert(got.end(), o.begin(), o.end());
    const std::vector<std::uint32_t> kw = cache.key_words(0), vw = cache.value_words(0);
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t p = start + j;
      for (std::int64_t h = 0; h < H; ++h) {
        const std::int64_t kvh = h / (H / Hkv);
        std::vector<double> s(static_cast<std::size_t>(p + 1)), acc(static_cast<std::size_t>(D), 0.0);
        std::vector<std::vector<double>> vrows(static_cast<std::size_t>(p + 1));
        double m = -std::numeric_limits<double>::infinity();
        for (std::int64_t t = 0; t <= p; ++t) {
          std::vector<double> kr, vr;
          const std::int64_t er = l.exact_row(t, end);
          if (er >= 0) {
            kr = exact_row(l, tables, kw, true, kvh, er);
            vr = exact_row(l, tables, vw, false, kvh, er);
            // and the exact row is the original row to bf16 precision
            for (std::int64_t d = 0; d < D; ++d)
              EXPECT_NEAR(kr[std::size_t(d)], kv[std::size_t((t * Hkv + kvh) * D + d)], 0.03 * std::sqrt(double(D)));
          } else {
            kr = decode_key(l, tables, kw, kvh, t);
            vr = testing_tq::decode(l, tables, vw, false, kvh, t);
          }
          double dot = 0;
          for (std::int64_t d = 0; d < D; ++d) dot += qv[std::size_t((p * H + h) * D + d)] * kr[std::size_t(d)];
          s[std::size_t(t)] = scale * dot;
          m = std::max(m, s[std::size_t(t)]);
          vrows[std::size_t(t)] = vr;
        }
        double sum = 0;
        for (std::int64_t t = 0; t <= p; ++t) {
          const double e = std::exp(s[std::size_t(t)] - m);
          sum += e;
          for (std::int64_t d = 0; d < D; ++d) acc[std::size_t(d)] += e * vrows[std::size_t(t)][std::size_t(d)];
        }
        for (double a : acc) want.push_back(a / sum);
      }
    }
  }
  return relative_error(got, want);
}

TEST(OutlierChannels, AttentionEqualsSoftmaxOverKeysDecodedPartByPart) {
  std::mt19937_64 rng = test_rng();
  const Case cases[] = {
      {32, 2, 16, 3, false, true, 0, 0},   {64, 3, 16, 4, true, true, 2, 7},   {64, 2, 32, 2, false, false, 0, 0},
      {128, 3, 32, 4, true, true, 0, 0},   {128, 1, 64, 4, false, true, 3, 4}, {256, 4, 64, 4, true, true, 4, 16},
      {256, 3, 16, 4, false, false, 0, 5},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("D " + std::to_string(c.D) + " k" + std::to_string(c.key_bits) + " o" + std::to_string(c.outliers) +
                 "x" + std::to_string(c.outlier_bits) + (c.norm_correction ? " nc" : "") +
                 (c.calibrate ? " calibrated" : " uncalibrated") + " sinks " + std::to_string(c.sinks) + " recent " +
                 std::to_string(c.recent));
    // The oracle's arithmetic is double but its rotated queries are f32 (the scratch's type).
    EXPECT_LE(run(c, rng), 1e-6);
  }
}

// On keys with loud channels (90 % of their energy in 16 of 128), one more bit for those channels alone (16
// bits a key, 4 % more) cuts the scores' error by far more than 4 %: the loud part gets 4-bit precision. (At
// equal widths the split changes nothing for isotropic queries: each part's error scales with its norm.)
TEST(OutlierChannels, LoudChannelsCodedApartCostLessError) {
  std::mt19937_64 rng = test_rng();
  const std::int64_t D = 128, T = 256;
  std::vector<std::vector<int>> loud{{1, 5, 9, 64, 70, 100, 101, 127, 2, 3, 4, 6, 7, 8, 10, 11}};
  const HostTensor k = loud_keys(T, 1, D, loud, rng);
  // 32 queries: the error of one query's scores depends too much on its direction to compare two layouts by.
  constexpr std::int64_t kQueries = 32;
  HostTensor q({1, kQueries, 1, D}, DType::f32, false), v({1, T, 1, D}, DType::f32, false);
  q.fill_normal(rng);
  v.fill_normal(rng);
  auto attention_error = [&](int outliers) {
    TqLayout l{D, 1, T, 3, 4};
    l.qjl = false;
    l.key_outliers = outliers;
    l.key_outlier_bits = outliers ? 4 : 0;
    TqKvCache cache({1, l, 11}, &backend("reference"));
    if (outliers) cache.calibrate(0, k.view);
    cache.append(0, k.view, v.view, 0);
    double err = 0, n2 = 0;
    const std::vector<double> kv = k.values();
    const std::vector<double> qv = q.values();
    // Scores against the decoded keys' scores: what the keys' coding costs.
    const TqTables tables = make_tq_tables(l, 11, 0);
    const std::vector<std::uint32_t> kw = cache.key_words(0);
    for (std::int64_t t = 0; t < T; ++t) {
      // With outliers part by part; the plain layout is one part of all D channels.
      const std::vector<double> dec =
          outliers ? decode_key(l, tables, kw, 0, t) : testing_tq::decode(l, tables, kw, true, 0, t);
      for (std::int64_t j = 0; j < kQueries; ++j) {
        double exact = 0, coded = 0;
        for (std::int64_t d = 0; d < D; ++d) {
          exact += qv[std::size_t(j * D + d)] * kv[std::size_t(t * D + d)];
          coded += qv[std::size_t(j * D + d)] * dec[std::size_t(d)];
        }
        err += (coded - exact) * (coded - exact);
        n2 += exact * exact;
      }
    }
    return std::sqrt(err / n2);
  };
  const double plain = attention_error(0), split = attention_error(16);
  EXPECT_LT(split, 0.75 * plain) << "score error with 16 outlier channels of 4 bits " << split << ", without " << plain;
}

TEST(OutlierChannels, CalibrationChoosesTheLoudestChannelsOfEachHead) {
  std::mt19937_64 rng = test_rng();
  const std::int64_t D = 64;
  std::vector<std::vector<int>> loud{{0, 3, 17, 31, 32, 40, 50, 63, 1, 2, 5, 6, 7, 8, 9, 10},
                                     {11, 12, 13, 14, 15, 16, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27}};
  const HostTensor k = loud_keys(40, 2, D, loud, rng);
  TqLayout l{D, 2, 50, 3, 3};
  l.qjl = false;
  l.key_outliers = 16;
  l.key_outlier_bits = 4;
  TqKvCache cache({1, l, 5}, &backend("reference"));
  cache.calibrate(0, k.view);
  const std::vector<std::uint32_t> words = cache.key_words(0);
  for (std::int64_t h = 0; h < 2; ++h) {
    std::vector<int> chosen;
    for (int c = 0; c < D; ++c)
      if ((words[std::size_t(l.key_mask_offset() + h * 2 + c / 32)] >> (c % 32)) & 1u) chosen.push_back(c);
    std::vector<int> expect = loud[std::size_t(h)];
    std::sort(expect.begin(), expect.end());
    EXPECT_EQ(chosen, expect) << "kv head " << h;
  }
}

TEST(OutlierChannels, SizesAreTheDocumentedOnes) {
  // docs/turboquant_layout.md: codes of D * b + N * (b_o - b) bits in whole words, one f16 norm per part two to
  // a word, values as always.
  struct Size {
    std::int64_t D;
    int kb, n, ob, vb;
    std::int64_t bytes;
  };
  for (const Size& s : {Size{64, 3, 16, 4, 3, 64}, Size{128, 3, 32, 4, 3, 112}, Size{256, 3, 64, 4, 3, 212},
                        Size{256, 4, 64, 4, 3, 236}, Size{64, 3, 32, 4, 2, 52}}) {
    TqLayout l{s.D, 1, 8, s.kb, s.vb};
    l.qjl = false;
    l.key_outliers = s.n;
    l.key_outlier_bits = s.ob;
    EXPECT_EQ(l.bytes_per_token_per_head(), s.bytes) << "D " << s.D << " k" << s.kb << "o" << s.n << "x" << s.ob;
  }
}

TEST(OutlierChannels, FileRoundTripKeepsTheMasks) {
  std::mt19937_64 rng = test_rng();
  const std::int64_t D = 64, T = 20;
  TqLayout l{D, 2, 32, 3, 3};
  l.qjl = false;
  l.key_outliers = 16;
  l.key_outlier_bits = 4;
  l.sink_tokens = 2;
  TqKvCache cache({2, l, 77}, &backend("cpu"));
  std::vector<std::vector<int>> loud{{5, 6, 7}, {60, 61}};
  const HostTensor k = loud_keys(T, 2, D, loud, rng);
  HostTensor v({1, T, 2, D}, DType::f32, false), q({1, 1, 4, D}, DType::f32, false), a({1, 1, 4, D}, DType::f32, false),
      b(a);
  v.fill_normal(rng);
  q.fill_normal(rng);
  cache.calibrate(1, k.view);
  cache.append(1, k.view, v.view, 0);
  const std::string path = testing::TempDir() + "outliers.ftq";
  cache.save(path);
  const TqKvCache loaded = TqKvCache::load(path, &backend("reference"));
  EXPECT_EQ(loaded.key_words(1), cache.key_words(1));
  EXPECT_EQ(loaded.config().layout.key_outliers, 16);
  EXPECT_EQ(loaded.config().layout.key_outlier_bits, 4);
  a.poison();
  b.poison();
  cache.attend(1, q.view, T - 1, a.view);
  TqKvCache again = TqKvCache::load(path, &backend("cpu"));
  again.attend(1, q.view, T - 1, b.view);
  EXPECT_EQ(a.values(), b.values());
}

TEST(OutlierChannels, BadConfigurationsAndCallsAreClearErrors) {
  auto layout = [](std::int64_t D, int n, int ob, bool qjl = false) {
    TqLayout l{D, 1, 16, 3, 3};
    l.qjl = qjl;
    l.key_outliers = n;
    l.key_outlier_bits = ob;
    return l;
  };
  for (int n : {8, 24, 48, 64, -16}) {
    expect_error(
        [&] {
          TqKvCache({1, layout(64, n, 4), 0}, &backend("reference"));
        },
        "key_outliers", "power of two in [16, head_dim / 2 = 32]");
  }
  expect_error(
      [&] {
        TqKvCache({1, layout(64, 16, 4, true), 0}, &backend("reference"));
      },
      "key_outliers", "without QJL");
  expect_error(
      [&] {
        TqKvCache({1, layout(64, 16, 2), 0}, &backend("reference"));
      },
      "key_outlier_bits", "[key_bits = 3, 4]");
  expect_error([&] { TqKvCache({1, layout(64, 16, 5), 0}, &backend("reference")); }, "key_outlier_bits", "4]");
  expect_error(
      [&] {
        TqKvCache({1, layout(64, 0, 4), 0}, &backend("reference"));
      },
      "key_outlier_bits", "must be 0 without outlier channels");

  std::mt19937_64 rng = test_rng();
  HostTensor k({1, 4, 1, 64}, DType::f32, false), v(k), wrong({1, 4, 2, 64}, DType::f32, false);
  k.fill_normal(rng);
  v.fill_normal(rng);
  TqKvCache plain({1, layout(64, 0, 0), 0}, &backend("reference"));
  expect_error([&] { plain.calibrate(0, k.view); }, "layout", "has none (key_outliers = 0)");
  TqKvCache cache({1, layout(64, 16, 4), 0}, &backend("reference"));
  expect_error([&] { cache.calibrate(0, wrong.view); }, "keys", "[1, T, n_kv_heads, head_dim]");
  std::vector<double> bad = k.values();
  bad[70] = std::numeric_limits<double>::quiet_NaN();
  HostTensor nan_keys(k);
  nan_keys.fill(bad);
  expect_error([&] { cache.calibrate(0, nan_keys.view); }, "keys", "row (0, 1, 0) holds a NaN");
  expect_error([&] { cache.calibrate(3, k.view); }, "layer", "must be in [0, 1)");
  cache.append(0, k.view, v.view, 0);
  expect_error([&] { cache.calibrate(0, k.view); }, "layer", "already holds 4 timesteps");
  // Every backend serves the layout (webgpu too: its kernels read parts).
  for (const Backend* b : all_backends()) EXPECT_FALSE(b->unsupported(layout(64, 16, 4)).has_value()) << b->name();
}

}  // namespace
}  // namespace flashtq

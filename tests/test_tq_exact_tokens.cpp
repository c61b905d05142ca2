// Exact sink and recent tokens (docs/spec.md §2.6) on the oracle: attention over a cache whose first and
// last timesteps are kept exact, against a softmax written here over the original rows (exact ones) and
// rows decoded from the packed words (the others); the presets' documented sizes; bad configurations.
#include <gtest/gtest.h>

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
using testing_tq::decode;
using testing_tq::expect_error;
using testing_tq::relative_error;

struct Errors {
  double against_expected = 0;  // the cache's attention against the softmax written here
  double exact_vs_packed = 0;   // how far the expected output is from attention over codes alone
};

// Appends L timesteps in chunks of `chunk`, attends each chunk's rows right after its append (as decode and
// chunked prefill do), and compares with softmax(q . k~) v~, where k~, v~ are the original rows for the
// timesteps the exact region holds at that moment (the first `sink` and the last `recent` of the sequence) and
// the rows decoded from the codes otherwise.
Errors run(std::int32_t sink, std::int32_t recent, std::int64_t L, std::int64_t chunk, std::mt19937_64& rng) {
  const std::int64_t D = 64, Hkv = 2, H = 4;
  TqLayout l{D, Hkv, L, 2, 2};
  l.qjl = false;
  l.sink_tokens = sink;
  l.recent_tokens = recent;
  const std::uint64_t seed = rng();
  TqKvCache cache({1, l, seed}, &backend("reference"));
  const TqTables tables = make_tq_tables(l, seed, 0);
  HostTensor k({1, L, Hkv, D}, DType::f32, false), v(k), q({1, L, H, D}, DType::f32, false);
  k.fill_normal(rng);
  v.fill_normal(rng);
  q.fill_normal(rng);
  const std::vector<double> kv = k.values(), vv = v.values(), qv = q.values();
  std::vector<double> got, want, packed_only;
  const double scale = 1.0 / std::sqrt(double(D));
  for (std::int64_t start = 0; start < L; start += chunk) {
    const std::int64_t n = std::min(chunk, L - start), end = start + n;
    TensorView kc = k.view, vc = v.view;
    kc.shape[1] = vc.shape[1] = n;
    kc.data = static_cast<float*>(k.view.data) + start * Hkv * D;
    vc.data = static_cast<float*>(v.view.data) + start * Hkv * D;
    cache.append(0, kc, vc, start);
    HostTensor out({1, n, H, D}, DType::f32, false);
    out.poison();
    TensorView qc = q.view;
    qc.shape[1] = n;
    qc.data = static_cast<float*>(q.view.data) + start * H * D;
    cache.attend(0, qc, start, out.view);
    const std::vector<double> o = out.values();
    got.insert(got.end(), o.begin(), o.end());
    const std::vector<std::uint32_t> kw = cache.key_words(0), vw = cache.value_words(0);
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t p = start + j;
      for (std::int64_t h = 0; h < H; ++h) {
        const std::int64_t kvh = h / (H / Hkv);
        for (int mode = 0; mode < 2; ++mode) {  // 0: exact where the region holds it; 1: codes everywhere
          std::vector<double> s(static_cast<std::size_t>(p + 1)), acc(static_cast<std::size_t>(D), 0.0);
          std::vector<std::vector<double>> vrows(static_cast<std::size_t>(p + 1));
          double m = -std::numeric_limits<double>::infinity();
          for (std::int64_t t = 0; t <= p; ++t) {
            const bool exact = mode == 0 && (t < sink || t >= end - recent);
            std::vector<double> kr(static_cast<std::size_t>(D)), vr(static_cast<std::size_t>(D));
            for (std::int64_t d = 0; d < D; ++d) {
              kr[std::size_t(d)] = kv[std::size_t((t * Hkv + kvh) * D + d)];
              vr[std::size_t(d)] = vv[std::size_t((t * Hkv + kvh) * D + d)];
            }
            if (!exact) {
              kr = decode(l, tables, kw, true, kvh, t);
              vr = decode(l, tables, vw, false, kvh, t);
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
          for (double& a : acc) (mode == 0 ? want : packed_only).push_back(a / sum);
        }
      }
    }
  }
  return {relative_error(got, want), relative_error(packed_only, want)};
}

TEST(ExactTokens, EveryTokenExactEqualsDenseAttention) {
  std::mt19937_64 rng = test_rng();
  // sink + recent covers the whole sequence: attention is dense attention up to the bf16 copies' rounding.
  const Errors r = run(4, 20, 24, 8, rng);
  EXPECT_LE(r.against_expected, 1e-2);
  EXPECT_GE(r.exact_vs_packed, 5e-2) << "2-bit codes should be far from exact attention; the test would not tell";
}

TEST(ExactTokens, SinksRecentRingAndCodesInOneSoftmax) {
  std::mt19937_64 rng = test_rng();
  for (std::int64_t chunk : {1, 5, 16}) {  // decode steps, chunks shorter and longer than the recent window
    const Errors r = run(3, 8, 40, chunk, rng);
    EXPECT_LE(r.against_expected, 1e-2) << "chunk " << chunk;
    EXPECT_GE(r.exact_vs_packed, 2e-2) << "chunk " << chunk;
  }
  const Errors no_sinks = run(0, 6, 30, 4, rng);
  EXPECT_LE(no_sinks.against_expected, 1e-2);
  const Errors sinks_only = run(5, 0, 30, 7, rng);
  EXPECT_LE(sinks_only.against_expected, 1e-2);
}

// Bytes per token per kv head (packed part) and exact bytes per kv head, as docs/turboquant_layout.md lists them.
TEST(ExactTokens, PresetSizesAreTheDocumentedOnes) {
  struct Row {
    const char* name;
    std::int64_t head_dim, bytes_per_token, exact_bytes;
  };
  const Row rows[] = {
      {"default", 64, 58, 17408}, {"default", 128, 120, 34816}, {"default", 256, 228, 69632},
      {"quality", 64, 66, 17408}, {"quality", 128, 128, 34816}, {"quality", 256, 248, 69632},
      {"small", 64, 48, 6144},    {"small", 128, 92, 18432},    {"small", 256, 172, 36864},
      {"seed", 64, 48, 0},        {"seed", 128, 88, 0},         {"seed", 256, 168, 0},
  };
  for (const Row& r : rows) {
    const TqLayout l = tq_preset_layout(r.name, r.head_dim, 1, 4096);
    EXPECT_EQ(l.bytes_per_token_per_head(), r.bytes_per_token) << r.name << " D" << r.head_dim;
    EXPECT_EQ(l.exact_bytes_per_head(), r.exact_bytes) << r.name << " D" << r.head_dim;
  }
  EXPECT_STREQ(tq_presets().front().name, "default");
}

TEST(ExactTokens, FileRoundTripKeepsTheExactRegion) {
  std::mt19937_64 rng = test_rng();
  const TqLayout l = tq_preset_layout("default", 64, 2, 100);
  TqKvCache cache({2, l, rng()}, &backend("reference"));
  // 90 timesteps: 4 sinks, 22 coded (two of them in a key block of 64 whose mean is written), 64 recent
  HostTensor k({1, 90, 2, 64}, DType::bf16, false), v(k), q({1, 90, 4, 64}, DType::f32, false);
  k.fill_normal(rng);
  v.fill_normal(rng);
  q.fill_normal(rng);
  cache.append(1, k.view, v.view, 0);
  const std::string path = ::testing::TempDir() + "flashtq_exact_tokens.bin";
  cache.save(path);
  TqKvCache loaded = TqKvCache::load(path, &backend("reference"));
  std::remove(path.c_str());
  EXPECT_EQ(loaded.layout().sink_tokens, 4);
  EXPECT_EQ(loaded.layout().recent_tokens, 64);
  EXPECT_EQ(loaded.layout().key_block, 64);
  EXPECT_EQ(loaded.key_words(1), cache.key_words(1));
  EXPECT_EQ(loaded.value_words(1), cache.value_words(1));
  HostTensor a({1, 90, 4, 64}, DType::f32, false), b(a);
  a.poison();
  b.poison();
  cache.attend(1, q.view, 0, a.view);
  loaded.attend(1, q.view, 0, b.view);
  EXPECT_EQ(a.values(), b.values());
}

// Norm correction: a row decoded from its codes and norm word has the row's length (up to the f16 of the
// norm), where without it the Lloyd-Max codes shrink it.
TEST(NormCorrection, DecodedRowsKeepTheirLength) {
  std::mt19937_64 rng = test_rng();
  for (bool correct : {false, true}) {
    TqLayout l{64, 2, 30, 2, 2};
    l.qjl = false;
    l.norm_correction = correct;
    const std::uint64_t seed = rng();
    const TqTables t = make_tq_tables(l, seed, 0);
    HostTensor x({1, 30, 2, 64}, DType::f32, false);
    x.fill_normal(rng, 3.0);
    std::vector<std::uint32_t> keys(std::size_t(l.key_words()), 0u), values(std::size_t(l.value_words()), 0u);
    tq_encode_keys(backend("reference"), {t, x.view, 0, keys.data(), nullptr});
    tq_encode_values(backend("reference"), {t, x.view, 0, values.data(), nullptr});
    const std::vector<double> xv = x.values();
    double worst = 0, mean_ratio = 0;
    for (bool k : {true, false}) {
      for (std::int64_t h = 0; h < 2; ++h) {
        for (std::int64_t time = 0; time < 30; ++time) {
          const std::vector<double> dec = decode(l, t, k ? keys : values, k, h, time);
          double n2 = 0, d2 = 0;
          for (std::int64_t d = 0; d < 64; ++d) {
            n2 += xv[std::size_t((time * 2 + h) * 64 + d)] * xv[std::size_t((time * 2 + h) * 64 + d)];
            d2 += dec[std::size_t(d)] * dec[std::size_t(d)];
          }
          const double ratio = std::sqrt(d2 / n2);
          worst = std::max(worst, std::fabs(ratio - 1));
          mean_ratio += ratio / 120;
        }
      }
    }
    if (correct) {
      EXPECT_LE(worst, 1e-3) << "decoded length / row length";
    } else {
      EXPECT_LE(mean_ratio, 0.97) << "2-bit codes shrink rows: without correction the test would not tell";
    }
  }
  TqLayout with_qjl{64, 1, 8, 2, 2};
  with_qjl.norm_correction = true;
  try {
    TqKvCache({1, with_qjl, 0}, &backend("reference"));
    ADD_FAILURE() << "norm correction with QJL keys was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "norm_correction");
  }
}

TEST(ExactTokens, BadConfigurationsAreClearErrors) {
  TqLayout l{64, 1, 16, 2, 2};
  l.sink_tokens = 4;
  l.recent_tokens = 13;  // 17 exact rows in a cache of 16 timesteps
  expect_error([&] { TqKvCache({1, l, 0}, &backend("reference")); }, "recent_tokens", "must not exceed capacity");
  l.recent_tokens = -1;
  expect_error([&] { TqKvCache({1, l, 0}, &backend("reference")); }, "recent_tokens", "must be in");
  l.recent_tokens = 2;
  l.sink_tokens = -3;
  expect_error([&] { TqKvCache({1, l, 0}, &backend("reference")); }, "sink_tokens", "must be in");
  expect_error([&] { tq_preset_layout("lossless", 64, 1, 16); }, "preset", "unknown name 'lossless'");
  expect_error([&] { tq_preset_layout("default", 64, 1, 20); }, "recent_tokens", "must not exceed capacity");

  // A cache with a recent window takes timesteps in order and attends the rows that end its sequence.
  TqKvCache cache({1, tq_preset_layout("default", 64, 1, 128), 0}, &backend("reference"));
  HostTensor k({1, 4, 1, 64}, DType::f32, false), v(k), q({1, 2, 1, 64}, DType::f32, false), out(q);
  std::mt19937_64 rng = test_rng();
  k.fill_normal(rng);
  v.fill_normal(rng);
  q.fill_normal(rng);
  cache.append(0, k.view, v.view, 0);
  expect_error([&] { cache.append(0, k.view, v.view, 10); }, "start_pos", "must equal the layer's length 4");
  expect_error([&] { cache.append(0, k.view, v.view, 0); }, "start_pos", "must equal the layer's length 4");
  expect_error([&] { cache.attend(0, q.view, 0, out.view); }, "start_pos", "must end at the layer's length 4");
  EXPECT_EQ(cache.length(0), 4);
}

}  // namespace
}  // namespace flashtq

// Block means of keys and values (docs/spec.md §2.6, docs/turboquant_layout.md) on the oracle and every
// backend available here (cpu; webgpu and cuda where they run, their rows in their memory): the stored means against
// means computed here from the exact rows' formula, attention against a softmax written here over rows decoded by the
// documented formula (mean plus codes), codes that do not depend on how appends are chunked, the documented sizes, the
// file, bad configurations and rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <random>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include <unistd.h>

#include "conformance/device_buffer.hpp"
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
using testing_tq::chunks;
using testing_tq::expect_error;
using testing_tq::half_value;
using testing_tq::relative_error;
using testing_tq::rows_of;

// Rows whose first 8 channels carry a large offset that turns slowly with t (post-RoPE keys look so), plus noise.
HostTensor drifting_rows(std::int64_t T, std::int64_t Hkv, std::int64_t D, std::mt19937_64& rng) {
  HostTensor x({1, T, Hkv, D}, DType::f32, false);
  x.fill_normal(rng);
  std::vector<double> v = x.values();
  std::uniform_real_distribution<double> phase(0, 6.283), speed(0.002, 0.02);
  for (std::int64_t h = 0; h < Hkv; ++h)
    for (std::int64_t c = 0; c < 8; ++c) {
      const double p = phase(rng), w = speed(rng);
      for (std::int64_t t = 0; t < T; ++t) v[std::size_t((t * Hkv + h) * D + c)] += 6.0 * std::cos(w * double(t) + p);
    }
  x.fill(v);
  return x;
}

TqLayout block_layout(std::int64_t D, std::int64_t Hkv, std::int64_t capacity, std::int32_t key_block,
                      std::int32_t value_block) {
  TqLayout l{D, Hkv, capacity, 3, 3};
  l.qjl = false;
  l.norm_correction = true;
  l.sink_tokens = 4;
  l.recent_tokens = 32;
  l.key_block = key_block;
  l.value_block = value_block;
  return l;
}

// Row t of kv head h in rotated coordinates, as the exact row holds it: bf16 of n * RHT(x / n).
std::vector<double> rotated_bf16(const std::vector<double>& x, const TqTables& tables, std::int64_t t, std::int64_t Hkv,
                                 std::int64_t h, std::int64_t D) {
  std::vector<double> y(x.begin() + (t * Hkv + h) * D, x.begin() + (t * Hkv + h + 1) * D);
  double n = 0;
  for (double e : y) n += e * e;
  n = std::sqrt(n);
  for (double& e : y) e /= n;
  core::rht(y.data(), D, tables.polar_sign_bits);
  for (double& e : y) e = double(core::bf16_to_f32(core::f32_to_bf16(float(n * e))));
  return y;
}

// Element d of the stored mean of timestep t's block.
double stored_mean(const TqLayout& l, const std::vector<std::uint32_t>& words, bool keys, std::int64_t h,
                   std::int64_t t, std::int64_t d) {
  const std::int64_t at = keys ? l.key_mean(h, t) : l.value_mean(h, t);
  return half_value(words[std::size_t(at + d / 2)], int(d % 2));
}

// Row t of kv head h decoded as docs/turboquant_layout.md says: exact row for sink and recent timesteps
// of a sequence of `end`, else the block's mean plus the norm times the centroids; rotated back.
std::vector<double> decoded(const TqLayout& l, const TqTables& tables, const std::vector<std::uint32_t>& words,
                            bool keys, std::int64_t h, std::int64_t t, std::int64_t end) {
  const std::int64_t D = l.head_dim;
  std::vector<double> y(static_cast<std::size_t>(D));
  if (const std::int64_t row = l.exact_row(t, end); row >= 0) {
    const std::uint32_t* w =
        words.data() + (keys ? l.key_exact_offset() : l.value_exact_offset()) + (h * l.exact_rows() + row) * (D / 2);
    for (std::int64_t d = 0; d < D; ++d)
      y[std::size_t(d)] = double(core::bf16_to_f32(std::uint16_t(w[d / 2] >> (16 * (d % 2)))));
  } else {
    const std::int64_t slot = h * l.capacity + t;
    const int bits = keys ? l.key_bits : l.value_bits;
    const core::Codebook& cb = core::codebook(D, bits);
    const std::uint32_t* codes = words.data() + slot * (keys ? l.key_code_words() : l.value_code_words());
    const double n = half_value(words[std::size_t((keys ? l.key_norm_offset() : l.value_norm_offset()) + slot)], 0);
    const bool means = (keys ? l.key_block : l.value_block) > 0;
    for (std::int64_t d = 0; d < D; ++d)
      y[std::size_t(d)] =
          (means ? stored_mean(l, words, keys, h, t, d) : 0.0) + n * cb.centroids[core::get_code(codes, d, bits)];
  }
  core::inverse_rht(y.data(), D, tables.polar_sign_bits);
  return y;
}

// A host tensor in a backend's memory: itself on a host backend, else a copy in a buffer of the backend.
class On {
 public:
  On(Backend& b, const HostTensor& x) : view_(x.view) {
    if (b.memory() == Memory::host) return;
    buffer_.emplace(b, x.bytes);
    view_ = x.on(buffer_->get(), b.memory());
  }
  const TensorView& view() const { return view_; }
  std::vector<std::uint8_t> read() const {
    return buffer_ ? buffer_->read<std::uint8_t>() : std::vector<std::uint8_t>{};
  }

 private:
  TensorView view_;
  std::optional<conformance::DeviceBuffer> buffer_;
};

// The backends this file runs block means on: the oracle, then every other one available here.
std::vector<std::string> backends_here() {
  std::vector<std::string> names{"reference"};
  for (const Backend* b : available_backends())
    if (b->name() != "reference") names.push_back(b->name());
  return names;
}

void append_in(TqKvCache& cache, const HostTensor& k, const HostTensor& v, const std::vector<std::int64_t>& sizes) {
  const On dk(cache.backend(), k), dv(cache.backend(), v);
  std::int64_t start = 0;
  for (std::int64_t n : sizes) {
    cache.append(0, rows_of(dk.view(), start, n), rows_of(dv.view(), start, n), start);
    start += n;
  }
}

TEST(BlockMeans, StoredMeansAreTheMeansOfTheBlocksExactRows) {
  std::mt19937_64 rng = test_rng();
  const std::int64_t D = 64, Hkv = 2, T = 150;
  const TqLayout l = block_layout(D, Hkv, 160, 16, 32);
  const std::uint64_t seed = rng();
  TqKvCache cache({1, l, seed}, &backend("reference"));
  const TqTables tables = make_tq_tables(l, seed, 0);
  const HostTensor k = drifting_rows(T, Hkv, D, rng), v = drifting_rows(T, Hkv, D, rng);
  append_in(cache, k, v, chunks(T, rng));
  const std::vector<std::uint32_t> kw = cache.key_words(0), vw = cache.value_words(0);
  for (const bool keys : {true, false}) {
    const std::int64_t g = keys ? l.key_block : l.value_block;
    const std::vector<double> x = (keys ? k : v).values();
    const std::vector<std::uint32_t>& words = keys ? kw : vw;
    for (std::int64_t h = 0; h < Hkv; ++h)
      for (std::int64_t b = 0; b * g < T; ++b) {
        const bool coded = b * g < T - l.recent_tokens;  // its first timestep has left the recent window
        std::vector<double> mean(static_cast<std::size_t>(D), 0.0);
        for (std::int64_t t = b * g; t < b * g + g && coded; ++t) {
          const std::vector<double> y = rotated_bf16(x, tables, t, Hkv, h, D);
          for (std::int64_t d = 0; d < D; ++d) mean[std::size_t(d)] += y[std::size_t(d)] / double(g);
        }
        for (std::int64_t d = 0; d < D; ++d)
          ASSERT_NEAR(stored_mean(l, words, keys, h, b * g, d), mean[std::size_t(d)],
                      1e-3 * std::abs(mean[std::size_t(d)]) + 1e-6)
              << (keys ? "keys" : "values") << " head " << h << " block " << b << " element " << d;
      }
  }
}

TEST(BlockMeans, DecodedRowsFollowTheDriftBetterThanWithoutMeans) {
  std::mt19937_64 rng = test_rng();
  const std::int64_t D = 64, Hkv = 2, T = 150;
  const std::uint64_t seed = rng();
  const HostTensor k = drifting_rows(T, Hkv, D, rng), v = drifting_rows(T, Hkv, D, rng);
  const std::vector<std::int64_t> sizes = chunks(T, rng);
  double error[2] = {};
  for (int with = 0; with < 2; ++with) {
    const TqLayout l = block_layout(D, Hkv, 160, with ? 16 : 0, with ? 16 : 0);
    TqKvCache cache({1, l, seed}, &backend("reference"));
    const TqTables tables = make_tq_tables(l, seed, 0);
    append_in(cache, k, v, sizes);
    const std::vector<std::uint32_t> kw = cache.key_words(0);
    const std::vector<double> x = k.values();
    std::vector<double> got, want;
    for (std::int64_t h = 0; h < Hkv; ++h)
      for (std::int64_t t = l.sink_tokens; t < T - l.recent_tokens; ++t) {  // coded timesteps
        const std::vector<double> r = decoded(l, tables, kw, true, h, t, T);
        got.insert(got.end(), r.begin(), r.end());
        want.insert(want.end(), x.begin() + (t * Hkv + h) * D, x.begin() + (t * Hkv + h + 1) * D);
      }
    error[with] = relative_error(got, want);
  }
  // About 70 % of these keys' energy is in the drift, which a block of 16 follows: the residual is the noise.
  EXPECT_LT(error[1], 0.75 * error[0]) << "with block means " << error[1] << ", without " << error[0];
}

// softmax(q . k~) v~ over rows decoded here, after each chunk, for the chunk's queries; `exact` as
// TqAttendArgs::exact (host backends are always exact).
double attention_error(const std::string& name, const TqLayout& l, std::mt19937_64& rng, bool exact) {
  const std::int64_t D = l.head_dim, Hkv = l.n_kv_heads, H = 2 * Hkv, T = l.capacity - 3;
  const std::uint64_t seed = rng();
  TqKvCache cache({1, l, seed}, &backend(name));
  const TqTables tables = make_tq_tables(l, seed, 0);
  const HostTensor k = drifting_rows(T, Hkv, D, rng), v = drifting_rows(T, Hkv, D, rng);
  HostTensor q({1, T, H, D}, DType::f32, false);
  q.fill_normal(rng);
  const std::vector<double> qv = q.values();
  const double scale = 1.0 / std::sqrt(double(D));
  Backend& b = cache.backend();
  const On dk(b, k), dv(b, v), dq(b, q);
  std::vector<double> got, want;
  std::int64_t start = 0;
  for (std::int64_t n : chunks(T, rng)) {
    const std::int64_t end = start + n;
    cache.append(0, rows_of(dk.view(), start, n), rows_of(dv.view(), start, n), start);
    HostTensor out({1, n, H, D}, DType::f32, false);
    out.poison();
    const On dout(b, out);
    cache.attend(0, rows_of(dq.view(), start, n), start, dout.view(), 0, exact);
    if (b.memory() != Memory::host) out.assign(dout.read());
    if (name == "cpu") {
      EXPECT_EQ(backend(name).last_kernel(), "tq_attend_simd") << "the SIMD path serves block means";
    }
    const std::vector<double> o = out.values();
    got.insert(got.end(), o.begin(), o.end());
    const std::vector<std::uint32_t> kw = cache.key_words(0), vw = cache.value_words(0);
    for (std::int64_t p = start; p < end; ++p)
      for (std::int64_t h = 0; h < H; ++h) {
        const std::int64_t kvh = h / (H / Hkv);
        std::vector<double> s(static_cast<std::size_t>(p + 1)), acc(static_cast<std::size_t>(D), 0.0);
        double m = -std::numeric_limits<double>::infinity();
        for (std::int64_t t = 0; t <= p; ++t) {
          const std::vector<double> kr = decoded(l, tables, kw, true, kvh, t, end);
          double dot = 0;
          for (std::int64_t d = 0; d < D; ++d) dot += qv[std::size_t((p * H + h) * D + d)] * kr[std::size_t(d)];
          s[std::size_t(t)] = scale * dot;
          m = std::max(m, s[std::size_t(t)]);
        }
        double sum = 0;
        for (std::int64_t t = 0; t <= p; ++t) {
          const double e = std::exp(s[std::size_t(t)] - m);
          sum += e;
          const std::vector<double> vr = decoded(l, tables, vw, false, kvh, t, end);
          for (std::int64_t d = 0; d < D; ++d) acc[std::size_t(d)] += e * vr[std::size_t(d)];
        }
        for (double a : acc) want.push_back(a / sum);
      }
    start = end;
  }
  return relative_error(got, want);
}

TEST(BlockMeans, AttentionIsTheSoftmaxOverMeanPlusCodes) {
  for (const std::string& name : backends_here()) {
    for (const auto& [D, kg, vg] : std::vector<std::tuple<std::int64_t, std::int32_t, std::int32_t>>{
             {64, 16, 32}, {64, 32, 0}, {64, 0, 8}, {128, 32, 32}}) {
      const TqLayout l = block_layout(D, 2, 120, kg, vg);
      // docs/spec.md §3: the exact path within 1e-5 of the oracle's arithmetic (2e-5 against this test's
      // decoding), a device's default bf16-class path within 1e-2.
      for (const bool exact : {true, false}) {
        if (!exact && backend(name).memory() == Memory::host) continue;
        std::mt19937_64 rng = test_rng();
        EXPECT_LT(attention_error(name, l, rng, exact), exact ? 2e-5 : 1e-2)
            << name << (exact ? " exact" : " default") << " D " << D << " key_block " << kg << " value_block " << vg;
      }
    }
  }
}

TEST(BlockMeans, WordsDoNotDependOnHowAppendsAreChunkedOrOnTheBackend) {
  std::mt19937_64 rng = test_rng();
  const std::int64_t D = 64, Hkv = 2, T = 140;
  TqLayout l = block_layout(D, Hkv, 150, 16, 16);
  l.key_outliers = 16;  // and with outlier channels, each part's slice of the residual
  l.key_outlier_bits = 4;
  const std::uint64_t seed = rng();
  const HostTensor k = drifting_rows(T, Hkv, D, rng), v = drifting_rows(T, Hkv, D, rng);
  std::vector<std::uint32_t> keys0, values0;
  for (const std::string& name : backends_here()) {
    for (int way = 0; way < 3; ++way) {
      TqKvCache cache({1, l, seed}, &backend(name));
      const On keys(backend(name), k);
      cache.calibrate(0, keys.view());
      append_in(cache, k, v, way == 0 ? std::vector<std::int64_t>{T} : chunks(T, rng));
      if (keys0.empty()) {
        keys0 = cache.key_words(0);
        values0 = cache.value_words(0);
        continue;
      }
      EXPECT_EQ(cache.key_words(0), keys0) << name << ", chunking " << way;
      EXPECT_EQ(cache.value_words(0), values0) << name << ", chunking " << way;
    }
  }
}

TEST(BlockMeans, BytesPerTokenAreTheDocumentedOnes) {
  // docs/turboquant_layout.md: D = 64, 3-bit keys and values, key blocks of 32, value blocks of 64:
  // 4 * (6 + 1 + 6 + 1) + 2 * 64 / 32 + 2 * 64 / 64 = 62; D = 128, 4-bit keys, 3-bit values, blocks of 64: 128.
  TqLayout small = block_layout(64, 1, 64, 32, 64);
  small.recent_tokens = 64;
  EXPECT_EQ(small.bytes_per_token_per_head(), 62);
  TqLayout wide = block_layout(128, 1, 64, 64, 64);
  wide.key_bits = 4;
  wide.recent_tokens = 64;
  EXPECT_EQ(wide.bytes_per_token_per_head(), 128);
  // The means' words: head_dim / 2 per block and kv head, ceil(capacity / block) blocks.
  const TqLayout l = block_layout(64, 3, 100, 16, 32);
  EXPECT_EQ(l.key_words() - l.key_mean_offset(), 3 * 7 * 32);
  EXPECT_EQ(l.value_words() - l.value_mean_offset(), 3 * 4 * 32);
}

TEST(BlockMeans, TheFileKeepsTheMeans) {
  std::mt19937_64 rng = test_rng();
  const TqLayout l = block_layout(64, 2, 100, 16, 32);
  TqKvCache cache({1, l, rng()}, &backend("reference"));
  const HostTensor k = drifting_rows(90, 2, 64, rng), v = drifting_rows(90, 2, 64, rng);
  append_in(cache, k, v, chunks(90, rng));
  char path[] = "/tmp/flashtq-block-means-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  cache.save(path);
  TqKvCache loaded = TqKvCache::load(path, &backend("reference"));
  std::remove(path);
  EXPECT_EQ(loaded.layout().key_block, 16);
  EXPECT_EQ(loaded.layout().value_block, 32);
  EXPECT_EQ(loaded.key_words(0), cache.key_words(0));
  EXPECT_EQ(loaded.value_words(0), cache.value_words(0));
  // and it goes on appending where the saved cache would (the recent window's rows come from the file)
  const HostTensor k2 = drifting_rows(5, 2, 64, rng), v2 = drifting_rows(5, 2, 64, rng);
  cache.append(0, k2.view, v2.view, 90);
  loaded.append(0, k2.view, v2.view, 90);
  EXPECT_EQ(loaded.key_words(0), cache.key_words(0));
}

TEST(BlockMeans, BadConfigurationsAndRowsAreRefusedByName) {
  auto make = [](std::int32_t kg, std::int32_t vg, bool qjl = false) {
    TqLayout l = block_layout(64, 1, 64, kg, vg);
    l.qjl = qjl;
    if (qjl) l.norm_correction = false, l.key_bits = 2;
    return [l] { TqKvCache cache({1, l, 0}, &backend("reference")); };
  };
  expect_error(make(24, 0), "key_block", "power of two in [8, 2 head_dim = 128]");
  expect_error(make(4, 0), "key_block", "power of two");
  expect_error(make(0, 256), "value_block", "power of two in [8, 2 head_dim = 128]");
  expect_error(make(64, 0), "key_block", "must not exceed recent_tokens = 32");
  expect_error(make(0, 64), "value_block", "must not exceed recent_tokens = 32");
  expect_error(make(16, 0, true), "key_block", "without QJL");
  // A row whose residual might not have an f16 norm: refused before anything is written.
  const TqLayout l = block_layout(64, 1, 64, 16, 16);
  TqKvCache cache({1, l, 0}, &backend("reference"));
  HostTensor k({1, 3, 1, 64}, DType::f32, false), v({1, 3, 1, 64}, DType::f32, false);
  // With norm correction a 3-bit code's norm word may be the norm / 0.245 (sqrt(64) times the smallest
  // centroid), so the sure bound is 65504 * 0.245 / 2.02, about 7940.
  std::vector<double> big(3 * 64, 1.0);
  for (int d = 0; d < 64; ++d) big[std::size_t(64 + d)] = 1000.0;  // row 1: norm 8000
  k.fill(big);
  v.fill(std::vector<double>(3 * 64, 1.0));
  expect_error([&] { cache.append(0, k.view, v.view, 0); }, "k", "with block means a row's norm must be at most");
  EXPECT_EQ(cache.length(0), 0);
  EXPECT_EQ(cache.key_words(0), std::vector<std::uint32_t>(std::size_t(l.key_words()), 0u));
  for (int d = 0; d < 64; ++d) big[std::size_t(64 + d)] = 900.0;  // norm 7200: fits
  k.fill(big);
  cache.append(0, k.view, v.view, 0);
  EXPECT_EQ(cache.length(0), 3);
}

}  // namespace
}  // namespace flashtq

// TqKvCache: accounting, append/attend against the low-level operations, capacity, save/load.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>

#include "conformance/device_buffer.hpp"
#include "conformance/host_tensor.hpp"
#include "flashtq/flashtq.hpp"
#include "seeded.hpp"

namespace flashtq {
namespace {

using conformance::HostTensor;

TEST(TqKvCache, SeedConfigurationCosts88BytesPerTokenPerHead) {
  TqKvCache cache({1, {128, 1, 16, 2, 2}, 0}, &backend("reference"));
  EXPECT_EQ(cache.layout().bytes_per_token_per_head(), 88);
  EXPECT_EQ(cache.bytes_per_token(), 88);
  EXPECT_NEAR(cache.compression_vs_bf16(), 5.818, 1e-3);
  TqKvCache bigger({4, {128, 8, 16, 3, 4}, 0}, &backend("reference"));
  EXPECT_EQ(bigger.layout().bytes_per_token_per_head(), 4 * (12 + 4 + 1 + 16 + 1));
  EXPECT_EQ(bigger.bytes_per_token(), 4 * 8 * 4 * 34);
}

struct Model {
  TqKvCache cache{{2, {64, 2, 32, 2, 3}, 99}, &backend("reference")};
  HostTensor k{{1, 10, 2, 64}, DType::bf16, false}, v{k};
  Model() {
    std::mt19937_64 rng = test_rng();
    k.fill_normal(rng);
    v.fill_normal(rng);
  }
};

TEST(TqKvCache, AppendAndAttendMatchTheOperations) {
  Model m;
  m.cache.append(1, m.k.view, m.v.view, 0);
  EXPECT_EQ(m.cache.length(1), 10);
  EXPECT_EQ(m.cache.length(0), 0);
  // The same words as the low-level encode with layer 1's tables.
  const TqTables t = make_tq_tables(m.cache.layout(), 99, 1);
  std::vector<std::uint32_t> keys(std::size_t(m.cache.layout().key_words()), 0u);
  tq_encode_keys(backend("reference"), {t, m.k.view, 0, keys.data(), nullptr});
  EXPECT_EQ(keys, m.cache.key_words(1));

  HostTensor q({1, 3, 4, 64}, DType::f32, false), out({1, 3, 4, 64}, DType::f32, false);
  std::mt19937_64 rng = test_rng();
  q.fill_normal(rng);
  out.poison();
  m.cache.attend(1, q.view, 7, out.view);
  for (double x : out.values()) ASSERT_TRUE(std::isfinite(x));
  EXPECT_THROW(m.cache.attend(1, q.view, 8, out.view), Error);  // rows 8..10 pass the 10 appended
  EXPECT_THROW(m.cache.attend(0, q.view, 0, out.view), Error);  // layer 0 is empty
  EXPECT_THROW(m.cache.attend(2, q.view, 0, out.view), Error);  // no layer 2
}

TEST(TqKvCache, AppendPastCapacityIsAnErrorThatLeavesTheCacheUnchanged) {
  Model m;
  m.cache.append(0, m.k.view, m.v.view, 20);
  const auto keys = m.cache.key_words(0), values = m.cache.value_words(0);
  try {
    m.cache.append(0, m.k.view, m.v.view, 25);  // 25 + 10 > 32
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "start_pos");
    EXPECT_NE(std::string(e.what()).find("cache full"), std::string::npos);
  }
  HostTensor bad_v({1, 10, 2, 32}, DType::bf16, false);
  EXPECT_THROW(m.cache.append(0, m.k.view, bad_v.view, 0), Error);  // values invalid: keys untouched too
  EXPECT_EQ(keys, m.cache.key_words(0));
  EXPECT_EQ(values, m.cache.value_words(0));
  EXPECT_EQ(m.cache.length(0), 30);
}

TEST(TqKvCache, SaveLoadRoundTripAndHeaderChecks) {
  Model m;
  m.cache.append(0, m.k.view, m.v.view, 3);
  const std::string path = ::testing::TempDir() + "/flashtq_cache.bin";
  m.cache.save(path);
  const TqKvCache loaded = TqKvCache::load(path, &backend("reference"));
  EXPECT_EQ(loaded.key_words(0), m.cache.key_words(0));
  EXPECT_EQ(loaded.value_words(0), m.cache.value_words(0));
  EXPECT_EQ(loaded.length(0), 13);
  EXPECT_EQ(loaded.config().seed, 99u);

  auto corrupt = [&](std::streamoff at, char byte) {
    std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(at);
    f.put(byte);
  };
  corrupt(8, 3);  // version 2 -> 3
  EXPECT_THROW(TqKvCache::load(path, &backend("reference")), Error);
  m.cache.save(path);
  corrupt(0, 'X');  // magic
  EXPECT_THROW(TqKvCache::load(path, &backend("reference")), Error);
  m.cache.save(path);
  { std::ofstream(path, std::ios::binary | std::ios::app).put(0); }  // a trailing byte: wrong size
  EXPECT_THROW(TqKvCache::load(path, &backend("reference")), Error);
  EXPECT_THROW(TqKvCache::load(path + ".missing", &backend("reference")), Error);
  std::remove(path.c_str());
}

// The cache on every backend, its words in that backend's memory: appended rows and attention over
// them, against the oracle's attention over the very same packed words (saved on the backend, loaded
// on the reference), and the words against the oracle's encode (codes may flip at a boundary).
class TqKvCacheOn : public ::testing::TestWithParam<std::string> {};

TEST_P(TqKvCacheOn, AttendEqualsTheOracleOnTheSameWords) {
  Backend& b = backend(GetParam());
  if (!b.available()) GTEST_SKIP() << "backend '" << b.name() << "' is not available here: " << b.unavailable_reason();
  std::mt19937_64 rng = test_rng();
  const std::int64_t D = 128, Hkv = 2, H = 8, T = 300, n = 5;
  const TqCacheConfig config{2, {D, Hkv, 512, 2, 2}, rng()};
  TqKvCache cache(config, &b);
  HostTensor k({1, T, Hkv, D}, DType::f16, false), v(k), q({1, n, H, D}, DType::f32, false),
      out({1, n, H, D}, DType::f32, false);
  k.fill_normal(rng);
  v.fill_normal(rng);
  q.fill_normal(rng);
  out.poison();
  conformance::DeviceBuffer dk(b, k.bytes), dv(b, v.bytes), dq(b, q.bytes), dout(b, out.bytes);
  cache.append(1, k.on(dk.get(), b.memory()), v.on(dv.get(), b.memory()), 0);
  cache.attend(1, q.on(dq.get(), b.memory()), T - n, out.on(dout.get(), b.memory()));
  out.assign(dout.read<std::uint8_t>());
  EXPECT_EQ(cache.length(1), T);

  const std::string path = testing::TempDir() + "flashtq_cache_on_" + b.name() + ".bin";
  cache.save(path);
  TqKvCache oracle = TqKvCache::load(path, &backend("reference"));
  std::remove(path.c_str());
  EXPECT_EQ(oracle.key_words(1), cache.key_words(1));
  HostTensor want({1, n, H, D}, DType::f32, false);
  want.poison();
  oracle.attend(1, q.view, T - n, want.view);
  const std::vector<double> got = out.values(), ref = want.values();
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << "element " << i;
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  EXPECT_LE(std::sqrt(num / den), 1e-5);

  TqKvCache encoded_by_oracle(config, &backend("reference"));
  encoded_by_oracle.append(1, k.view, v.view, 0);
  const std::vector<std::uint32_t> mine = cache.value_words(1), theirs = encoded_by_oracle.value_words(1);
  std::size_t differ = 0;
  for (std::size_t w = 0; w < mine.size(); ++w) differ += mine[w] != theirs[w];
  EXPECT_LE(double(differ), 1e-3 * double(mine.size())) << differ << " of " << mine.size() << " value words differ";
}

INSTANTIATE_TEST_SUITE_P(Backends, TqKvCacheOn, ::testing::ValuesIn([] {
                           std::vector<std::string> names;
                           for (const Backend* b : all_backends()) names.push_back(b->name());
                           return names;
                         }()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace flashtq

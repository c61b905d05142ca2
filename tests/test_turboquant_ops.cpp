// TurboQuant operations on the reference backend: zero vectors, prefill == decodes, GQA, bad input;
// the norm rule on every backend.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <stdexcept>
#include <utility>

#include "conformance/device_buffer.hpp"
#include "conformance/host_tensor.hpp"
#include "core/elements.hpp"
#include "flashtq/flashtq.hpp"
#include "core/half.hpp"
#include "core/tq_rows.hpp"
#include "reference_wrapper.hpp"
#include "seeded.hpp"
#include "tq_test_support.hpp"

namespace flashtq {
namespace {

using conformance::HostTensor;

// A filled cache (keys, values) of `tokens` timesteps and rotated queries for n rows.
struct Fixture {
  TqLayout l;
  TqTables t;
  std::vector<std::uint32_t> keys, values;
  HostTensor k, v;
  Fixture(std::int64_t D, std::int64_t Hkv, std::int64_t tokens, int kb = 2, int vb = 2, bool qjl = true)
      : l{D, Hkv, tokens, kb, vb, qjl},
        t(make_tq_tables(l, fresh_seed(), 0)),
        keys(std::size_t(l.key_words()), 0xFFFFFFFFu),
        values(std::size_t(l.value_words()), 0xFFFFFFFFu),
        k({1, tokens, Hkv, D}, DType::f32, false),
        v(k) {
    std::mt19937_64 rng = test_rng();
    k.fill_normal(rng);
    v.fill_normal(rng);
  }
  void encode() {
    tq_encode_keys(backend("reference"), {t, k.view, 0, keys.data(), nullptr});
    tq_encode_values(backend("reference"), {t, v.view, 0, values.data(), nullptr});
  }
  // Attention of queries q [1, n, H, D] at start_pos (max_seq as given) into a fresh f32 output.
  std::vector<double> attend(const HostTensor& q, std::int64_t start_pos, std::optional<std::int64_t> max_seq = {},
                             float softcap = 0.0f, const float* sinks = nullptr) {
    const std::int64_t n = q.view.shape[1], H = q.view.shape[2];
    std::vector<float> scratch(std::size_t(tq_scratch_floats(n, H, l.head_dim)));
    tq_rotate_queries(backend("reference"), {t, q.view, n, scratch.data(), nullptr});
    HostTensor out({1, n, H, l.head_dim}, DType::f32, false);
    out.poison();
    TqAttendArgs a;
    a.tables = t;
    a.scratch = scratch.data();
    a.n_heads = H;
    a.n_queries = n;
    a.start_pos = start_pos;
    a.max_seq = max_seq;
    a.softcap = softcap;
    a.sinks = sinks;
    a.k_cache = keys.data();
    a.v_cache = values.data();
    a.out = out.view;
    tq_attend(backend("reference"), a);
    return out.values();
  }
};

HostTensor random_queries(std::int64_t n, std::int64_t H, std::int64_t D) {
  HostTensor q({1, n, H, D}, DType::f32, false);
  std::mt19937_64 rng = test_rng();
  q.fill_normal(rng);
  return q;
}

TEST(TqOps, ZeroKeyAndValueGiveZeroWordsAndContributeNothing) {
  Fixture f(64, 1, 8);
  std::vector<double> k = f.k.values(), v = f.v.values();
  for (int d = 0; d < 64; ++d) k[std::size_t(5 * 64 + d)] = v[std::size_t(2 * 64 + d)] = 0.0;
  f.k.fill(k);
  f.v.fill(v);
  f.encode();
  for (std::int64_t w = 0; w < f.l.key_code_words(); ++w)
    EXPECT_EQ(f.keys[std::size_t(5 * f.l.key_code_words() + w)], 0u);
  for (std::int64_t w = 0; w < f.l.jl_words(); ++w)
    EXPECT_EQ(f.keys[std::size_t(f.l.key_jl_offset() + 5 * f.l.jl_words() + w)], 0u);
  EXPECT_EQ(f.keys[std::size_t(f.l.key_norm_offset() + 5)], 0u);
  for (std::int64_t w = 0; w < f.l.value_code_words(); ++w)
    EXPECT_EQ(f.values[std::size_t(2 * f.l.value_code_words() + w)], 0u);
  EXPECT_EQ(f.values[std::size_t(f.l.value_norm_offset() + 2)], 0u);
  // A decode over only the zero value (timestep 2 is the last one seen when it is all there is
  // besides two others) equals the same decode with the value slot removed: check via one row
  // that sees timesteps 0..2 against a cache whose slot 2 value is zeroed anyway, i.e. the result
  // is a weighted sum of values 0 and 1 only: it lies in their span.
  const HostTensor q = random_queries(1, 1, 64);
  const auto out = f.attend(q, 0);   // sees only timestep 0
  const auto out2 = f.attend(q, 2);  // sees 0, 1, 2
  EXPECT_FALSE(std::isnan(out[0]));
  EXPECT_FALSE(std::isnan(out2[0]));
  // Score of the zero key is exactly 0: a query against only timestep 5 of a zero key... a
  // softmax over one element gives weight 1 whatever the score, so compare against the value.
  Fixture g(64, 1, 1);
  std::vector<double> zero(64, 0.0);
  g.v.fill(zero);
  g.encode();
  for (double x : g.attend(q, 0)) EXPECT_EQ(x, 0.0);  // the only value is zero: output exactly 0
}

TEST(TqOps, ChunkedPrefillEqualsSingleRowDecodes) {
  Fixture f(128, 2, 40, 2, 2);
  f.encode();
  const std::int64_t n = 6, start = 30, H = 4;
  const HostTensor q = random_queries(n, H, 128);
  const auto chunk = f.attend(q, start);
  for (std::int64_t j = 0; j < n; ++j) {
    HostTensor row({1, 1, H, 128}, DType::f32, false);
    std::vector<double> qv = q.values();
    row.fill(std::vector<double>(qv.begin() + j * H * 128, qv.begin() + (j + 1) * H * 128));
    const auto single = f.attend(row, start + j);
    for (std::int64_t e = 0; e < H * 128; ++e)
      ASSERT_EQ(single[std::size_t(e)], chunk[std::size_t(j * H * 128 + e)]) << j;
  }
}

TEST(TqOps, MaxSeqClampsAndZeroLengthWritesZeros) {
  Fixture f(32, 1, 16);
  f.encode();
  const HostTensor q = random_queries(3, 2, 32);
  const auto clamped = f.attend(q, 10, 5);  // every row sees timesteps 0..4
  for (std::int64_t j = 1; j < 3; ++j)
    for (std::int64_t e = 0; e < 64; ++e) ASSERT_EQ(clamped[std::size_t(j * 64 + e)] != 0.0, true);
  const auto zero = f.attend(q, 10, 0);
  for (double x : zero) EXPECT_EQ(x, 0.0);
}

TEST(TqOps, GqaReadsTheRightKvHead) {
  // Hkv = 2, H = 4: query heads 2 and 3 read kv head 1. The same keys and values as a one-head
  // cache must give the same outputs for those heads.
  Fixture two(64, 2, 12);
  two.encode();
  Fixture one(64, 1, 12);
  one.t = two.t;  // the same signs and codebooks, over a one-head layout
  one.t.layout = one.l;
  std::vector<double> k2 = two.k.values(), v2 = two.v.values(), k1(12 * 64), v1(12 * 64);
  for (int t = 0; t < 12; ++t)
    for (int d = 0; d < 64; ++d) {
      k1[std::size_t(t * 64 + d)] = k2[std::size_t((t * 2 + 1) * 64 + d)];
      v1[std::size_t(t * 64 + d)] = v2[std::size_t((t * 2 + 1) * 64 + d)];
    }
  one.k.fill(k1);
  one.v.fill(v1);
  one.encode();
  const HostTensor q4 = random_queries(1, 4, 64);
  std::vector<double> qv = q4.values();
  HostTensor q2({1, 1, 2, 64}, DType::f32, false);
  q2.fill(std::vector<double>(qv.begin() + 128, qv.end()));
  const auto a = two.attend(q4, 11), b = one.attend(q2, 11);
  for (int e = 0; e < 128; ++e) ASSERT_EQ(a[std::size_t(128 + e)], b[std::size_t(e)]);
  bool differs = false;  // heads 0, 1 (kv head 0) see other data
  for (int e = 0; e < 128; ++e) differs |= a[std::size_t(e)] != b[std::size_t(e)];
  EXPECT_TRUE(differs);
}

TEST(TqOps, BatchedCallEqualsOneCallPerSequence) {
  // Two sequences with their own caches and start positions in one call, against two calls.
  Fixture a(64, 2, 20), b(64, 2, 20);
  b.t = a.t;
  a.encode();
  b.encode();
  std::vector<std::uint32_t> keys = a.keys, values = a.values;
  keys.insert(keys.end(), b.keys.begin(), b.keys.end());
  values.insert(values.end(), b.values.begin(), b.values.end());
  const std::int64_t H = 4, D = 64, n = 2;
  HostTensor q({2, n, H, D}, DType::f32, false);
  std::mt19937_64 rng = test_rng();
  q.fill_normal(rng);
  std::vector<float> scratch(std::size_t(tq_scratch_floats(2 * n, H, D)));
  tq_rotate_queries(backend("reference"), {a.t, q.view, 2 * n, scratch.data(), nullptr});
  const std::vector<std::int32_t> starts = {17, 5};
  HostTensor out({2, n, H, D}, DType::f32, false);
  out.poison();
  TqAttendArgs args;
  args.tables = a.t;
  args.scratch = scratch.data();
  args.n_heads = H;
  args.n_queries = n;
  args.batch = 2;
  args.start_positions = starts.data();
  args.k_cache = keys.data();
  args.v_cache = values.data();
  args.out = out.view;
  tq_attend(backend("reference"), args);
  const auto batched = out.values();
  std::vector<double> qv = q.values();
  for (int s = 0; s < 2; ++s) {
    HostTensor qs({1, n, H, D}, DType::f32, false);
    qs.fill(std::vector<double>(qv.begin() + s * n * H * D, qv.begin() + (s + 1) * n * H * D));
    const auto single = (s == 0 ? a : b).attend(qs, starts[std::size_t(s)]);
    for (std::int64_t e = 0; e < n * H * D; ++e)
      ASSERT_EQ(single[std::size_t(e)], batched[std::size_t(s * n * H * D + e)]) << s;
  }
}

TEST(TqOps, KeysWithoutQjlScoreWithTheirCodesAlone) {
  // MSE-only keys (3-bit codes, no sketch): the same 52 bytes per key at D = 128 as 2 bits + QJL, no jl
  // region, gamma 0, and a score that is the norm times the codebook dot product, read off by hand.
  const TqLayout mse{128, 1, 6, 3, 2, false}, seed{128, 1, 6, 2, 2, true};
  EXPECT_EQ(mse.key_code_words() + mse.jl_words() + 1, seed.key_code_words() + seed.jl_words() + 1);
  EXPECT_EQ(mse.jl_words(), 0);
  EXPECT_EQ(mse.key_norm_offset(), mse.slots() * mse.key_code_words());
  std::mt19937_64 rng = test_rng();
  const TqTables t = make_tq_tables(mse, rng(), 0);
  HostTensor k({1, 6, 1, 128}, DType::f32, false);
  k.fill_normal(rng);
  std::vector<std::uint32_t> keys(std::size_t(mse.key_words()), 0xFFFFFFFFu);
  tq_encode_keys(backend("reference"), {t, k.view, 0, keys.data(), nullptr});
  const HostTensor q = random_queries(1, 1, 128);
  std::vector<float> scratch(std::size_t(tq_scratch_floats(1, 1, 128)));
  tq_rotate_queries(backend("reference"), {t, q.view, 1, scratch.data(), nullptr});
  for (std::int64_t slot = 0; slot < 6; ++slot) {
    const std::uint32_t nw = keys[std::size_t(mse.key_norm_offset() + slot)];
    EXPECT_EQ(nw >> 16, 0u) << "gamma of an MSE-only key";
    double dot = 0;
    for (std::int64_t d = 0; d < 128; ++d) {
      const std::uint32_t code =
          (keys[std::size_t(slot * 12 + d * 3 / 32)] >> (d * 3 % 32)) |
          (d * 3 % 32 > 29 ? keys[std::size_t(slot * 12 + d * 3 / 32 + 1)] << (32 - d * 3 % 32) : 0u);
      dot += double(scratch[std::size_t(d)]) * t.key_codebook.centroids[code & 7u];
    }
    const double norm = core::f16_to_f32(std::uint16_t(nw & 0xFFFFu));
    EXPECT_NEAR(core::tq_key_dot(t, scratch.data(), scratch.data() + 128, scratch[256], keys.data(), slot, 1.0),
                norm * dot, 1e-9 * std::fabs(norm * dot) + 1e-12);
  }
}

TEST(TqOps, SoftcapAndSinksFollowTheirFormulas) {
  // docs/spec.md §1.8-§1.9 over the packed words: keys and values decoded by the documented formula
  // (tq_test_support.hpp), each score softcap * tanh(scale <q, k_t> / softcap), the head's sink logit in the
  // maximum and the denominator with no value; head 1 has no sink (-inf), and a row that sees no timestep
  // (max_seq 0) writes zeros with or without one.
  const std::int64_t D = 64, T = 20, H = 4, Hkv = 2;
  Fixture f(D, Hkv, T, 3, 3, false);
  f.encode();
  const HostTensor q = random_queries(2, H, D);
  const std::vector<double> qv = q.values();
  const std::vector<float> sinks{0.7f, -std::numeric_limits<float>::infinity(), -1.5f, 2.5f};
  const double scale = 1.0 / std::sqrt(double(D));
  for (const float cap : {0.0f, 0.8f, 5.0f}) {
    SCOPED_TRACE("softcap " + std::to_string(cap) + ", seed " + std::to_string(fresh_seed()));
    const std::vector<double> got = f.attend(q, T - 2, std::nullopt, cap, sinks.data());
    for (std::int64_t j = 0; j < 2; ++j)
      for (std::int64_t h = 0; h < H; ++h) {
        const std::int64_t kvh = h / (H / Hkv), seen = T - 2 + j + 1;
        std::vector<double> s(static_cast<std::size_t>(seen)), want(static_cast<std::size_t>(D), 0.0);
        double m = double(sinks[std::size_t(h)]);
        for (std::int64_t t = 0; t < seen; ++t) {
          const std::vector<double> k = testing_tq::decode(f.l, f.t, f.keys, true, kvh, t);
          double dot = 0;
          for (std::int64_t d = 0; d < D; ++d) dot += qv[std::size_t((j * H + h) * D + d)] * k[std::size_t(d)];
          const double x = scale * dot;
          s[std::size_t(t)] = cap > 0 ? cap * std::tanh(x / cap) : x;
          m = std::max(m, s[std::size_t(t)]);
        }
        double l = std::exp(double(sinks[std::size_t(h)]) - m);
        for (std::int64_t t = 0; t < seen; ++t) {
          const double p = std::exp(s[std::size_t(t)] - m);
          l += p;
          const std::vector<double> v = testing_tq::decode(f.l, f.t, f.values, false, kvh, t);
          for (std::int64_t d = 0; d < D; ++d) want[std::size_t(d)] += p * v[std::size_t(d)];
        }
        for (double& x : want) x /= l;
        const std::vector<double> row(got.begin() + (j * H + h) * D, got.begin() + (j * H + h + 1) * D);
        EXPECT_LE(testing_tq::relative_error(row, want), 1e-5) << "row " << j << " head " << h;
      }
  }
  const std::vector<double> nothing = f.attend(q, T - 2, std::int64_t(0), 5.0f, sinks.data());
  for (double x : nothing) ASSERT_EQ(x, 0.0);
}

TEST(TqOps, KeysBeforeTheWindowHaveNoInfluence) {
  // Two caches that differ only in timesteps 0..9 (different keys and values there): attention with
  // a window that starts after them gives the same outputs bit for bit; without a window they differ.
  const std::int64_t D = 64, T = 24, n = 3, window = 8;  // rows at 21..23 see (13.., ..23]
  Fixture a(D, 1, T), b(D, 1, T);
  b.t = a.t;
  std::vector<double> kb = a.k.values(), vb = a.v.values();
  std::mt19937_64 rng = test_rng();
  std::normal_distribution<double> noise(0.0, 5.0);
  for (std::int64_t i = 0; i < 10 * D; ++i) kb[std::size_t(i)] = noise(rng), vb[std::size_t(i)] = noise(rng);
  b.k.fill(kb);
  b.v.fill(vb);
  a.encode();
  b.encode();
  const HostTensor q = random_queries(n, 2, D);
  auto attend = [&](Fixture& f, std::int64_t w) {
    std::vector<float> scratch(std::size_t(tq_scratch_floats(n, 2, D)));
    tq_rotate_queries(backend("reference"), {f.t, q.view, n, scratch.data(), nullptr});
    HostTensor out({1, n, 2, D}, DType::f32, false);
    out.poison();
    TqAttendArgs args;
    args.tables = f.t;
    args.scratch = scratch.data();
    args.n_heads = 2;
    args.n_queries = n;
    args.start_pos = T - n;
    args.window = w;
    args.k_cache = f.keys.data();
    args.v_cache = f.values.data();
    args.out = out.view;
    tq_attend(backend("reference"), args);
    return out.values();
  };
  EXPECT_EQ(attend(a, window), attend(b, window));
  EXPECT_NE(attend(a, 0), attend(b, 0));
  EXPECT_NE(attend(a, window), attend(a, 0));
}

struct BadTq {
  const char* name;
  const char* argument;
  std::function<void(TqEncodeArgs&)> breaker;
};
class TqBadInput : public ::testing::TestWithParam<BadTq> {};

TEST_P(TqBadInput, RejectedNamingTheArgumentCacheUnchanged) {
  TqLayout l{64, 2, 8, 2, 2};
  HostTensor x({1, 4, 2, 64}, DType::f32, false);
  std::vector<std::uint32_t> cache(std::size_t(l.key_words()), 0x12345678u);
  TqEncodeArgs a{make_tq_tables(l, 1, 0), x.view, 0, cache.data(), nullptr};
  GetParam().breaker(a);
  try {
    tq_encode_keys(backend("reference"), a);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), GetParam().argument) << e.what();
  }
  for (auto w : cache) ASSERT_EQ(w, 0x12345678u);
}

INSTANTIATE_TEST_SUITE_P(
    Spec4, TqBadInput,
    ::testing::Values(
        BadTq{"head_dim_not_power_of_two", "head_dim", [](TqEncodeArgs& a) { a.tables.layout.head_dim = 96; }},
        BadTq{"head_dim_not_multiple_of_32", "head_dim", [](TqEncodeArgs& a) { a.tables.layout.head_dim = 16; }},
        BadTq{"head_dim_too_large", "head_dim", [](TqEncodeArgs& a) { a.tables.layout.head_dim = 512; }},
        BadTq{"key_bits", "key_bits", [](TqEncodeArgs& a) { a.tables.layout.key_bits = 4; }},
        BadTq{"value_bits", "value_bits", [](TqEncodeArgs& a) { a.tables.layout.value_bits = 1; }},
        BadTq{"cache_full", "start_pos", [](TqEncodeArgs& a) { a.start_pos = 5; }},
        BadTq{"start_pos_past_capacity", "start_pos", [](TqEncodeArgs& a) { a.start_pos = 9; }},
        BadTq{"start_pos_negative", "start_pos", [](TqEncodeArgs& a) { a.start_pos = -1; }},
        BadTq{"mismatched_heads", "x", [](TqEncodeArgs& a) { a.x.shape[2] = 1; }},
        BadTq{"mismatched_dim", "x", [](TqEncodeArgs& a) { a.x.shape[3] = 32; }},
        BadTq{"null_cache", "cache", [](TqEncodeArgs& a) { a.cache = nullptr; }},
        BadTq{"capacity_overflow", "capacity",
              [](TqEncodeArgs& a) { a.tables.layout.capacity = std::int64_t(1) << 62; }}),
    [](const auto& info) { return std::string(info.param.name); });

// A small valid decode call on host memory (head_dim 64, 4 query heads over 2 kv heads, 8 timesteps),
// for the bad-input tests to break one argument at a time.
struct AttendCall {
  Fixture f{64, 2, 8};
  std::vector<float> scratch = std::vector<float>(std::size_t(tq_scratch_floats(1, 4, 64)), 0.0f);
  HostTensor out{{1, 1, 4, 64}, DType::f32, false};
  AttendCall() { f.encode(); }
  TqAttendArgs args() const {
    TqAttendArgs a;
    a.tables = f.t;
    a.scratch = scratch.data();
    a.n_heads = 4;
    a.start_pos = 3;
    a.k_cache = f.keys.data();
    a.v_cache = f.values.data();
    a.out = out.view;
    return a;
  }
};

// tq_attend(b, a) must throw an Error naming `arg`.
void expect_rejected(Backend& b, const TqAttendArgs& a, const std::string& arg) {
  try {
    tq_attend(b, a);
    ADD_FAILURE() << "accepted: " << arg;
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), arg) << e.what();
  }
}

TEST(TqBadInput, AttendArgumentsAreChecked) {
  const AttendCall call;
  auto base = [&] { return call.args(); };
  auto expect_arg = [&](const TqAttendArgs& a, const std::string& arg) {
    expect_rejected(backend("reference"), a, arg);
  };
  auto a = base();
  a.window = -1;
  expect_arg(a, "window");
  a = base();
  a.n_heads = 3;
  expect_arg(a, "n_heads");
  a = base();
  a.start_pos = 8;
  expect_arg(a, "start_pos");
  a = base();
  a.max_seq = 9;
  expect_arg(a, "max_seq");
  a = base();
  a.out.shape[2] = 2;
  expect_arg(a, "out");
  a = base();
  a.v_cache = nullptr;
  expect_arg(a, "v_cache");
  a = base();
  a.q_cap = 0;
  a.n_queries = 2;
  a.q_cap = 1;
  expect_arg(a, "q_cap");
  for (const float cap : {-1.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    a = base();
    a.softcap = cap;
    expect_arg(a, "softcap");
  }
  for (const float sink : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> sinks(std::size_t(base().n_heads), 0.5f);
    sinks.back() = sink;
    a = base();
    a.sinks = sinks.data();
    expect_arg(a, "sinks");
  }
}

// Sizes near INT64_MAX are refused by rule, never by an overflowing sum (UBSan aborts on one, so these
// run in the sanitize build too): the encode's "cache full" message once printed start_pos + T - 1,
// and a window of INT64_MAX at a negative per-sequence start computed p - window + 1.
TEST(TqBadInput, HugeArgumentsAreRefusedWithoutOverflow) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  {
    TqLayout l{64, 2, 8, 2, 2};
    HostTensor x({1, 4, 2, 64}, DType::f32, false);
    std::vector<std::uint32_t> cache(std::size_t(l.key_words()), 0u);
    try {
      tq_encode_keys(backend("reference"), {make_tq_tables(l, 1, 0), x.view, kMax, cache.data(), nullptr});
      ADD_FAILURE() << "start_pos INT64_MAX accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "start_pos") << e.what();
    }
  }
  const AttendCall call;
  auto expect_arg = [&](const TqAttendArgs& a, const std::string& arg) {
    expect_rejected(backend("reference"), a, arg);
  };
  // n_queries beyond capacity (8), with or without max_seq and per-sequence starts: refused by name.
  const std::int32_t starts[1] = {0};
  for (std::int64_t n : {kMax, kMax - 1, kMax / 65, std::int64_t(9)}) {
    for (int variant = 0; variant < 3; ++variant) {
      TqAttendArgs a = call.args();
      a.n_queries = n;
      a.start_pos = 0;
      if (variant == 1) a.max_seq = 8;
      if (variant == 2) a.start_positions = starts;
      expect_arg(a, "n_queries");
    }
  }
  TqAttendArgs a = call.args();
  a.window = kMax;
  expect_arg(a, "window");
  a.window = std::int64_t(1) << 31;
  expect_arg(a, "window");
  // The largest window at the most negative start: sees nothing, writes zeros.
  const std::int32_t far[1] = {std::numeric_limits<std::int32_t>::min()};
  a.window = std::numeric_limits<std::int32_t>::max();
  a.start_positions = far;
  HostTensor out(call.out);
  out.poison();
  a.out = out.view;
  tq_attend(backend("reference"), a);
  for (double v : out.values()) ASSERT_EQ(v, 0.0);
  // A chunk of 2^63 - 1 rows has no scratch whose size fits in 64 bits.
  EXPECT_THROW(tq_scratch_floats(kMax, 4, 64), Error);
  EXPECT_THROW(tq_scratch_floats(-1, 4, 64), Error);
  EXPECT_EQ(tq_scratch_floats(3, 4, 64), 3 * 4 * 129);
}

// The reference backend, but asking tq_attend for a workspace as the GPU backends do: the workspace
// rules are checked on every machine, not only where a GPU is.
class WorkspaceBackend final : public ReferenceWrapper {
 public:
  static constexpr std::size_t kBytes = 256;
  std::string name() const override { return "reference-with-workspace"; }
  std::size_t tq_attend_workspace(const TqAttendCall&) const override { return kBytes; }
};

TEST(TqBadInput, WorkspaceMustBeLargeEnoughAndAligned) {
  const AttendCall call;
  WorkspaceBackend ws_backend;
  alignas(16) static unsigned char workspace[WorkspaceBackend::kBytes + 16];
  TqAttendArgs a = call.args();
  ASSERT_EQ(tq_attend_workspace_bytes(ws_backend, a), WorkspaceBackend::kBytes);
  auto expect_workspace_error = [&](void* ptr, std::size_t bytes) {
    TqAttendArgs b = a;
    b.workspace = ptr;
    b.workspace_bytes = bytes;
    expect_rejected(ws_backend, b, "workspace");
  };
  expect_workspace_error(nullptr, 0);
  expect_workspace_error(workspace, WorkspaceBackend::kBytes - 1);
  expect_workspace_error(workspace + 4, WorkspaceBackend::kBytes);  // large enough, not 16-byte aligned
  a.workspace = workspace;
  a.workspace_bytes = WorkspaceBackend::kBytes;
  EXPECT_NO_THROW(tq_attend(ws_backend, a));  // the same call with a proper workspace goes through
}

// ---- Norms f16 cannot hold (docs/spec.md §4) ----
// A row whose norm is above 65504, or that holds a NaN or an infinity, was encoded with an f16 inf norm
// (the oracle then gave NaN or dropped the key, the cpu SIMD path zero rows). It is refused, naming the
// view and the row, before any word is written, on every backend: host memory is checked on the host,
// cuda memory by a check kernel, webgpu memory on the host after a download.

Backend* backend_named(const std::string& name) {
  for (Backend* b : all_backends())
    if (b->name() == name) return b;
  return nullptr;
}

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const Backend* b : all_backends()) names.push_back(b->name());
  return names;
}

// Row (t, h) of x scaled to length `norm` (its direction kept).
void scale_row(HostTensor& x, std::int64_t t, std::int64_t h, double norm) {
  const std::int64_t D = x.view.shape[3], base = core::offset(x.view, 0, t, h);
  double n2 = 0;
  for (std::int64_t d = 0; d < D; ++d) n2 += std::pow(core::load(x.view.data, x.view.dtype, base + d), 2);
  for (std::int64_t d = 0; d < D; ++d)
    core::store(x.view.data, x.view.dtype, base + d,
                float(core::load(x.view.data, x.view.dtype, base + d) * norm / std::sqrt(n2)));
}

std::vector<double> row_of(const HostTensor& x, std::int64_t t, std::int64_t h) {
  const std::int64_t D = x.view.shape[3], base = core::offset(x.view, 0, t, h);
  std::vector<double> r(static_cast<std::size_t>(D));
  for (std::int64_t d = 0; d < D; ++d) r[std::size_t(d)] = core::load(x.view.data, x.view.dtype, base + d);
  return r;
}

constexpr std::uint32_t kUntouched = 0x12345678u;
constexpr double kF16MaxForTests = 65504.0;

// Encodes x on b into a cache of kUntouched words; returns the words after the call and the error, if any.
std::pair<std::vector<std::uint32_t>, std::optional<Error>> encode_on(Backend& b, const TqTables& t,
                                                                      const HostTensor& x, bool keys) {
  const std::int64_t words = keys ? t.layout.key_words() : t.layout.value_words();
  conformance::DeviceBuffer dx(b, x.bytes), cache(b, std::vector<std::uint32_t>(std::size_t(words), kUntouched));
  std::optional<Error> error;
  try {
    const TqEncodeArgs a{t, x.on(dx.get(), b.memory()), 0, static_cast<std::uint32_t*>(cache.get()), nullptr};
    keys ? tq_encode_keys(b, a) : tq_encode_values(b, a);
  } catch (const Error& e) {
    error = e;
  }
  return {cache.read<std::uint32_t>(), error};
}

bool f16_finite(std::uint32_t bits) { return (bits & 0x7C00u) != 0x7C00u; }

TqLayout norm_corrected(std::int64_t D, std::int64_t Hkv, std::int64_t capacity, int bits) {
  TqLayout l{D, Hkv, capacity, bits, bits};
  l.qjl = false;
  l.norm_correction = true;
  return l;
}

class TqNormRule : public ::testing::TestWithParam<std::string> {
 protected:
  Backend& under_test() {
    Backend* b = backend_named(GetParam());
    if (b == nullptr) throw std::runtime_error("no backend " + GetParam());
    return *b;
  }
};

#define SKIP_UNAVAILABLE(b)                                                                           \
  if (!(b).available())                                                                               \
  GTEST_SKIP() << "backend '" << (b).name() << "' is compiled in but not available here (no device) " \
               << (b).unavailable_reason()

TEST_P(TqNormRule, RowsWhoseNormF16CannotHoldAreRefusedCacheUnchanged) {
  Backend& b = under_test();
  SKIP_UNAVAILABLE(b);
  std::mt19937_64 rng = test_rng();
  const TqTables seed = make_tq_tables({64, 2, 16, 2, 2}, rng(), 0);
  const TqTables nc = make_tq_tables(norm_corrected(64, 2, 16, 3), rng(), 0);
  auto expect_refused = [&](const TqTables& t, const HostTensor& x, bool keys, const std::string& what) {
    const auto [words, error] = encode_on(b, t, x, keys);
    ASSERT_TRUE(error.has_value()) << what << ": accepted";
    EXPECT_EQ(error->argument(), "x") << error->what();
    EXPECT_NE(std::string(error->what()).find("(0, 2, 1)"), std::string::npos) << error->what();
    EXPECT_NE(std::string(error->what()).find("65504"), std::string::npos) << error->what();
    for (std::uint32_t w : words) ASSERT_EQ(w, kUntouched) << what << ": a rejected encode wrote the cache";
  };
  auto expect_finite = [&](const TqTables& t, const HostTensor& x, bool keys, const std::string& what) {
    const auto [words, error] = encode_on(b, t, x, keys);
    ASSERT_FALSE(error.has_value()) << what << ": " << error->what();
    const TqLayout& l = t.layout;
    const std::int64_t norm_off = keys ? l.key_norm_offset() : l.value_norm_offset();
    for (std::int64_t h = 0; h < l.n_kv_heads; ++h) {
      for (std::int64_t t = 0; t < x.view.shape[1]; ++t) {
        const std::uint32_t w = words[std::size_t(norm_off + h * l.capacity + t)];
        EXPECT_TRUE(f16_finite(w) && f16_finite(w >> 16)) << what << ": norm word " << std::hex << w;
      }
    }
  };
  for (bool keys : {true, false}) {
    const std::string kind = keys ? "keys" : "values";
    HostTensor x({1, 4, 2, 64}, DType::f32, false);
    x.fill_normal(rng);
    HostTensor big(x);
    scale_row(big, 2, 1, 7.1e4);
    expect_refused(seed, big, keys, kind + " of norm 7.1e4");
    expect_refused(nc, big, keys, kind + " of norm 7.1e4, norm correction");
    for (double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
      HostTensor odd(x);
      core::store(odd.view.data, DType::f32, core::offset(odd.view, 0, 2, 1) + 5, float(bad));
      expect_refused(seed, odd, keys, kind + " holding " + std::to_string(bad));
    }
    // f16 elements are at most 65504, their row's norm need not be: 64 elements of 10000 make 80000.
    HostTensor half({1, 4, 2, 64}, DType::f16, false);
    half.fill_normal(rng);
    for (std::int64_t d = 0; d < 64; ++d)
      core::store(half.view.data, DType::f16, core::offset(half.view, 0, 2, 1) + d, 1e4f);
    expect_refused(seed, half, keys, kind + " in f16 of norm 80000");
    // Just below the bound: stored, and as a finite f16.
    HostTensor fits(x);
    scale_row(fits, 0, 0, 65000);
    scale_row(fits, 0, 1, 65503);
    expect_finite(seed, fits, keys, kind + " of norm 65000");
    // Norm correction stores n / |c[idx]|, for most rows more than n (a decoded unit vector is shorter
    // than 1): a norm below 65504 may still be refused, for what it stores. Row (2, 1) is redrawn until
    // it is such a row.
    double ratio = 0;  // 1 / |c[idx]| of row (2, 1)
    for (int draw = 0; draw < 100 && ratio <= 1.002; ++draw) {
      HostTensor fresh({1, 4, 2, 64}, DType::f32, false);
      fresh.fill_normal(rng);
      const std::vector<double> row = row_of(fresh, 2, 1);
      for (std::int64_t d = 0; d < 64; ++d)
        core::store(x.view.data, DType::f32, core::offset(x.view, 0, 2, 1) + d, float(row[std::size_t(d)]));
      const core::EncodedRow unit = core::encode_row(row_of(x, 2, 1), nc, keys);
      ratio = unit.stored_norm / unit.norm;
    }
    ASSERT_GT(ratio, 1.002) << "no row of 100 decodes shorter than 1";
    HostTensor over(x), under(x);
    scale_row(over, 2, 1, kF16MaxForTests / ratio * 1.001);
    const core::EncodedRow o = core::encode_row(row_of(over, 2, 1), nc, keys);
    ASSERT_LT(o.norm, kF16MaxForTests);
    ASSERT_GT(o.stored_norm, kF16MaxForTests);
    expect_refused(nc, over, keys,
                   kind + " of norm " + std::to_string(o.norm) + " storing " + std::to_string(o.stored_norm));
    scale_row(under, 2, 1, kF16MaxForTests / ratio * 0.999);
    ASSERT_LT(core::encode_row(row_of(under, 2, 1), nc, keys).stored_norm, kF16MaxForTests);
    scale_row(under, 0, 1, 1e-13);  // a zero row stays a zero row
    expect_finite(nc, under, keys, kind + " storing just below 65504");
  }
}

// Among many rows (several of the cuda check's blocks), the first bad one in timestep-major order is named.
TEST_P(TqNormRule, TheFirstOfSeveralBadRowsIsNamed) {
  Backend& b = under_test();
  SKIP_UNAVAILABLE(b);
  std::mt19937_64 rng = test_rng();
  for (const TqLayout& l : {TqLayout{128, 4, 600, 2, 2}, norm_corrected(128, 4, 600, 4)}) {
    const TqTables t = make_tq_tables(l, rng(), 0);
    HostTensor x({1, 600, 4, 128}, DType::bf16, false);
    x.fill_normal(rng, 100.0);  // norms about 1100: far inside the bound
    scale_row(x, 517, 3, 1e5);
    scale_row(x, 431, 2, 9e4);
    core::store(x.view.data, DType::bf16, core::offset(x.view, 0, 599, 0), std::numeric_limits<float>::infinity());
    const auto [words, error] = encode_on(b, t, x, false);
    ASSERT_TRUE(error.has_value());
    EXPECT_NE(std::string(error->what()).find("row (0, 431, 2)"), std::string::npos) << error->what();
    for (std::uint32_t w : words) ASSERT_EQ(w, kUntouched);
    scale_row(x, 431, 2, 5e4);
    scale_row(x, 517, 3, 5e4);
    const auto [words2, error2] = encode_on(b, t, x, true);
    ASSERT_TRUE(error2.has_value());
    EXPECT_NE(std::string(error2->what()).find("row (0, 599, 0)"), std::string::npos) << error2->what();
    EXPECT_NE(std::string(error2->what()).find("NaN or an infinity"), std::string::npos) << error2->what();
  }
}

// Every dtype and head_dim (each a kernel instance on cuda): a row above the bound is refused, one just
// below is stored with the oracle's norm word, finite.
void check_every_dtype_and_head_dim(Backend& b) {
  std::mt19937_64 rng = test_rng();
  for (std::int64_t D : {32, 64, 128, 256}) {
    for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      for (const TqLayout& l : {TqLayout{D, 2, 40, 2, 2}, norm_corrected(D, 2, 40, 4)}) {
        const TqTables t = make_tq_tables(l, rng(), 0);
        const std::string what =
            "D " + std::to_string(D) + " " + dtype_name(dtype) + (l.norm_correction ? " norm correction" : "");
        HostTensor x({1, 37, 2, D}, dtype, false);
        x.fill_normal(rng);
        // Above the bound in what the row stores: with norm correction that is n / |c[idx]|, below n when the
        // decoded unit vector is longer than 1 (rare, likelier at small D), so the row grows until both the key
        // and the value encoding of it store more than 65504.
        HostTensor big(x);
        for (double norm = 7e4;; norm *= 1.05) {
          scale_row(big, 29, 1, norm);
          if (core::encode_row(row_of(big, 29, 1), t, true).stored_norm > kF16MaxForTests &&
              core::encode_row(row_of(big, 29, 1), t, false).stored_norm > kF16MaxForTests)
            break;
        }
        for (bool keys : {true, false}) {
          const auto [words, error] = encode_on(b, t, big, keys);
          ASSERT_TRUE(error.has_value()) << what << ": accepted";
          EXPECT_NE(std::string(error->what()).find("row (0, 29, 1)"), std::string::npos) << error->what();
          for (std::uint32_t w : words) ASSERT_EQ(w, kUntouched) << what;
        }
        // Just below: about 1% under 65504 in what the row stores (rounding the scaled row into a 16-bit
        // dtype moves its codes, and so |c[idx]|, a little: rescaled until it is under).
        HostTensor near(x);
        for (double target = kF16MaxForTests / 1.01, stored = kF16MaxForTests; stored >= kF16MaxForTests;
             target /= 1.01) {
          const core::EncodedRow now = core::encode_row(row_of(near, 29, 1), t, false);
          scale_row(near, 29, 1, target * now.norm / now.stored_norm);
          stored = core::encode_row(row_of(near, 29, 1), t, false).stored_norm;
        }
        const auto [words, error] = encode_on(b, t, near, false);
        ASSERT_FALSE(error.has_value()) << what << ": " << error->what();
        const auto [want, no_error] = encode_on(backend("reference"), t, near, false);
        const std::size_t at = std::size_t(l.value_norm_offset() + l.capacity + 29);  // kv head 1, timestep 29
        EXPECT_EQ(words[at], want[at]) << what;
        EXPECT_TRUE(f16_finite(words[at])) << what;
      }
    }
  }
}

TEST_P(TqNormRule, EveryDtypeAndHeadDimNearTheBound) {
  Backend& b = under_test();
  SKIP_UNAVAILABLE(b);
  check_every_dtype_and_head_dim(b);
}

INSTANTIATE_TEST_SUITE_P(Backends, TqNormRule, ::testing::ValuesIn(backend_names()),
                         [](const auto& info) { return info.param; });

// The cuda check kernel (src/cuda/tq_norm_check.cu) for each of its instances: needs a GPU.
TEST(TqNormsOnCuda, TheCheckKernelRefusesBeforeTheEncodeKernel) {
  Backend* cuda = nullptr;
  for (Backend* x : all_backends())
    if (x->name() == "cuda" && x->available()) cuda = x;
  if (cuda == nullptr) GTEST_SKIP() << "no usable cuda backend here (no GPU, or built without CUDA)";
  check_every_dtype_and_head_dim(*cuda);
}

// Keys with outlier channels: a part's norm half holds its norm / sqrt(part size / D), so with 16 outliers of
// 64 channels (the uncalibrated cache's channels 0-15) a row whose outlier part has norm 40000 (half 80000) is
// refused and one of 30000 (60000) fits, also beside a rest part of 20000 that puts the row past the bound
// that needs no parts (32752: the check then decides by the parts), on every backend alike.
TEST_P(TqNormRule, OutlierPartsHalvesAreHeldTo65504) {
  Backend& b = under_test();
  SKIP_UNAVAILABLE(b);
  TqLayout l{64, 1, 8, 3, 3};
  l.qjl = false;
  l.key_outliers = 16;
  l.key_outlier_bits = 4;
  if (auto why = b.unsupported(l)) GTEST_SKIP() << b.name() << ": " << *why;
  struct Row {
    double outlier, rest;
    bool fits;
  };
  for (const Row& r : {Row{30000, 0, true}, Row{30000, 20000, true}, Row{40000, 0, false}}) {
    TqKvCache cache({1, l, 3}, &b);
    HostTensor k({1, 2, 1, 64}, DType::f32, false), v(k);
    std::vector<double> rows(128, 0.5);
    rows[64] = r.outlier;    // row 1, channel 0: in the outlier part
    rows[64 + 16] = r.rest;  // channel 16: in the first rest part (32 channels)
    k.fill(rows);
    v.fill(std::vector<double>(128, 0.5));
    conformance::DeviceBuffer dk(b, k.bytes), dv(b, v.bytes);
    try {
      cache.append(0, k.on(dk.get(), b.memory()), v.on(dv.get(), b.memory()), 0);
      EXPECT_TRUE(r.fits) << "outlier " << r.outlier << " rest " << r.rest << ": accepted";
      EXPECT_EQ(cache.length(0), 2);
    } catch (const Error& e) {
      EXPECT_FALSE(r.fits) << "outlier " << r.outlier << " rest " << r.rest << ": " << e.what();
      EXPECT_EQ(e.argument(), "k") << e.what();
      EXPECT_NE(std::string(e.what()).find("outlier channels"), std::string::npos) << e.what();
      EXPECT_EQ(cache.length(0), 0);
    }
  }
}

// TqKvCache names k or v, and a rejected append or overwrite leaves every word and the length as they were.
TEST_P(TqNormRule, CacheAppendNamesKOrVAndChangesNothing) {
  Backend& b = under_test();
  SKIP_UNAVAILABLE(b);
  std::mt19937_64 rng = test_rng();
  for (const TqLayout& l : {TqLayout{64, 2, 32, 2, 2}, norm_corrected(64, 2, 32, 3)}) {
    TqKvCache cache({2, l, rng()}, &b);
    HostTensor k({1, 6, 2, 64}, DType::f32, false), v(k);
    k.fill_normal(rng);
    v.fill_normal(rng);
    conformance::DeviceBuffer dk(b, k.bytes), dv(b, v.bytes);
    cache.append(1, k.on(dk.get(), b.memory()), v.on(dv.get(), b.memory()), 0);
    const auto keys = cache.key_words(1), values = cache.value_words(1);
    for (const char* which : {"k", "v"}) {
      HostTensor bad = std::string(which) == "k" ? k : v;
      scale_row(bad, 2, 1, 1e6);
      conformance::DeviceBuffer dbad(b, bad.bytes);
      const TensorView kv = std::string(which) == "k" ? bad.on(dbad.get(), b.memory()) : k.on(dk.get(), b.memory());
      const TensorView vv = std::string(which) == "v" ? bad.on(dbad.get(), b.memory()) : v.on(dv.get(), b.memory());
      for (bool overwrite : {false, true}) {
        try {
          overwrite ? cache.overwrite(1, kv, vv, 0) : cache.append(1, kv, vv, 6);
          ADD_FAILURE() << which << ": accepted";
        } catch (const Error& e) {
          EXPECT_EQ(e.argument(), which) << e.what();
          EXPECT_NE(std::string(e.what()).find("65504"), std::string::npos) << e.what();
        }
        EXPECT_EQ(cache.key_words(1), keys);
        EXPECT_EQ(cache.value_words(1), values);
        EXPECT_EQ(cache.length(1), 6);
      }
    }
  }
}

}  // namespace
}  // namespace flashtq

// Regression tests of what the fuzzers (tests/fuzz/) found, one per finding, each named for what
// went wrong; the input that found it is in the harness's corpus (tests/fuzz/corpus/), which every
// fuzz run replays. The sanitize preset runs these under ASan + UBSan, where most of them failed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "flashtq/flashtq.hpp"
#include "seeded.hpp"

namespace flashtq {
namespace {

// fuzz_tq_cache: an overwrite whose rows claimed a negative count of timesteps computed
// length - T with T = -(2^63 - 1), a signed overflow (UBSan), before any argument was refused.
TEST(FuzzFindings, OverwriteWithANegativeTimestepCountIsRefused) {
  TqKvCache cache({1, {32, 1, 8, 2, 2}, 0}, &backend("reference"));
  std::vector<float> rows(8 * 32, 0.5f);
  const TensorView k = TensorView::bshd(rows.data(), DType::f32, 1, 8, 1, 32);
  cache.append(0, k, k, 0);
  const std::vector<std::uint32_t> words = cache.key_words(0);
  for (std::int64_t T :
       {std::int64_t(-1), -std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::min()}) {
    TensorView bad = k;
    bad.shape[1] = T;
    EXPECT_THROW(cache.overwrite(0, bad, bad, 0), Error) << "T = " << T;
    EXPECT_THROW(cache.overwrite(0, bad, bad, 8), Error) << "T = " << T;
  }
  EXPECT_EQ(cache.length(0), 8);
  EXPECT_EQ(cache.key_words(0), words);
}

// fuzz_tq_cache: an append whose v is refused (a misaligned pointer here) read every row of k for the
// norm rule first, so a k view larger than the memory behind it was read out of bounds (ASan). Both
// views are now checked before either's rows are read.
TEST(FuzzFindings, AnAppendRefusedForVNeverReadsK) {
  for (const char* name : {"reference", "cpu"}) {
    TqKvCache cache({1, {32, 1, 8, 2, 2}, 0}, &backend(name));
    std::vector<float> one_row(32, 0.5f), rows(8 * 32 + 1, 0.5f);
    const TensorView k = TensorView::bshd(one_row.data(), DType::f32, 1, 8, 1, 32);  // claims 8 rows, has 1
    TensorView v = TensorView::bshd(rows.data(), DType::f32, 1, 8, 1, 32);
    v.data = reinterpret_cast<char*>(rows.data()) + 1;  // not aligned to its element
    try {
      cache.append(0, k, v, 0);
      ADD_FAILURE() << name << ": an append with a misaligned v was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "v") << name << ": " << e.what();
    }
    EXPECT_EQ(cache.length(0), 0) << name;
  }
}

// attend grew its query scratch for the rows and heads q claimed before it checked q: a q of 2^31
// heads (with a null pointer, or an out of another shape) asked for a 558 GB scratch, which threw
// std::bad_alloc (ASan: out of memory) instead of the Error naming the argument.
TEST(FuzzFindings, AttendChecksItsViewsBeforeGrowingTheScratch) {
  for (const char* name : {"reference", "cpu"}) {
    TqKvCache cache({1, {32, 1, 8, 2, 2}, 0}, &backend(name));
    std::vector<float> rows(4 * 32, 0.5f), q(32), out(32);
    const TensorView k = TensorView::bshd(rows.data(), DType::f32, 1, 4, 1, 32);
    cache.append(0, k, k, 0);
    const TensorView out_view = TensorView::bshd(out.data(), DType::f32, 1, 1, 1, 32);
    TensorView many_heads = TensorView::bshd(q.data(), DType::f32, 1, 1, std::int64_t(1) << 31, 32);
    EXPECT_THROW(cache.attend(0, many_heads, 3, out_view), Error) << name;  // out has 1 head
    many_heads.data = nullptr;
    TensorView out_many = out_view;
    out_many.shape[2] = many_heads.shape[2];
    out_many.strides = many_heads.strides;
    try {
      cache.attend(0, many_heads, 3, out_many);
      ADD_FAILURE() << name << ": a null q was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "q") << name;
    }
    // The cache still attends normally afterwards.
    cache.attend(0, TensorView::bshd(q.data(), DType::f32, 1, 1, 1, 32), 3, out_view);
  }
}

// fuzz_dense: mask strides that reach exactly element 2^63 - 1 were refused with a message that
// computed "needs last + 1" in int64, a signed overflow (UBSan) while building the Error.
TEST(FuzzFindings, MaskStridesReachingInt64MaxAreRefusedWithoutOverflow) {
  std::vector<float> q(2 * 4, 0.5f), k(q), v(q), out(q), mask(4, 0.0f);
  AttentionParams p;
  p.mask = mask.data();
  p.mask_strides = {0, 0, 0, std::numeric_limits<std::int64_t>::max()};  // Sk = 2: the last key at 2^63 - 1
  p.mask_elements = std::int64_t(mask.size());
  const ForwardArgs args{TensorView::bshd(q.data(), DType::f32, 1, 2, 1, 4),
                         TensorView::bshd(k.data(), DType::f32, 1, 2, 1, 4),
                         TensorView::bshd(v.data(), DType::f32, 1, 2, 1, 4),
                         TensorView::bshd(out.data(), DType::f32, 1, 2, 1, 4),
                         nullptr,
                         nullptr};
  try {
    attention_forward(backend("reference"), args, p);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "mask_elements");
    EXPECT_NE(std::string(e.what()).find("needs 9223372036854775808"), std::string::npos) << e.what();
  }
}

// Seen while fixing the one above, in the same pattern: an encode at start_pos 2^63 - 1 is refused
// (cache full) with a message that computed start_pos + T - 1 in int64, a signed overflow for T >= 2.
// The harnesses reach the cache object, whose appends are contiguous, not this low-level call.
TEST(FuzzFindings, EncodeAtTheLargestStartPositionIsRefusedWithoutOverflow) {
  const TqLayout layout{32, 1, 8, 2, 2};
  const TqTables tables = make_tq_tables(layout, 0, 0);
  std::vector<float> rows(2 * 32, 0.5f);
  std::vector<std::uint32_t> cache(std::size_t(layout.key_words()), 0u);
  try {
    tq_encode_keys(backend("reference"), {tables, TensorView::bshd(rows.data(), DType::f32, 1, 2, 1, 32),
                                          std::numeric_limits<std::int64_t>::max(), cache.data(), nullptr});
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "start_pos");
    // The message names the start as given, with no sum that could overflow.
    EXPECT_NE(std::string(e.what()).find("cache full: 2 timesteps from 9223372036854775807"), std::string::npos)
        << e.what();
  }
}

// fuzz_dense: a subnormal softcap (1e-40 here) made the cpu backend's SIMD softcap multiply by its
// reciprocal, +inf, so a score of exactly 0 became 0 * inf = NaN after the finiteness check: the row
// lost its only visible key (out 0, lse -inf where the oracle has a finite lse). The softcap now
// divides and keeps tanh's argument finite. Rows of zeros among random ones, forward and backward
// (causal, a mask), cpu against the oracle.
TEST(FuzzFindings, ASubnormalSoftcapKeepsZeroScoresFinite) {
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  constexpr std::int64_t B = 1, S = 35, H = 2, D = 40;
  const std::size_t n = std::size_t(B * S * H * D);
  std::vector<float> q(n), k(n), v(n), dout(n), mask(1, 4.8f);
  for (auto* x : {&q, &k, &v, &dout})
    for (float& e : *x) e = normal(rng);
  for (std::int64_t i = 0; i < S; i += 3)  // every third query row is zero: all its scores are exactly 0
    std::fill(q.begin() + i * H * D, q.begin() + (i + 1) * H * D, 0.0f);
  AttentionParams p;
  p.causal = true;
  p.causal_offset = 0;
  p.softcap = 1e-40f;
  p.mask = mask.data();
  p.mask_strides = {0, 0, 0, 0};
  p.mask_elements = 1;
  auto view = [&](std::vector<float>& x) { return TensorView::bshd(x.data(), DType::f32, B, S, H, D); };
  struct Result {
    std::vector<float> out, lse, dq, dk, dv;
  };
  auto run = [&](const char* name) {
    const float poison = std::numeric_limits<float>::quiet_NaN();
    Result r{std::vector<float>(n, poison), std::vector<float>(std::size_t(B * H * S), poison),
             std::vector<float>(n, poison), std::vector<float>(n, poison), std::vector<float>(n, poison)};
    attention_forward(backend(name), {view(q), view(k), view(v), view(r.out), r.lse.data(), nullptr}, p);
    attention_backward(
        backend(name),
        {view(q), view(k), view(v), view(r.out), view(dout), r.lse.data(), view(r.dq), view(r.dk), view(r.dv), nullptr},
        p);
    return r;
  };
  const Result want = run("reference"), got = run("cpu");
  auto expect_near = [&](const std::vector<float>& w, const std::vector<float>& g, const char* what) {
    for (std::size_t e = 0; e < w.size(); ++e) {
      ASSERT_TRUE(std::isfinite(w[e])) << what << "[" << e << "] of the oracle; input seed " << seed;
      ASSERT_NEAR(g[e], w[e], 1e-5 * (1.0 + std::abs(w[e]))) << what << "[" << e << "]; seed " << seed;
    }
  };
  expect_near(want.lse, got.lse, "lse");
  expect_near(want.out, got.out, "out");
  expect_near(want.dq, got.dq, "dq");
  expect_near(want.dk, got.dk, "dk");
  expect_near(want.dv, got.dv, "dv");
}

}  // namespace
}  // namespace flashtq

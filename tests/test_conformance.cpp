// The conformance suite, parameterised over every available backend: fresh random cases of every
// operation compared with the oracle at docs/spec.md §3 tolerances. A backend plugs in by registering.
#include <gtest/gtest.h>

#include <ostream>
#include <random>

#include "conformance/conformance.hpp"
#include "flashtq/flashtq.hpp"
#include "seeded.hpp"

namespace flashtq {
namespace {

constexpr int kCasesPerBackend = 12;

struct SuiteCase {
  std::string backend;
  int index;
};

// Readable test names and values in reports ("cuda #3" rather than the struct's bytes).
void PrintTo(const SuiteCase& c, std::ostream* os) { *os << c.backend << " #" << c.index; }

std::vector<SuiteCase> suite_cases() {
  std::vector<SuiteCase> cases;
  for (const Backend* b : all_backends())
    for (int i = 0; i < kCasesPerBackend; ++i) cases.push_back({b->name(), i});
  return cases;
}

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const Backend* b : all_backends()) names.push_back(b->name());
  return names;
}

Backend& named_backend(const std::string& name) {
  Backend* found = nullptr;
  for (Backend* b : all_backends())
    if (b->name() == name) found = b;
  return *found;
}

void expect_pass(const conformance::CheckResult& r) {
  EXPECT_TRUE(r.passed) << r.op << " [" << r.description << "] error " << r.error << " > " << r.tolerance << " "
                        << r.detail;
}

// A backend that is compiled in but has no device here skips its cases, saying so.
#define SKIP_WITHOUT_DEVICE(b) \
  if (!(b).available())        \
  GTEST_SKIP() << "backend '" << (b).name() << "' is compiled in but not available here (no device)"

class Conformance : public ::testing::TestWithParam<SuiteCase> {
 protected:
  Backend& under_test() { return named_backend(GetParam().backend); }
  std::mt19937_64 rng = test_rng();
};

TEST_P(Conformance, DenseForwardAndBackward) {
  Backend& b = under_test();
  if (!b.available())
    GTEST_SKIP() << "backend '" << b.name() << "' is compiled in but not available here (no device) "
                 << b.unavailable_reason();
  const auto c = conformance::draw_dense_case(rng, b);
  expect_pass(conformance::check_forward(b, c));
  expect_pass(conformance::check_backward(b, conformance::backward_case(c)));
}

TEST_P(Conformance, DropoutBitExact) {
  Backend& b = under_test();
  if (!b.available())
    GTEST_SKIP() << "backend '" << b.name() << "' is compiled in but not available here (no device) "
                 << b.unavailable_reason();
  expect_pass(conformance::check_dropout(b, std::uint32_t(rng()), 0.05f + 0.07f * float(GetParam().index)));
}

TEST_P(Conformance, TurboQuantEncodeRotateAttend) {
  Backend& b = under_test();
  if (!b.available())
    GTEST_SKIP() << "backend '" << b.name() << "' is compiled in but not available here (no device) "
                 << b.unavailable_reason();
  const auto c = conformance::draw_tq_case(rng, b);
  expect_pass(conformance::check_tq_encode(b, c));
  expect_pass(conformance::check_tq_rotate(b, c));
  expect_pass(conformance::check_tq_attend(b, c));
}

TEST_P(Conformance, TurboQuantDecodeShapes) {
  Backend& b = under_test();
  if (!b.available())
    GTEST_SKIP() << "backend '" << b.name() << "' is compiled in but not available here (no device) "
                 << b.unavailable_reason();
  expect_pass(conformance::check_tq_attend(b, conformance::draw_tq_decode_case(rng, b)));
}

TEST_P(Conformance, TurboQuantPrefillShapes) {
  Backend& b = under_test();
  if (!b.available())
    GTEST_SKIP() << "backend '" << b.name() << "' is compiled in but not available here (no device) "
                 << b.unavailable_reason();
  expect_pass(conformance::check_tq_attend(b, conformance::draw_tq_prefill_case(rng, b)));
}

INSTANTIATE_TEST_SUITE_P(Backends, Conformance, ::testing::ValuesIn(suite_cases()),
                         [](const auto& info) { return info.param.backend + "_" + std::to_string(info.param.index); });

// A few hundred rows and keys: several tiles, row blocks and pipeline stages of the tiled kernels,
// with every feature drawn (conformance cases above stay within one or two tiles).
class LongSequences : public ::testing::TestWithParam<SuiteCase> {};

TEST_P(LongSequences, DenseForwardAndBackward) {
  Backend* b = &named_backend(GetParam().backend);
  SKIP_WITHOUT_DEVICE(*b);
  std::mt19937_64 rng = test_rng();
  const auto c = conformance::draw_long_dense_case(rng, *b);
  for (const auto& r :
       {conformance::check_forward(*b, c), conformance::check_backward(*b, conformance::backward_case(c))})
    expect_pass(r);
}

INSTANTIATE_TEST_SUITE_P(Backends, LongSequences, ::testing::ValuesIn([] {
                           std::vector<SuiteCase> cases;
                           for (const Backend* b : all_backends())
                             for (int i = 0; i < 3; ++i) cases.push_back({b->name(), i});
                           return cases;
                         }()),
                         [](const auto& info) { return info.param.backend + "_" + std::to_string(info.param.index); });

// head_dim 512 (docs/spec.md §1: every backend takes D in {32, 64, 96, 128, 256, 512}), forward and backward in every
// dtype, with GQA and, drawn per dtype, causal rows, softcap, sinks and dropout.
class HeadDim512 : public ::testing::TestWithParam<std::string> {};

TEST_P(HeadDim512, DenseForwardAndBackward) {
  Backend* b = &named_backend(GetParam());
  SKIP_WITHOUT_DEVICE(*b);
  std::mt19937_64 rng = test_rng();
  for (const DType t : {DType::f32, DType::f16, DType::bf16}) {
    conformance::DenseCase c;
    c.dtype = t, c.D = 512, c.B = 2, c.H = 4, c.Hkv = 2;
    c.Sq = std::int64_t(rng() % 24 + 1), c.Sk = std::int64_t(rng() % 40 + 1);
    c.causal = rng() % 2 == 0;
    c.softcap = rng() % 3 == 0 ? 5.0f : 0.0f;
    c.sinks = rng() % 3 == 0;
    c.dropout_p = rng() % 3 == 0 ? 0.2f : 0.0f;
    c.seed = std::uint32_t(rng());
    c.data_seed = rng();
    ASSERT_FALSE(b->unsupported(c.shape())) << *b->unsupported(c.shape());
    for (const auto& r : {conformance::check_forward(*b, c), conformance::check_backward(*b, c)}) expect_pass(r);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, HeadDim512, ::testing::ValuesIn(backend_names()),
                         [](const auto& info) { return info.param; });

// Thousands of keys per row: error that grows with the key count shows only here (the suites above
// stay under ~500 keys). The cuda f32 forward's default path once accumulated O in tensor-core
// accumulators, which truncate: 1e-4 at 16k keys against docs/spec.md §3's 1e-5.
class LongKeyRanges : public ::testing::TestWithParam<std::string> {};

TEST_P(LongKeyRanges, F32Forward) {
  Backend* b = &named_backend(GetParam());
  SKIP_WITHOUT_DEVICE(*b);
  std::mt19937_64 rng = test_rng();
  conformance::DenseCase c;
  c.B = 1;
  c.H = c.Hkv = 1;
  c.D = 128;
  c.Sq = 40;
  c.Sk = 16389;  // a ragged last tile
  c.dtype = DType::f32;
  if (const auto why = b->unsupported(c.shape()))
    GTEST_SKIP() << "backend '" << b->name() << "' refuses this shape: " << *why;
  for (bool pedantic : {false, true}) {  // cuda: error-compensated TF32, then FFMA
    c.pedantic = pedantic;
    c.data_seed = rng();
    expect_pass(conformance::check_forward(*b, c));
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, LongKeyRanges, ::testing::ValuesIn(backend_names()),
                         [](const auto& info) { return info.param; });

// Shapes whose launch grids pass a GPU's per-dimension limits (65535 blocks in y and z): more query
// rows than fit in one TurboQuant launch, more (batch, head) pairs than one dense launch takes.
class LargeGrids : public ::testing::TestWithParam<std::string> {};

TEST_P(LargeGrids, TurboQuantRowsAndDenseHeads) {
  Backend* b = &named_backend(GetParam());
  SKIP_WITHOUT_DEVICE(*b);
  std::mt19937_64 rng = test_rng();
  conformance::TqCase tq;
  tq.layout.head_dim = 32;
  tq.tokens = tq.layout.capacity = 70004;
  tq.n_queries = 70000;
  tq.max_seq = 4;
  tq.seed = rng();
  tq.data_seed = rng();
  expect_pass(conformance::check_tq_attend(*b, tq));
  conformance::DenseCase dense;
  dense.B = 256;
  dense.H = dense.Hkv = 257;
  dense.D = 32;
  dense.dtype = DType::bf16;
  dense.data_seed = rng();
  expect_pass(conformance::check_forward(*b, dense));
}

INSTANTIATE_TEST_SUITE_P(Backends, LargeGrids, ::testing::ValuesIn(backend_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace flashtq

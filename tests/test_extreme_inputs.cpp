// docs/spec.md §3's policy for non-finite and extreme inputs, on every backend: a key a row does not
// see never reaches it (whatever its keys and values hold), a score at or below -1e30 is masked with
// or without a mask, scores past f32's range still give the oracle's softmax, and the backward's
// probabilities stay probabilities at large scores. Issue 18 item 3's cases, each as found, then the
// conformance suite's Extreme kinds on fresh random shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "conformance/conformance.hpp"
#include "flashtq/flashtq.hpp"
#include "seeded.hpp"

namespace flashtq {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

class ExtremeInputs : public ::testing::TestWithParam<std::string> {
 protected:
  Backend& under_test() {
    for (Backend* b : all_backends())
      if (b->name() == GetParam()) return *b;
    throw std::logic_error("no backend " + GetParam());
  }
};

// One f32 [1, S, H, D] tensor in the backend's memory, filled from host values.
struct Tensor {
  std::vector<float> host;
  std::int64_t S, H, D;
  void* device = nullptr;
  Backend* backend = nullptr;
  Tensor(Backend& b, std::int64_t S_, std::int64_t H_, std::int64_t D_, float fill)
      : host(std::size_t(S_ * H_ * D_), fill), S(S_), H(H_), D(D_), backend(&b) {}
  ~Tensor() {
    if (device) backend->release(device);
  }
  float& at(std::int64_t s, std::int64_t h, std::int64_t d) { return host[std::size_t((s * H + h) * D + d)]; }
  TensorView view() {
    if (!device) device = backend->allocate(host.size() * sizeof(float));
    backend->upload(device, host.data(), host.size() * sizeof(float));
    return TensorView::bshd(device, DType::f32, 1, S, H, D, backend->memory());
  }
  std::vector<float> read() {
    backend->download(host.data(), device, host.size() * sizeof(float));
    return host;
  }
};

#define SKIP_WITHOUT_DEVICE(b)                                                                        \
  if (!(b).available())                                                                               \
  GTEST_SKIP() << "backend '" << (b).name() << "' is compiled in but not available here (no device) " \
               << (b).unavailable_reason()

// Found on the cpu backend: a NaN (or inf) in a value row that a causal query cannot see, in the
// same 64-key tile, made that query's output NaN, and its dq.
TEST_P(ExtremeInputs, NaNValueOfAnUnseenKeyStaysOut) {
  Backend& b = under_test();
  SKIP_WITHOUT_DEVICE(b);
  const std::int64_t S = 64, D = 32;
  std::mt19937_64 rng = test_rng();
  std::normal_distribution<float> normal;
  Tensor q(b, S, 1, D, 0), k(b, S, 1, D, 0), v(b, S, 1, D, 0), dout(b, S, 1, D, 0), out(b, S, 1, D, kNaN);
  Tensor lse(b, 1, 1, S, kNaN), dq(b, S, 1, D, kNaN), dk(b, S, 1, D, kNaN), dv(b, S, 1, D, kNaN);
  for (Tensor* t : {&q, &k, &v, &dout})
    for (float& x : t->host) x = normal(rng);
  for (std::int64_t d = 0; d < D; ++d) v.at(S - 1, 0, d) = d % 2 ? kNaN : kInf;  // seen by the last row only
  AttentionParams params;
  params.causal = true;
  const TensorView qv = q.view(), kv = k.view(), vv = v.view(), ov = out.view();
  float* lse_device = static_cast<float*>(lse.view().data);
  attention_forward(b, {qv, kv, vv, ov, lse_device, nullptr}, params);
  attention_backward(b, {qv, kv, vv, ov, dout.view(), lse_device, dq.view(), dk.view(), dv.view(), nullptr}, params);
  b.synchronize();
  const std::vector<float> got = out.read(), got_dq = dq.read();
  for (std::int64_t i = 0; i < S - 1; ++i)
    for (std::int64_t d = 0; d < D; ++d) {
      ASSERT_TRUE(std::isfinite(got[std::size_t(i * D + d)])) << "out row " << i << " column " << d;
      ASSERT_TRUE(std::isfinite(got_dq[std::size_t(i * D + d)])) << "dq row " << i << " column " << d;
    }
}

// Found on the cpu backend: with no mask, scores at or below -1e30 were not masked (q = 1e16,
// k = -1e16 gave out = v and lse = -1e32 instead of out = 0 and lse = -inf).
TEST_P(ExtremeInputs, ScoresAtMostMinus1e30AreMaskedWithoutAMask) {
  Backend& b = under_test();
  SKIP_WITHOUT_DEVICE(b);
  const std::int64_t S = 3, D = 4;
  Tensor q(b, 1, 1, D, 1e16f), k(b, S, 1, D, -1e16f), v(b, S, 1, D, 7.0f), out(b, 1, 1, D, kNaN);
  Tensor lse(b, 1, 1, 1, kNaN);
  AttentionParams params;
  params.scale = 1.0f;
  attention_forward(b, {q.view(), k.view(), v.view(), out.view(), static_cast<float*>(lse.view().data), nullptr},
                    params);
  b.synchronize();
  for (float x : out.read()) EXPECT_EQ(x, 0.0f);
  EXPECT_EQ(lse.read()[0], -kInf);
}

// Found on the cpu backend: finite inputs whose f32 score overflows (q = k = 1e20 at D = 4) were
// taken for an empty row; the oracle's softmax is finite: uniform over equal scores here.
TEST_P(ExtremeInputs, ScoresPastF32StillGiveTheSoftmax) {
  Backend& b = under_test();
  SKIP_WITHOUT_DEVICE(b);
  const std::int64_t S = 4, D = 4;
  Tensor q(b, 1, 1, D, 1e20f), k(b, S, 1, D, 1e20f), v(b, S, 1, D, 0), out(b, 1, 1, D, kNaN);
  for (std::int64_t j = 0; j < S; ++j)
    for (std::int64_t d = 0; d < D; ++d) v.at(j, 0, d) = float(j + d);
  attention_forward(b, {q.view(), k.view(), v.view(), out.view(), nullptr, nullptr}, {});
  b.synchronize();
  const std::vector<float> got = out.read();
  for (std::int64_t d = 0; d < D; ++d) EXPECT_FLOAT_EQ(got[std::size_t(d)], 1.5f + float(d)) << "column " << d;
}

// The conformance suite's Extreme kinds (conformance.hpp), forward and backward, on fresh shapes:
// each kind checked against the oracle at the spec's bounds. The backward at scores of 1e4 to 1e5 once
// gave dv up to 8.7e6 instead of about 2 (an lse a little below the f32 score).
TEST_P(ExtremeInputs, ConformanceKinds) {
  Backend& b = under_test();
  SKIP_WITHOUT_DEVICE(b);
  std::mt19937_64 rng = test_rng();
  for (conformance::Extreme kind : {conformance::Extreme::hidden_non_finite, conformance::Extreme::large_scores,
                                    conformance::Extreme::scores_past_masked, conformance::Extreme::scores_past_f32}) {
    for (int n = 0; n < 3; ++n) {
      const conformance::DenseCase c = conformance::with_extreme(conformance::draw_dense_case(rng, b), kind, rng);
      for (const auto& r :
           {conformance::check_forward(b, c), conformance::check_backward(b, conformance::backward_case(c))}) {
        EXPECT_TRUE(r.passed) << r.op << " [" << r.description << "] error " << r.error << " > " << r.tolerance << " "
                              << r.detail;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, ExtremeInputs, ::testing::ValuesIn([] {
                           std::vector<std::string> names;
                           for (const Backend* b : all_backends()) names.push_back(b->name());
                           return names;
                         }()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace flashtq

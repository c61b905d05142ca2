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
#include "conformance/device_buffer.hpp"
#include "conformance/host_tensor.hpp"
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

// Found on cuda (the bf16 decode kernel, PagedOnCuda with FLASHTQ_TEST_SEED=4903088662383852643): a score whose
// dot product passes f32's range on the way and comes back finite (here the first half of the dims adds -1.3e39,
// the second half +1.3e39 and 1 % more) can end at -inf in f32, where the sum runs in that order, which read as a
// row without keys (LSE -inf, zeros) against the oracle's finite softmax. Every key alike: uniform weights. One
// query row (the decode kernels) and 64 (the tiled forwards), every row the same.
TEST_P(ExtremeInputs, ScoresPastF32ThatEndAtMinusInfStillGiveTheSoftmax) {
  Backend& b = under_test();
  SKIP_WITHOUT_DEVICE(b);
  std::mt19937_64 rng = test_rng();
  const std::int64_t S = 40, D = 256;
  for (const auto& [dtype, Sq] : {std::pair{DType::f32, 1}, std::pair{DType::bf16, 1}, std::pair{DType::f32, 64},
                                  std::pair{DType::bf16, 64}}) {  // 1e19 is past f16's range
    SCOPED_TRACE(std::string(dtype_name(dtype)) + ", Sq " + std::to_string(Sq));
    conformance::HostTensor q({1, Sq, 1, D}, dtype, false), k({1, S, 1, D}, dtype, false), v(k), out(q);
    q.map([](auto...) { return 1e19f; });
    k.map([](std::int64_t, std::int64_t, std::int64_t, float) { return 0.0f; });
    for (std::int64_t j = 0; j < S; ++j)
      k.set_row(0, j, 0, [&](std::int64_t d) { return d < D / 2 ? -1e18 : 1.0157e18; });
    v.fill_normal(rng);
    // The premise: summed in order of dims in f32, the dot product is -inf; in double it is finite and positive.
    float f32_sum = 0.0f;
    double exact = 0.0;
    const std::vector<double> qv = q.values(), kv = k.values();
    for (std::int64_t d = 0; d < D; ++d) {
      f32_sum += float(qv[std::size_t(d)]) * float(kv[std::size_t(d)]);
      exact += qv[std::size_t(d)] * kv[std::size_t(d)];
    }
    ASSERT_EQ(f32_sum, -kInf);
    ASSERT_TRUE(std::isfinite(exact) && exact > 0.0) << exact;

    conformance::HostTensor want(out);
    std::vector<float> want_lse(static_cast<std::size_t>(Sq));
    attention_forward(backend("reference"), {q.view, k.view, v.view, want.view, want_lse.data(), nullptr}, {});
    ASSERT_TRUE(std::isfinite(want_lse[0]) && want_lse[0] > 1e30f) << want_lse[0];
    conformance::DeviceBuffer dq(b, q.bytes), dk(b, k.bytes), dv(b, v.bytes), dout(b, out.bytes),
        dlse(b, std::vector<float>(std::size_t(Sq), kNaN));
    out.poison();
    attention_forward(b,
                      {q.on(dq.get(), b.memory()), k.on(dk.get(), b.memory()), v.on(dv.get(), b.memory()),
                       out.on(dout.get(), b.memory()), static_cast<float*>(dlse.get()), nullptr},
                      {});
    b.synchronize();
    out.assign(dout.read<std::uint8_t>());
    std::string detail;
    EXPECT_LE(conformance::relative_error(want.values(), out.values(), detail), 1e-2)
        << b.last_kernel() << " " << detail;
    const std::vector<float> got_lse = dlse.read<float>();
    for (std::int64_t i = 0; i < Sq; ++i)
      EXPECT_NEAR(got_lse[std::size_t(i)], want_lse[std::size_t(i)], 1e-3 * want_lse[std::size_t(i)])
          << b.last_kernel() << " row " << i;
  }
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

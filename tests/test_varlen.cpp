// Ragged batches (docs/spec.md §1.6) through the public API on every backend that has them: each sequence of a packed
// batch against the brute-force formula (forward) and the oracle (backward) on that sequence alone, with
// every feature drawn (causal, window, per-sequence masks, dropout by the sequence's batch index, softcap,
// sinks); and every bad ragged input refused, naming the argument, before anything is written.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "backend_mirror.hpp"
#include "brute_force.hpp"
#include "conformance/host_tensor.hpp"
#include "forward_refusal.hpp"
#include "flashtq/flashtq.hpp"
#include "reference/dense.hpp"
#include "seeded.hpp"

namespace flashtq {
namespace {

using conformance::HostTensor;
using conformance::relative_error;

struct Ragged {
  std::int64_t B, H, Hkv, D, max_q, max_k;
  DType dtype;
  std::vector<std::int32_t> cu_q, cu_k;
  std::vector<float> mask, sinks;
  std::vector<std::int64_t> mask_offsets;
  AttentionParams params;
  std::int64_t Tq() const { return cu_q.back(); }
  std::int64_t Tk() const { return cu_k.back(); }
};

Ragged draw(std::mt19937_64& rng, int index) {
  auto range = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  Ragged r;
  r.B = range(1, 5);
  r.Hkv = range(1, 2);
  r.H = r.Hkv * range(1, 3);
  r.D = std::array<std::int64_t, 3>{16, 32, 64}[std::size_t(range(0, 2))];
  r.dtype = std::array<DType, 3>{DType::f32, DType::f16, DType::bf16}[std::size_t(index % 3)];
  r.max_q = 12;
  r.max_k = 15;
  r.cu_q = {0};
  r.cu_k = {0};
  for (std::int64_t b = 0; b < r.B; ++b) {  // empty sequences (no rows, or no keys) included
    r.cu_q.push_back(r.cu_q.back() + std::int32_t(range(0, 4) == 0 ? 0 : range(1, r.max_q)));
    r.cu_k.push_back(r.cu_k.back() + std::int32_t(range(0, 4) == 0 ? 0 : range(1, r.max_k)));
  }
  if (r.Tq() == 0) r.cu_q.back() = 1, r.cu_q[1] = std::max(r.cu_q[1], 1);  // q and k views need a row
  for (std::size_t b = 1; b < r.cu_q.size(); ++b) r.cu_q[b] = std::max(r.cu_q[b], r.cu_q[b - 1]);
  if (r.Tk() == 0) r.cu_k.back() = 1;
  AttentionParams& p = r.params;
  p.causal = range(0, 1) == 1;
  if (range(0, 3) == 0) p.causal_offset = range(-2, 4);
  if (range(0, 2) == 0) p.window = range(1, 6);
  if (range(0, 2) == 0) {
    p.dropout_p = 0.25f;
    p.seed = std::uint32_t(rng());
  }
  if (range(0, 2) == 0) p.softcap = 2.0f;
  std::normal_distribution<float> n(0.0f, 1.0f);
  if (range(0, 1) == 0) {  // one [H, max_q, max_k] block per sequence, addressed with local rows and keys
    const std::int64_t block = r.H * r.max_q * r.max_k;
    r.mask.resize(std::size_t(r.B * block));
    for (float& m : r.mask) m = range(0, 9) == 0 ? -INFINITY : n(rng);
    for (std::int64_t b = 0; b < r.B; ++b) r.mask_offsets.push_back(b * block);
    p.mask = r.mask.data();
    p.mask_strides = {0, r.max_q * r.max_k, r.max_k, 1};
    p.mask_elements = std::int64_t(r.mask.size());
  }
  if (range(0, 1) == 0) {
    for (std::int64_t h = 0; h < r.H; ++h) r.sinks.push_back(h == 0 ? -INFINITY : n(rng) + 1.0f);
    p.sinks = r.sinks.data();
  }
  Varlen v;
  v.batch = r.B;
  v.cu_seqlens_q = r.cu_q.data();
  v.cu_seqlens_k = r.cu_k.data();
  v.max_seqlen_q = range(0, 1) == 0 ? 0 : r.max_q;
  v.max_seqlen_k = range(0, 1) == 0 ? 0 : r.max_k;
  v.mask_offsets = r.mask_offsets.empty() ? nullptr : r.mask_offsets.data();
  p.varlen = v;
  return r;
}

// Sequence b of a packed [1, T, heads, D] tensor as rows of a batch of b + 1 whose earlier batches are zero, so
// that the formula's batch index (and so its dropout decisions) is b.
std::vector<double> as_batch(const std::vector<double>& packed, std::int64_t heads, std::int64_t D, std::int64_t first,
                             std::int64_t n, std::int64_t b) {
  std::vector<double> x(std::size_t((b + 1) * n * heads * D), 0.0);
  std::copy(packed.begin() + first * heads * D, packed.begin() + (first + n) * heads * D,
            x.begin() + b * n * heads * D);
  return x;
}

DenseProblem sequence_problem(const Ragged& r, std::int64_t b, std::int64_t B) {
  DenseProblem p;
  p.B = B;
  p.Sq = r.cu_q[std::size_t(b) + 1] - r.cu_q[std::size_t(b)];
  p.Sk = r.cu_k[std::size_t(b) + 1] - r.cu_k[std::size_t(b)];
  p.H = r.H;
  p.Hkv = r.Hkv;
  p.D = r.D;
  p.dtype = r.dtype;
  p.scale = float(1.0 / std::sqrt(double(r.D)));
  p.causal = r.params.causal;
  p.causal_offset = r.params.causal_offset.value_or(p.Sk - p.Sq);
  p.window = r.params.window;
  p.dropout_p = r.params.dropout_p;
  p.seed = r.params.seed;
  p.softcap = r.params.softcap;
  p.sinks = r.params.sinks;
  if (r.params.mask) {  // batch index b of the formula reads sequence b's block
    p.mask = r.mask.data();
    p.mask_strides = {r.H * r.max_q * r.max_k, r.max_q * r.max_k, r.max_k, 1};
  }
  return p;
}

double tolerance(DType t) { return t == DType::f32 ? 2e-5 : t == DType::f16 ? 4e-3 : 2e-2; }

class VarlenOn : public ::testing::TestWithParam<const char*> {};

TEST_P(VarlenOn, EverySequenceEqualsTheFormulaAndTheOracleOnItsOwn) {
  std::string why;
  Backend* found = testing::usable(GetParam(), why);
  if (found == nullptr) GTEST_SKIP() << why;
  Backend& be = *found;
  std::mt19937_64 rng = test_rng();
  for (int index = 0; index < 24; ++index) {
    const Ragged r = draw(rng, index);
    SCOPED_TRACE("case " + std::to_string(index) + ": B " + std::to_string(r.B) + ", H " + std::to_string(r.H) + "/" +
                 std::to_string(r.Hkv) + ", D " + std::to_string(r.D) + ", " + dtype_name(r.dtype));
    HostTensor q({1, r.Tq(), r.H, r.D}, r.dtype, index % 2 == 1), k({1, r.Tk(), r.Hkv, r.D}, r.dtype, false), v(k);
    q.fill_normal(rng);
    k.fill_normal(rng);
    v.fill_normal(rng);
    HostTensor out(q);
    out.poison();
    std::vector<float> lse(std::size_t(r.H * r.Tq()), std::numeric_limits<float>::quiet_NaN());
    testing::Mirror on(be);  // the mask and sinks in the backend's memory too; cu_seqlens stay on the host
    AttentionParams params = r.params;
    params.mask = on.in(r.mask);
    params.sinks = on.in(r.sinks);
    attention_forward(be, {on.in(q), on.in(k), on.in(v), on.out(out), on.out(lse), nullptr}, params);
    on.read_back();

    // The formula, sequence by sequence, packed back into [Tq, H, D] and [H, Tq].
    const std::vector<double> qd = q.values(), kd = k.values(), vd = v.values();
    std::vector<double> want_out(qd.size(), 0.0), want_lse(lse.size(), 0.0);
    for (std::int64_t b = 0; b < r.B; ++b) {
      const std::int64_t q0 = r.cu_q[std::size_t(b)], k0 = r.cu_k[std::size_t(b)];
      const DenseProblem p = sequence_problem(r, b, b + 1);
      if (p.Sq == 0) continue;
      const auto f =
          testing::brute_force_attention(p, as_batch(qd, r.H, r.D, q0, p.Sq, b), as_batch(kd, r.Hkv, r.D, k0, p.Sk, b),
                                         as_batch(vd, r.Hkv, r.D, k0, p.Sk, b));
      std::copy(f.out.begin() + b * p.Sq * r.H * r.D, f.out.end(), want_out.begin() + q0 * r.H * r.D);
      for (std::int64_t h = 0; h < r.H; ++h)
        for (std::int64_t i = 0; i < p.Sq; ++i)
          want_lse[std::size_t(h * r.Tq() + q0 + i)] = f.lse[std::size_t((b * r.H + h) * p.Sq + i)];
    }
    std::string detail;
    EXPECT_LE(relative_error(want_out, out.values(), detail), tolerance(r.dtype)) << "out " << detail;
    EXPECT_LE(relative_error(want_lse, std::vector<double>(lse.begin(), lse.end()), detail, 1.0), 2e-5)
        << "lse " << detail;

    // The backward against the oracle on each sequence alone (its batch index for dropout), from the same out
    // and lse; rows and keys of empty sequences get zero gradients.
    HostTensor dout(q), dq(q), dk(k), dv(k);
    dout.fill_normal(rng);
    dq.poison();
    dk.poison();
    dv.poison();
    std::vector<float> dsinks(r.params.sinks ? std::size_t(r.H) : 0, std::numeric_limits<float>::quiet_NaN());
    testing::Mirror back(be);
    params.mask = back.in(r.mask);
    params.sinks = back.in(r.sinks);
    attention_backward(be,
                       {back.in(q), back.in(k), back.in(v), back.in(out), back.in(dout), back.in(lse), back.out(dq),
                        back.out(dk), back.out(dv), nullptr, back.out(dsinks)},
                       params);
    back.read_back();
    const std::vector<double> od = out.values(), dod = dout.values();
    std::vector<double> want_dq(qd.size(), 0.0), want_dk(kd.size(), 0.0), want_dv(kd.size(), 0.0),
        want_dsinks(std::size_t(r.H), 0.0);
    for (std::int64_t b = 0; b < r.B; ++b) {
      const std::int64_t q0 = r.cu_q[std::size_t(b)], k0 = r.cu_k[std::size_t(b)];
      DenseProblem p = sequence_problem(r, b, 1);
      if (p.Sq == 0 || p.Sk == 0) continue;
      p.batch0 = b;
      if (p.mask) p.mask += r.mask_offsets[std::size_t(b)];
      auto rows = [](const std::vector<double>& x, std::int64_t first, std::int64_t n, std::int64_t width) {
        return std::vector<double>(x.begin() + first * width, x.begin() + (first + n) * width);
      };
      std::vector<double> seq_lse(std::size_t(r.H * p.Sq));
      for (std::int64_t h = 0; h < r.H; ++h)
        for (std::int64_t i = 0; i < p.Sq; ++i)
          seq_lse[std::size_t(h * p.Sq + i)] = lse[std::size_t(h * r.Tq() + q0 + i)];
      std::vector<double> gq(std::size_t(p.Sq * r.H * r.D)), gk(std::size_t(p.Sk * r.Hkv * r.D)), gv(gk.size()),
          gs(std::size_t(r.H));
      reference::dense_backward(p, rows(qd, q0, p.Sq, r.H * r.D).data(), rows(kd, k0, p.Sk, r.Hkv * r.D).data(),
                                rows(vd, k0, p.Sk, r.Hkv * r.D).data(), rows(od, q0, p.Sq, r.H * r.D).data(),
                                rows(dod, q0, p.Sq, r.H * r.D).data(), seq_lse.data(), gq.data(), gk.data(), gv.data(),
                                gs.data());
      std::copy(gq.begin(), gq.end(), want_dq.begin() + q0 * r.H * r.D);
      std::copy(gk.begin(), gk.end(), want_dk.begin() + k0 * r.Hkv * r.D);
      std::copy(gv.begin(), gv.end(), want_dv.begin() + k0 * r.Hkv * r.D);
      for (std::int64_t h = 0; h < r.H; ++h) want_dsinks[std::size_t(h)] += gs[std::size_t(h)];
    }
    const double floor = 0.1 * std::sqrt(double(r.D));  // docs/spec.md §3's gradient floor at the default scale
    EXPECT_LE(relative_error(want_dq, dq.values(), detail, floor), tolerance(r.dtype)) << "dq " << detail;
    EXPECT_LE(relative_error(want_dk, dk.values(), detail, floor), tolerance(r.dtype)) << "dk " << detail;
    EXPECT_LE(relative_error(want_dv, dv.values(), detail, floor), tolerance(r.dtype)) << "dv " << detail;
    if (r.params.sinks) {
      EXPECT_LE(relative_error(want_dsinks, std::vector<double>(dsinks.begin(), dsinks.end()), detail, 0.1), 2e-5)
          << "dsinks " << detail;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, VarlenOn,
                         ::testing::ValuesIn(testing::compiled({"reference", "cpu", "webgpu", "cuda"})));

TEST(VarlenBadInput, RefusedNamingTheArgumentBeforeWriting) {
  std::vector<std::int32_t> cu_q{0, 2, 4}, cu_k{0, 3, 6};
  HostTensor q({1, 4, 2, 16}, DType::f32, false), k({1, 6, 1, 16}, DType::f32, false), v(k), out(q);
  std::mt19937_64 rng = test_rng();
  q.fill_normal(rng);
  auto expect = [&](const std::string& argument, auto&& breaker) {
    AttentionParams p;
    Varlen vl{2, cu_q.data(), cu_k.data()};
    ForwardArgs a{q.view, k.view, v.view, out.view, nullptr, nullptr};
    std::vector<std::int32_t> saved_q = cu_q, saved_k = cu_k;
    breaker(vl, a, p);
    p.varlen = vl;
    testing::expect_forward_refused(backend("cpu"), a, p, out, argument);
    cu_q = saved_q;
    cu_k = saved_k;
  };
  std::vector<float> mask(64, 0.0f);
  std::vector<std::int64_t> offsets{0, 100};
  expect("cu_seqlens_q", [&](Varlen& v, ForwardArgs&, AttentionParams&) { v.cu_seqlens_q = nullptr; });
  expect("cu_seqlens_q", [&](Varlen&, ForwardArgs&, AttentionParams&) { cu_q[0] = 1; });
  expect("cu_seqlens_q", [&](Varlen&, ForwardArgs&, AttentionParams&) { cu_q[1] = 5; });  // decreasing after
  expect("cu_seqlens_q", [&](Varlen&, ForwardArgs&, AttentionParams&) { cu_q[2] = 3; });  // not Tq at the end
  expect("cu_seqlens_k", [&](Varlen&, ForwardArgs&, AttentionParams&) { cu_k[2] = 7; });
  expect("max_seqlen_q", [&](Varlen& v, ForwardArgs&, AttentionParams&) { v.max_seqlen_q = 1; });
  expect("max_seqlen_k", [&](Varlen& v, ForwardArgs&, AttentionParams&) { v.max_seqlen_k = -1; });
  expect("varlen", [&](Varlen& v, ForwardArgs&, AttentionParams&) { v.batch = 0; });
  expect("q", [&](Varlen&, ForwardArgs& a, AttentionParams&) {
    a.q.shape = {2, 2, 2, 16};
    a.out.shape = a.q.shape;
  });
  expect("mask_offsets", [&](Varlen& v, ForwardArgs&, AttentionParams&) { v.mask_offsets = offsets.data(); });
  expect("mask_offsets", [&](Varlen& v, ForwardArgs&, AttentionParams& p) {
    p.mask = mask.data();
    p.mask_elements = 64;
    v.mask_offsets = offsets.data();  // 100 is past the mask
  });
  std::vector<std::int64_t> late{0, 5};
  expect("mask_elements", [&](Varlen& v, ForwardArgs&, AttentionParams& p) {  // sequence 1's rows pass the mask's end
    p.mask = mask.data();
    p.mask_strides = {0, 0, 16, 1};
    p.mask_elements = 20;
    v.mask_offsets = late.data();
  });
  for (Backend* b : available_backends()) {
    if (b->memory() == Memory::host) continue;
    HostTensor dummy(q);
    AttentionParams p;
    p.varlen = Varlen{2, cu_q.data(), cu_k.data()};
    TensorView dq = q.view;
    dq.memory = b->memory();
    TensorView dk = k.view;
    dk.memory = b->memory();
    try {
      attention_forward(*b, {dq, dk, dk, dq, nullptr, nullptr}, p);
      ADD_FAILURE() << b->name() << " accepted a ragged batch";
    } catch (const Error& e) {
      EXPECT_TRUE(e.argument() == "varlen" || e.argument() == "q") << e.what();
    }
  }
}

// cuda runs a ragged batch as one launch per sequence of the kernel its kernel choice gives that sequence: on
// Hopper, sequences of bf16 rows at head_dim 128 run the wgmma forward and backward (the last launch's kernel is
// recorded), with out, lse and the gradients those of the reference backend on the same batch.
TEST(VarlenOnCuda, EachSequenceRunsTheTensorCoreKernels) {
  std::string why;
  Backend* gpu = testing::usable("cuda", why);
  if (gpu == nullptr) GTEST_SKIP() << why << " (a ragged batch on cuda is checked on the GPU machine)";
  std::mt19937_64 rng = test_rng();
  const std::int64_t H = 8, Hkv = 2, D = 128;
  std::vector<std::int32_t> cu_q{0, 300, 300, 517, 1541}, cu_k{0, 300, 700, 917, 1941};  // one sequence without rows
  AttentionParams p;
  p.causal = true;
  p.varlen = Varlen{4, cu_q.data(), cu_k.data(), 0, 0, nullptr};
  HostTensor q({1, cu_q.back(), H, D}, DType::bf16, false), k({1, cu_k.back(), Hkv, D}, DType::bf16, false), v(k);
  q.fill_normal(rng);
  k.fill_normal(rng);
  v.fill_normal(rng);
  HostTensor dout(q);
  dout.fill_normal(rng);
  struct Result {
    HostTensor out, dq, dk, dv;
    std::vector<float> lse;
  };
  auto run = [&](Backend& be, bool check_kernels) {
    Result r{HostTensor(q), HostTensor(q), HostTensor(k), HostTensor(k),
             std::vector<float>(std::size_t(H * cu_q.back()), std::numeric_limits<float>::quiet_NaN())};
    for (HostTensor* t : {&r.out, &r.dq, &r.dk, &r.dv}) t->poison();
    testing::Mirror on(be);
    const TensorView qv = on.in(q), kv = on.in(k), vv = on.in(v), out = on.out(r.out);
    float* lse = on.out(r.lse);
    attention_forward(be, {qv, kv, vv, out, lse, nullptr}, p);
    if (check_kernels) EXPECT_EQ(be.last_kernel(), "dense_forward_wgmma");
    attention_backward(be, {qv, kv, vv, out, on.in(dout), lse, on.out(r.dq), on.out(r.dk), on.out(r.dv), nullptr}, p);
    if (check_kernels) EXPECT_EQ(be.last_kernel(), "dense_backward_wgmma");
    on.read_back();
    return r;
  };
  const Result want = run(backend("reference"), false), got = run(*gpu, true);
  std::string detail;
  EXPECT_LE(relative_error(want.out.values(), got.out.values(), detail), 1e-2) << "out " << detail;
  EXPECT_LE(relative_error(std::vector<double>(want.lse.begin(), want.lse.end()),
                           std::vector<double>(got.lse.begin(), got.lse.end()), detail, 1.0),
            1e-3)
      << "lse " << detail;
  const double floor = 0.1 * std::sqrt(double(D));
  EXPECT_LE(relative_error(want.dq.values(), got.dq.values(), detail, floor), 2e-2) << "dq " << detail;
  EXPECT_LE(relative_error(want.dk.values(), got.dk.values(), detail, floor), 2e-2) << "dk " << detail;
  EXPECT_LE(relative_error(want.dv.values(), got.dv.values(), detail, floor), 2e-2) << "dv " << detail;
}

// A decode step of a ragged batch (one query row per sequence, keys of very different lengths) on cuda: each
// sequence runs the decode kernel, the call's workspace (its size from attention_forward_workspace_bytes, poisoned)
// serving the sequences in turn so that the long ones split their keys; out and lse as the reference backend's.
TEST(VarlenOnCuda, ADecodeStepSplitsEachSequencesKeysWithTheWorkspace) {
  std::string why;
  Backend* gpu = testing::usable("cuda", why);
  if (gpu == nullptr) GTEST_SKIP() << why << " (a ragged batch on cuda is checked on the GPU machine)";
  std::mt19937_64 rng = test_rng();
  const std::int64_t H = 8, Hkv = 2, D = 128;
  std::vector<std::int32_t> cu_q{0, 1, 2, 3}, cu_k{0, 3000, 3017, 8017};
  AttentionParams p;
  p.causal = true;
  p.varlen = Varlen{3, cu_q.data(), cu_k.data(), 0, 0, nullptr};
  HostTensor q({1, 3, H, D}, DType::bf16, false), k({1, cu_k.back(), Hkv, D}, DType::bf16, false), v(k);
  q.fill_normal(rng);
  k.fill_normal(rng);
  v.fill_normal(rng);
  HostTensor want(q), got(q);
  std::vector<float> want_lse(std::size_t(H * 3)), got_lse(want_lse.size(), std::numeric_limits<float>::quiet_NaN());
  attention_forward(backend("reference"), {q.view, k.view, v.view, want.view, want_lse.data(), nullptr}, p);
  got.poison();
  testing::Mirror on(*gpu);
  ForwardArgs a{on.in(q), on.in(k), on.in(v), on.out(got), on.out(got_lse), nullptr};
  const std::size_t bytes = attention_forward_workspace_bytes(*gpu, a, p);
  EXPECT_GT(bytes, 0u) << "the 5000-key sequence should split its keys";
  const std::vector<std::uint8_t> poison(bytes, 0xFF);
  a.workspace = const_cast<std::uint8_t*>(on.in(poison));
  a.workspace_bytes = bytes;
  attention_forward(*gpu, a, p);
  EXPECT_EQ(gpu->last_kernel(), "dense_forward_decode");
  on.read_back();
  std::string detail;
  EXPECT_LE(relative_error(want.values(), got.values(), detail), 1e-2) << "out " << detail;
  EXPECT_LE(relative_error(std::vector<double>(want_lse.begin(), want_lse.end()),
                           std::vector<double>(got_lse.begin(), got_lse.end()), detail, 1.0),
            1e-3)
      << "lse " << detail;
}

}  // namespace
}  // namespace flashtq

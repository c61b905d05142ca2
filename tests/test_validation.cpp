// Every bad input of docs/spec.md §4 is rejected with the library error naming the argument, before any
// output is written.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <new>
#include <optional>
#include <random>
#include <stdexcept>
#include <thread>
#include <typeinfo>
#include <utility>

#include "conformance/conformance.hpp"
#include "conformance/device_buffer.hpp"
#include "conformance/host_tensor.hpp"
#include "flashtq/flashtq.hpp"
#include "reference_wrapper.hpp"
#include "seeded.hpp"

// AddressSanitizer (gcc says so with __SANITIZE_ADDRESS__, clang through __has_feature).
#if defined(__SANITIZE_ADDRESS__)
#define FLASHTQ_TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FLASHTQ_TEST_UNDER_ASAN 1
#endif
#endif
#ifndef FLASHTQ_TEST_UNDER_ASAN
#define FLASHTQ_TEST_UNDER_ASAN 0
#endif

namespace flashtq {
namespace {

using conformance::HostTensor;

// A valid small problem that each case breaks in one way.
struct Dense {
  HostTensor q{{1, 4, 4, 32}, DType::f32, false};
  HostTensor k{{1, 6, 2, 32}, DType::f32, false};
  HostTensor v{k};
  HostTensor out{q};
  HostTensor dout{q}, dq{q}, dk{k}, dv{k};
  std::vector<float> lse = std::vector<float>(16, 0.0f);
  std::vector<float> mask = std::vector<float>(4 * 6, 0.0f);
  AttentionParams params;
  ForwardArgs fwd() { return {q.view, k.view, v.view, out.view, lse.data(), nullptr}; }
  BackwardArgs bwd() {
    return {q.view, k.view, v.view, out.view, dout.view, lse.data(), dq.view, dk.view, dv.view, nullptr};
  }
};

struct BadDense {
  const char* name;
  const char* argument;
  std::function<void(Dense&, ForwardArgs&, AttentionParams&)> breaker;
};

class DenseBadInput : public ::testing::TestWithParam<BadDense> {};

TEST_P(DenseBadInput, RejectedNamingTheArgument) {
  Dense d;
  d.out.poison();
  ForwardArgs args = d.fwd();
  GetParam().breaker(d, args, d.params);
  try {
    attention_forward(backend("reference"), args, d.params);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), GetParam().argument) << e.what();
    EXPECT_NE(std::string(e.what()).find(GetParam().argument), std::string::npos);
  }
  for (double x : d.out.values()) ASSERT_TRUE(std::isnan(x)) << "output written by a rejected call";
}

const std::int64_t kHuge = std::int64_t(1) << 40;

INSTANTIATE_TEST_SUITE_P(
    Spec4, DenseBadInput,
    ::testing::Values(
        BadDense{"k_shape", "k", [](Dense&, ForwardArgs& a, AttentionParams&) { a.k.shape[3] = 16; }},
        BadDense{"k_batch", "k", [](Dense&, ForwardArgs& a, AttentionParams&) { a.k.shape[0] = 2; }},
        BadDense{"v_shape", "v", [](Dense&, ForwardArgs& a, AttentionParams&) { a.v.shape[1] = 5; }},
        BadDense{"out_shape", "out", [](Dense&, ForwardArgs& a, AttentionParams&) { a.out.shape[2] = 2; }},
        BadDense{"heads_not_multiple", "k", [](Dense&, ForwardArgs& a, AttentionParams&) {
                   a.k.shape[2] = 3; a.v.shape[2] = 3; }},
        BadDense{"head_dim_too_large", "q", [](Dense&, ForwardArgs& a, AttentionParams&) {
                   static HostTensor big({1, 1, 1, 600}, DType::f32, false);
                   static HostTensor bigk({1, 1, 1, 600}, DType::f32, false);
                   a.q = big.view; a.k = bigk.view; a.v = bigk.view; a.out = bigk.view; }},
        BadDense{"dtype_mismatch", "k", [](Dense&, ForwardArgs& a, AttentionParams&) { a.k.dtype = DType::f16; }},
        BadDense{"dtype_not_a_dtype", "q", [](Dense&, ForwardArgs& a, AttentionParams&) {
                   a.q.dtype = static_cast<DType>(7); }},
        BadDense{"batch_times_heads_overflows", "q", [](Dense&, ForwardArgs& a, AttentionParams&) {
                   // B = H = 2^32 with stride-1 views: every extent fits, B * H does not (issue 18).
                   a.q.shape = {std::int64_t(1) << 32, 1, std::int64_t(1) << 32, 32};
                   a.q.strides = {1, 1, 1, 1};
                   a.k.shape = {std::int64_t(1) << 32, 6, 2, 32};
                   a.k.strides = {1, 1, 1, 1};
                   a.v = a.k;
                   a.out = a.q; }},
        BadDense{"dropout_negative", "dropout_p", [](Dense&, ForwardArgs&, AttentionParams& p) { p.dropout_p = -0.1f; }},
        BadDense{"dropout_one", "dropout_p", [](Dense&, ForwardArgs&, AttentionParams& p) { p.dropout_p = 1.0f; }},
        BadDense{"dropout_nan", "dropout_p", [](Dense&, ForwardArgs&, AttentionParams& p) {
                   p.dropout_p = std::numeric_limits<float>::quiet_NaN(); }},
        BadDense{"window_negative", "window", [](Dense&, ForwardArgs&, AttentionParams& p) { p.window = -1; }},
        BadDense{"window_overflow", "window", [](Dense&, ForwardArgs&, AttentionParams& p) { p.window = kHuge; }},
        BadDense{"offset_overflow", "causal_offset", [](Dense&, ForwardArgs&, AttentionParams& p) {
                   p.causal = true; p.causal_offset = std::numeric_limits<std::int32_t>::max(); }},
        BadDense{"offset_underflow", "causal_offset", [](Dense&, ForwardArgs&, AttentionParams& p) {
                   p.causal_offset = -kHuge; }},
        BadDense{"scale_nan", "scale", [](Dense&, ForwardArgs&, AttentionParams& p) {
                   p.scale = std::numeric_limits<float>::infinity(); }},
        BadDense{"q_null", "q", [](Dense&, ForwardArgs& a, AttentionParams&) { a.q.data = nullptr; }},
        BadDense{"q_misaligned", "q", [](Dense&, ForwardArgs& a, AttentionParams&) {
                   a.q.data = static_cast<char*>(a.q.data) + 1; }},
        BadDense{"lse_misaligned", "lse", [](Dense&, ForwardArgs& a, AttentionParams&) {
                   a.lse = reinterpret_cast<float*>(reinterpret_cast<char*>(a.lse) + 2); }},
        BadDense{"q_stride_not_contiguous", "q", [](Dense&, ForwardArgs& a, AttentionParams&) { a.q.strides[3] = 2; }},
        BadDense{"q_negative_stride", "q", [](Dense&, ForwardArgs& a, AttentionParams&) { a.q.strides[1] = -128; }},
        BadDense{"q_zero_dim", "q", [](Dense&, ForwardArgs& a, AttentionParams&) { a.q.shape[1] = 0; }},
        BadDense{"element_count_overflow", "k", [](Dense&, ForwardArgs& a, AttentionParams&) {
                   a.k.strides[1] = std::numeric_limits<std::int64_t>::max() / 2; }},
        BadDense{"wrong_memory", "q", [](Dense&, ForwardArgs& a, AttentionParams&) { a.q.memory = Memory::cuda; }},
        BadDense{"mask_too_small", "mask_elements", [](Dense& d, ForwardArgs&, AttentionParams& p) {
                   p.mask = d.mask.data(); p.mask_strides = {0, 0, 6, 1}; p.mask_elements = 10; }},
        BadDense{"mask_negative_stride", "mask_strides", [](Dense& d, ForwardArgs&, AttentionParams& p) {
                   p.mask = d.mask.data(); p.mask_strides = {0, 0, -6, 1}; p.mask_elements = 24; }},
        BadDense{"mask_stride_overflow", "mask_strides", [](Dense& d, ForwardArgs&, AttentionParams& p) {
                   p.mask = d.mask.data(); p.mask_strides = {0, 0, std::numeric_limits<std::int64_t>::max() / 2, 1};
                   p.mask_elements = 24; }},
        BadDense{"mask_misaligned", "mask", [](Dense& d, ForwardArgs&, AttentionParams& p) {
                   p.mask = reinterpret_cast<const float*>(reinterpret_cast<const char*>(d.mask.data()) + 1);
                   p.mask_strides = {0, 0, 6, 1}; p.mask_elements = 24; }},
        BadDense{"softcap_negative", "softcap", [](Dense&, ForwardArgs&, AttentionParams& p) { p.softcap = -1.0f; }},
        BadDense{"softcap_nan", "softcap", [](Dense&, ForwardArgs&, AttentionParams& p) {
                   p.softcap = std::numeric_limits<float>::quiet_NaN(); }},
        BadDense{"softcap_infinite", "softcap", [](Dense&, ForwardArgs&, AttentionParams& p) {
                   p.softcap = std::numeric_limits<float>::infinity(); }},
        BadDense{"sinks_misaligned", "sinks", [](Dense& d, ForwardArgs&, AttentionParams& p) {
                   p.sinks = reinterpret_cast<const float*>(reinterpret_cast<const char*>(d.mask.data()) + 2); }},
        BadDense{"sink_nan", "sinks", [](Dense& d, ForwardArgs&, AttentionParams& p) {
                   d.mask[3] = std::numeric_limits<float>::quiet_NaN(); p.sinks = d.mask.data(); }},
        BadDense{"sink_plus_infinity", "sinks", [](Dense& d, ForwardArgs&, AttentionParams& p) {
                   d.mask[1] = std::numeric_limits<float>::infinity(); p.sinks = d.mask.data(); }}),
    [](const auto& info) { return std::string(info.param.name); });

// Query positions i + causal_offset, i in [0, Sq), may be any int32 (issue 18 item 7): the validator
// once refused the last position 2^31 - 1 and the first -2^31 although every position fits.
TEST(DensePositions, EveryInt32PositionIsAccepted) {
  constexpr std::int64_t lo = std::numeric_limits<std::int32_t>::min(), hi = std::numeric_limits<std::int32_t>::max();
  const std::int64_t Sq = 4;
  auto run = [&](std::int64_t offset) {
    Dense d;
    d.params.causal = true;
    d.params.causal_offset = offset;
    attention_forward(backend("reference"), d.fwd(), d.params);
  };
  EXPECT_NO_THROW(run(hi - (Sq - 1)));  // the last row at 2^31 - 1
  EXPECT_NO_THROW(run(lo));             // the first row at -2^31
  for (std::int64_t beyond : {hi - (Sq - 1) + 1, lo - 1}) {
    try {
      run(beyond);
      ADD_FAILURE() << "accepted causal_offset " << beyond;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "causal_offset") << e.what();
    }
  }
}

// At both ends of the int32 positions every backend's forward and backward equal the oracle, with
// and without a window, causal or not (the webgpu kernels compute key ranges in i32).
class DensePositionEdges : public ::testing::TestWithParam<std::string> {};

TEST_P(DensePositionEdges, ForwardAndBackwardEqualTheOracle) {
  Backend* b = nullptr;
  for (Backend* x : all_backends())
    if (x->name() == GetParam()) b = x;
  ASSERT_NE(b, nullptr);
  if (!b->available())
    GTEST_SKIP() << "backend '" << b->name() << "' is not available here: " << b->unavailable_reason();
  constexpr std::int64_t lo = std::numeric_limits<std::int32_t>::min(), hi = std::numeric_limits<std::int32_t>::max();
  conformance::DenseCase c;
  c.B = 1;
  c.Sq = 5;
  c.Sk = 7;
  c.H = 2;
  c.Hkv = 1;
  c.D = 32;
  if (const auto why = b->unsupported(c.shape())) GTEST_SKIP() << "backend '" << b->name() << "' refuses: " << *why;
  std::mt19937_64 rng = test_rng();
  for (std::int64_t offset : {hi - (c.Sq - 1), lo}) {
    for (bool causal : {true, false}) {
      for (std::int64_t window : {std::int64_t(0), std::int64_t(3), hi}) {
        c.causal = causal;
        c.causal_offset = offset;
        c.window = window;
        c.data_seed = rng();
        for (const auto& r : {conformance::check_forward(*b, c), conformance::check_backward(*b, c)}) {
          EXPECT_TRUE(r.passed) << r.op << " [" << r.description << "] error " << r.error << " > " << r.tolerance << " "
                                << r.detail;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, DensePositionEdges, ::testing::ValuesIn([] {
                           std::vector<std::string> names;
                           for (const Backend* b : all_backends()) names.push_back(b->name());
                           return names;
                         }()),
                         [](const auto& info) { return info.param; });

TEST(BackwardBadInput, NamesTheArgument) {
  Dense d;
  auto expect_arg = [&](BackwardArgs a, const std::string& arg) {
    try {
      attention_backward(backend("reference"), a, d.params);
      ADD_FAILURE() << "accepted: " << arg;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), arg) << e.what();
    }
  };
  BackwardArgs a = d.bwd();
  a.lse = nullptr;
  expect_arg(a, "lse");
  a = d.bwd();
  a.dout.shape[1] = 3;
  expect_arg(a, "dout");
  a = d.bwd();
  a.dk.shape[2] = 1;
  expect_arg(a, "dk");
  a = d.bwd();
  a.dv.dtype = DType::bf16;
  expect_arg(a, "dv");
  a = d.bwd();
  a.dq.data = nullptr;
  expect_arg(a, "dq");
  std::vector<float> sinks(4, 0.5f), dsinks(5, 0.0f);
  a = d.bwd();
  a.dsinks = dsinks.data();  // without params.sinks there is no gradient to write
  expect_arg(a, "dsinks");
  d.params.sinks = sinks.data();
  a.dsinks = reinterpret_cast<float*>(reinterpret_cast<char*>(dsinks.data()) + 1);
  expect_arg(a, "dsinks");
  d.params.sinks = nullptr;
  alignas(16) unsigned char scratch[64];
  a = d.bwd();
  a.workspace = scratch + 8;  // a workspace starts on 16 bytes
  a.workspace_bytes = 32;
  expect_arg(a, "workspace");
}

// Host backends keep no per-row scratch: the backward's workspace query says 0 for them, after validating the call
// as the backward does.
TEST(BackwardWorkspace, HostBackendsNeedNone) {
  Dense d;
  for (const char* name : {"reference", "cpu"}) {
    EXPECT_EQ(attention_backward_workspace_bytes(backend(name), d.bwd(), d.params), 0u) << name;
    BackwardArgs bad = d.bwd();
    bad.lse = nullptr;
    try {
      attention_backward_workspace_bytes(backend(name), bad, d.params);
      ADD_FAILURE() << name << ": a call without lse was sized";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "lse") << e.what();
    }
  }
}

// Reading the registry while another thread registers is safe (before all_backends returned a copy,
// iterating it during a register was a heap use-after-free under ASan).
TEST(Registry, ReadWhileRegistering) {
  struct Named : ReferenceWrapper {
    explicit Named(std::string n) : name_(std::move(n)) {}
    std::string name() const override { return name_; }
    std::string name_;
  };
  const std::size_t before = all_backends().size();
  std::thread writer([] {
    for (int i = 0; i < 200; ++i) register_backend(std::make_unique<Named>("registry_test_" + std::to_string(i)));
  });
  std::size_t seen = 0;
  for (int i = 0; i < 2000; ++i) {
    for (Backend* b : all_backends()) seen += b->name().size() > 0;
  }
  writer.join();
  EXPECT_EQ(all_backends().size(), before + 200);
  EXPECT_GT(seen, 0u);
  EXPECT_EQ(backend("registry_test_199").name(), "registry_test_199");
}

// A host pointer in a view marked as cuda memory is refused before any launch (it used to fault the
// context, the error surfacing from a later, unrelated call); the backend works normally afterwards.
TEST(DeviceMemory, HostPointerInACudaViewIsRefused) {
  Backend* cuda = nullptr;
  for (Backend* b : all_backends())
    if (b->name() == "cuda" && b->available()) cuda = b;
  if (cuda == nullptr) GTEST_SKIP() << "no usable cuda backend here (no GPU, or built without CUDA)";
  Dense d;
  ForwardArgs args = d.fwd();
  for (TensorView* t : {&args.q, &args.k, &args.v, &args.out}) t->memory = Memory::cuda;
  args.lse = nullptr;
  try {
    attention_forward(*cuda, args, d.params);
    FAIL() << "a host pointer was launched on";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "q");
    EXPECT_NE(std::string(e.what()).find("host pointer"), std::string::npos) << e.what();
  }
  // Device memory still works after the refusal.
  conformance::DeviceBuffer q(*cuda, d.q.bytes), k(*cuda, d.k.bytes), v(*cuda, d.v.bytes), out(*cuda, d.out.bytes);
  attention_forward(*cuda,
                    {d.q.on(q.get(), Memory::cuda), d.k.on(k.get(), Memory::cuda), d.v.on(v.get(), Memory::cuda),
                     d.out.on(out.get(), Memory::cuda), nullptr, nullptr},
                    d.params);
  cuda->synchronize();
}

// ---- No std:: exception but flashtq::Error leaves an entry point (issue 18) ----

// A backend whose every compute method throws the std:: exception it is given, as a registered
// backend's own code or an allocation inside a backend might.
class Throwing final : public ReferenceWrapper {
 public:
  explicit Throwing(std::function<void()> thrower) : thrower_(std::move(thrower)) {}
  std::string name() const override { return "throwing"; }
  void forward(const ForwardCall&) override { thrower_(); }
  void backward(const BackwardCall&) override { thrower_(); }
  void tq_encode(const TqEncodeCall&) override { thrower_(); }
  void tq_rotate_queries(const TqRotateCall&) override { thrower_(); }
  void tq_attend(const TqAttendCall&) override { thrower_(); }
  std::size_t tq_attend_workspace(const TqAttendCall&) const override {
    thrower_();
    return 0;
  }

 private:
  std::function<void()> thrower_;
};

// Runs f, which must throw a flashtq::Error naming `argument` (not the std:: exception inside).
template <typename F>
void expect_library_error(F&& f, const std::string& argument, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << what << ": no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), argument) << what << ": " << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": a " << typeid(e).name() << " escaped: " << e.what();
  }
}

TEST(EntryPoints, StdExceptionsFromABackendBecomeErrors) {
  const std::vector<std::pair<std::string, std::function<void()>>> throwers = {
      {"bad_alloc", [] { throw std::bad_alloc(); }},
      {"length_error", [] { throw std::length_error("vector"); }},
      {"out_of_range", [] { throw std::out_of_range("at"); }},
      {"bad_optional_access", [] { throw std::bad_optional_access(); }},
      {"runtime_error", [] { throw std::runtime_error("a registered backend's own"); }}};
  for (const auto& [kind, thrower] : throwers) {
    Throwing b(thrower);
    Dense d;
    expect_library_error([&] { attention_forward(b, d.fwd(), d.params); }, "backend", "forward, " + kind);
    expect_library_error([&] { attention_backward(b, d.bwd(), d.params); }, "backend", "backward, " + kind);
    const TqLayout l{64, 1, 8, 2, 2};
    const TqTables t = make_tq_tables(l, 1, 0);
    HostTensor x({1, 2, 1, 64}, DType::f32, false), q({1, 1, 2, 64}, DType::f32, false), out(q);
    std::vector<std::uint32_t> words(std::size_t(l.key_words() + l.value_words()), 0u);
    std::vector<float> scratch(std::size_t(tq_scratch_floats(1, 2, 64)), 0.0f);
    expect_library_error(
        [&] {
          tq_encode_keys(b, {t, x.view, 0, words.data(), nullptr});
        },
        "backend", "encode, " + kind);
    expect_library_error(
        [&] {
          tq_rotate_queries(b, {t, q.view, 1, scratch.data(), nullptr});
        },
        "backend", "rotate, " + kind);
    TqAttendArgs a;
    a.tables = t;
    a.scratch = scratch.data();
    a.n_heads = 2;
    a.k_cache = words.data();
    a.v_cache = words.data();
    a.out = out.view;
    expect_library_error([&] { tq_attend(b, a); }, "backend", "attend, " + kind);
    expect_library_error([&] { tq_attend_workspace_bytes(b, a); }, "backend", "workspace, " + kind);
    TqKvCache cache({1, l, 0}, &b);
    expect_library_error([&] { cache.append(0, x.view, x.view, 0); }, "backend", "cache append, " + kind);
  }
}

// Host memory of 1 MiB: a larger allocation throws std::bad_alloc, as a full device or host would.
class SmallMemory final : public ReferenceWrapper {
 public:
  std::string name() const override { return "small-memory"; }
  void* allocate(std::size_t bytes) override {
    if (bytes > (1u << 20)) throw std::bad_alloc();
    return ReferenceWrapper::allocate(bytes);
  }
};

// Hostile arguments to the cache: refused by rule, or an Error naming what asked for the memory. q of
// 2^20 heads once went to the allocator before it was validated, and its std::bad_alloc escaped.
TEST(EntryPoints, HostileCacheArgumentsGiveErrors) {
  SmallMemory small;
  expect_library_error([&] { TqKvCache({1, {128, 8, 4096, 2, 2}, 0}, &small); }, "capacity", "a cache past 1 MiB");
  TqKvCache cache({1, {64, 1, 16, 2, 2}, 0}, &small);
  HostTensor k({1, 4, 1, 64}, DType::f32, false), q({1, 1, 4, 64}, DType::f32, false), out(q);
  std::mt19937_64 rng = test_rng();
  k.fill_normal(rng);
  cache.append(0, k.view, k.view, 0);
  const std::int64_t many = std::int64_t(1) << 20;  // a consistent view of 2^20 heads; never read
  TensorView wide = TensorView::bshd(q.view.data, DType::f32, 1, 1, many, 64);
  expect_library_error([&] { cache.attend(0, wide, 3, TensorView::bshd(out.view.data, DType::f32, 1, 1, many, 64)); },
                       "q", "2^20 query heads");
  for (std::int64_t heads : {std::int64_t(-1), std::int64_t(0)}) {
    TensorView bad = q.view;
    bad.shape[2] = heads;
    expect_library_error([&] { cache.attend(0, bad, 3, out.view); }, "q", "heads " + std::to_string(heads));
  }
  TensorView ragged = q.view;
  ragged.shape[3] = 32;
  expect_library_error([&] { cache.attend(0, ragged, 3, out.view); }, "q", "head_dim 32 against 64");
  EXPECT_NO_THROW(cache.attend(0, q.view, 3, out.view));  // the cache still works
#if FLASHTQ_TEST_UNDER_ASAN
  GTEST_SKIP() << "2^40 layers: AddressSanitizer aborts on an allocation that large instead of failing it";
#else
  // 2^40 layers: the host bookkeeping is refused at once (it once grew layer by layer until memory ran out).
  expect_library_error(
      [&] {
        TqKvCache({std::int64_t(1) << 40, {32, 1, 1, 1, 2}, 0}, &backend("reference"));
      },
      "layers", "2^40 layers");
#endif
}

TEST(Registry, UnknownBackendNamesTheChoices) {
  try {
    backend("tpu");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "backend");
    EXPECT_NE(std::string(e.what()).find("reference"), std::string::npos);
  }
  EXPECT_EQ(backend("reference").name(), "reference");
}

}  // namespace
}  // namespace flashtq

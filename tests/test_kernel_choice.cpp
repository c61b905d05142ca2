// Kernel choice on cuda (src/cuda/kernel_choice.hpp): the pure functions give each fast path the
// shapes it is meant for, and on a GPU the kernel that served a conformance case is the one they
// chose, so a silent fall-back to a slow kernel fails here, not only in a benchmark.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "conformance/conformance.hpp"
#include "core/validate.hpp"
#include "cuda/kernel_choice.hpp"
#include "flashtq/flashtq.hpp"
#include "seeded.hpp"

namespace flashtq {
namespace {

using cuda::DenseBackwardKernel;
using cuda::DenseForwardKernel;
using cuda::DeviceTraits;
using cuda::TqAttendKernel;

constexpr DeviceTraits kHopper{true, true}, kAmpere{false, true};

// Contiguous [B, S, H, D] views over one aligned buffer per tensor (never read: the choice is pure).
struct Views {
  std::vector<std::uint64_t> storage[8];
  TensorView make(int slot, std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D, DType t) {
    storage[slot].assign(std::size_t(B * S * H * D / 2 + 8), 0);
    TensorView v;
    v.data = storage[slot].data();
    v.dtype = t;
    v.shape = {B, S, H, D};
    v.strides = {S * H * D, H * D, D, 1};
    return v;
  }
};

ForwardCall forward_call(Views& views, DType t, std::int64_t D, std::int64_t Sq = 300, bool pedantic = false) {
  ForwardCall c(core::Validator::stamp());
  c.p.B = 2, c.p.Sq = Sq, c.p.Sk = Sq, c.p.H = 4, c.p.Hkv = 2, c.p.D = D, c.p.dtype = t;
  c.p.pedantic = pedantic;
  c.q = views.make(0, 2, Sq, 4, D, t);
  c.k = views.make(1, 2, Sq, 2, D, t);
  c.v = views.make(2, 2, Sq, 2, D, t);
  c.out = views.make(3, 2, Sq, 4, D, t);
  return c;
}

TEST(KernelChoice, DenseForwardGivesEachShapeItsFastPath) {
  Views v;
  EXPECT_EQ(cuda::choose_dense_forward(forward_call(v, DType::bf16, 128), kHopper), DenseForwardKernel::wgmma);
  EXPECT_EQ(cuda::choose_dense_forward(forward_call(v, DType::f16, 64), kHopper), DenseForwardKernel::wgmma);
  EXPECT_EQ(cuda::choose_dense_forward(forward_call(v, DType::bf16, 256), kHopper), DenseForwardKernel::wgmma);
  EXPECT_EQ(cuda::choose_dense_forward(forward_call(v, DType::bf16, 96), kHopper), DenseForwardKernel::mma);
  EXPECT_EQ(cuda::choose_dense_forward(forward_call(v, DType::bf16, 128), kAmpere), DenseForwardKernel::mma);
  EXPECT_EQ(cuda::choose_dense_forward(forward_call(v, DType::f32, 128), kHopper), DenseForwardKernel::tf32);
  EXPECT_EQ(cuda::choose_dense_forward(forward_call(v, DType::f32, 64, 300, true), kHopper), DenseForwardKernel::ffma);
  // What no tiled kernel is built for goes to the warp-per-row kernel, deliberately.
  EXPECT_EQ(cuda::choose_dense_forward(forward_call(v, DType::bf16, 256), kAmpere), DenseForwardKernel::warp_per_row);
  EXPECT_EQ(cuda::choose_dense_forward(forward_call(v, DType::f32, 256), kHopper), DenseForwardKernel::warp_per_row);
  EXPECT_EQ(cuda::choose_dense_forward(forward_call(v, DType::bf16, 48), kHopper), DenseForwardKernel::warp_per_row);
  EXPECT_EQ(cuda::choose_dense_forward(forward_call(v, DType::bf16, 512), kHopper), DenseForwardKernel::warp_per_row);
}

TEST(KernelChoice, DenseDecodeTakesAFewRowsPerKvHead) {
  Views v;
  // Two query heads per kv head: up to 8 rows at head_dim 64 and 128 (16 columns), 4 at 256 (8 columns).
  for (const auto& [t, D, Sq] : {std::tuple{DType::bf16, 128, 1}, std::tuple{DType::f16, 64, 8},
                                 std::tuple{DType::bf16, 256, 4}, std::tuple{DType::f16, 128, 3}}) {
    EXPECT_EQ(cuda::choose_dense_forward(forward_call(v, t, D, Sq), kHopper), DenseForwardKernel::decode) << D;
    EXPECT_EQ(cuda::choose_dense_forward(forward_call(v, t, D, Sq), kAmpere), DenseForwardKernel::decode) << D;
  }
  EXPECT_EQ(cuda::choose_dense_forward(forward_call(v, DType::bf16, 128, 9), kHopper), DenseForwardKernel::wgmma);
  EXPECT_EQ(cuda::choose_dense_forward(forward_call(v, DType::bf16, 256, 5), kHopper), DenseForwardKernel::wgmma);
  EXPECT_EQ(cuda::choose_dense_forward(forward_call(v, DType::f32, 128, 1), kHopper), DenseForwardKernel::tf32);
  EXPECT_EQ(cuda::choose_dense_forward(forward_call(v, DType::bf16, 96, 1), kHopper), DenseForwardKernel::mma);
  ForwardCall masked = forward_call(v, DType::bf16, 128, 1);
  static const float mask[1] = {0.0f};
  masked.p.mask = mask;  // a mask or dropout goes to the tiled kernels, which read them
  EXPECT_EQ(cuda::choose_dense_forward(masked, kHopper), DenseForwardKernel::wgmma);
  ForwardCall dropped = forward_call(v, DType::bf16, 128, 1);
  dropped.p.dropout_p = 0.1f;
  EXPECT_EQ(cuda::choose_dense_forward(dropped, kHopper), DenseForwardKernel::wgmma);
  ForwardCall shifted = forward_call(v, DType::bf16, 128, 1);
  shifted.v.data = static_cast<char*>(shifted.v.data) + 2;  // rows no longer on 16 bytes
  EXPECT_EQ(cuda::choose_dense_forward(shifted, kHopper), DenseForwardKernel::warp_per_row);
}

TEST(KernelChoice, DenseForwardTakesTheTiledKernelsOnlyWhereTheirLoadsAndGridsHold) {
  Views v;
  ForwardCall shifted = forward_call(v, DType::bf16, 128);
  shifted.k.data = static_cast<char*>(shifted.k.data) + 2;  // rows no longer on 16 bytes
  EXPECT_EQ(cuda::choose_dense_forward(shifted, kHopper), DenseForwardKernel::warp_per_row);
  ForwardCall no_maps = forward_call(v, DType::bf16, 128);
  EXPECT_EQ(cuda::choose_dense_forward(no_maps, DeviceTraits{true, false}), DenseForwardKernel::mma);
  ForwardCall heads = forward_call(v, DType::bf16, 128);
  heads.p.B = 70000;  // grid y holds B * H blocks by head: past 65535
  EXPECT_EQ(cuda::choose_dense_forward(heads, kHopper), DenseForwardKernel::warp_per_row);
}

BackwardCall backward_call(Views& v, DType t, std::int64_t D) {
  BackwardCall c(core::Validator::stamp());
  c.p.B = 1, c.p.Sq = 200, c.p.Sk = 200, c.p.H = 2, c.p.Hkv = 1, c.p.D = D, c.p.dtype = t;
  c.q = v.make(0, 1, 200, 2, D, t);
  c.k = v.make(1, 1, 200, 1, D, t);
  c.v = v.make(2, 1, 200, 1, D, t);
  c.out = v.make(3, 1, 200, 2, D, t);
  c.dout = v.make(4, 1, 200, 2, D, t);
  c.dq = v.make(5, 1, 200, 2, D, t);
  c.dk = v.make(6, 1, 200, 1, D, t);
  c.dv = v.make(7, 1, 200, 1, D, t);
  static std::vector<float> lse(400);
  c.lse = lse.data();
  return c;
}

TEST(KernelChoice, DenseBackward) {
  Views v;
  EXPECT_EQ(cuda::choose_dense_backward(backward_call(v, DType::bf16, 128), kHopper), DenseBackwardKernel::wgmma);
  EXPECT_EQ(cuda::choose_dense_backward(backward_call(v, DType::f16, 64), kHopper), DenseBackwardKernel::wgmma);
  EXPECT_EQ(cuda::choose_dense_backward(backward_call(v, DType::bf16, 256), kHopper),
            DenseBackwardKernel::warp_per_row);
  EXPECT_EQ(cuda::choose_dense_backward(backward_call(v, DType::f32, 128), kHopper), DenseBackwardKernel::warp_per_row);
  EXPECT_EQ(cuda::choose_dense_backward(backward_call(v, DType::bf16, 128), kAmpere),
            DenseBackwardKernel::warp_per_row);
  // The rows' statistics live in the workspace, not in dQ: where dQ lies does not decide the kernel.
  BackwardCall shared = backward_call(v, DType::bf16, 128);
  shared.dq = shared.dout;
  EXPECT_EQ(cuda::choose_dense_backward(shared, kHopper), DenseBackwardKernel::wgmma);
}

TEST(KernelChoice, TurboQuantAttend) {
  const TqLayout seed{128, 2, 1024, 2, 2};
  EXPECT_TRUE(cuda::tq_decode_mma_serves(seed, 4, 0));
  EXPECT_TRUE(cuda::tq_decode_mma_serves(seed, 8, 0));
  EXPECT_FALSE(cuda::tq_decode_mma_serves(seed, 2, 0));   // query heads per kv head: a multiple of 4
  EXPECT_FALSE(cuda::tq_decode_mma_serves(seed, 4, 64));  // a sliding window
  TqLayout wider = seed;
  wider.key_bits = 3;
  EXPECT_FALSE(cuda::tq_decode_mma_serves(wider, 4, 0));
  TqLayout small = seed;
  small.head_dim = 64;
  EXPECT_FALSE(cuda::tq_decode_mma_serves(small, 4, 0));
  EXPECT_TRUE(cuda::tq_unsupported(small).empty());
  small.head_dim = 512;
  EXPECT_FALSE(cuda::tq_unsupported(small).empty());
}

TEST(KernelChoice, TurboQuantTensorCoreDecodeLayouts) {
  const TqLayout quality = tq_preset_layout("quality", 128, 2, 4096);  // 4-bit keys, 3-bit values, block means
  EXPECT_TRUE(cuda::tq_decode_tc_serves(quality, false));
  EXPECT_FALSE(cuda::tq_decode_tc_serves(quality, true));  // asked for exact arithmetic
  TqLayout l = quality;
  l.value_bits = 4;  // code widths no preset has: not built
  EXPECT_FALSE(cuda::tq_decode_tc_serves(l, false));
  l = quality;
  l.head_dim = 32;
  EXPECT_FALSE(cuda::tq_decode_tc_serves(l, false));
  l = quality;
  l.key_block = 8;  // a block shorter than a tile of 16 timesteps
  EXPECT_FALSE(cuda::tq_decode_tc_serves(l, false));
  l = quality;
  l.value_block = 8;
  EXPECT_FALSE(cuda::tq_decode_tc_serves(l, false));
  l = tq_preset_layout("default", 128, 2, 4096);  // 32 outlier channels at 4 bits
  EXPECT_TRUE(cuda::tq_decode_tc_serves(l, false));
  l.key_outliers = 16;  // a group of 32 coordinates would straddle two parts
  EXPECT_FALSE(cuda::tq_decode_tc_serves(l, false));
  l = tq_preset_layout("seed", 128, 2, 4096);  // keys with QJL
  EXPECT_FALSE(cuda::tq_decode_tc_serves(l, false));
}

// A chunk of `n` query rows from `start` over one cache of capacity 4096 (pure: nothing is read).
TqAttendCall chunk_call(const TqLayout& layout, std::int64_t n, std::int64_t start) {
  TqAttendCall c(core::Validator::stamp());
  c.tables.layout = layout;
  c.n_heads = 4 * layout.n_kv_heads, c.n_queries = n, c.start_pos = start, c.batch = 2;
  c.max_seq = start + n, c.longest_row = start + n, c.reach = layout.capacity;
  c.scale = 0.125f;
  return c;
}

TEST(KernelChoice, TurboQuantChunksGoToTheBf16Prefill) {
  const TqLayout seed{128, 2, 4096, 2, 2};
  TqLayout preset = tq_preset_layout("default", 256, 1, 4096);
  const std::int64_t n = cuda::tiles::kTqPrefillMinRows;
  EXPECT_EQ(cuda::choose_tq_attend(chunk_call(seed, n, 1000), kHopper), TqAttendKernel::prefill_bf16);
  EXPECT_EQ(cuda::choose_tq_attend(chunk_call(seed, 512, 0), kAmpere), TqAttendKernel::prefill_bf16);  // mma tiles
  EXPECT_EQ(cuda::choose_tq_attend(chunk_call(preset, 2048, 2048), kHopper), TqAttendKernel::prefill_bf16);
  // Fewer rows than the prefill pays for: each row reads the words (the seed's tensor-core decode here).
  EXPECT_EQ(cuda::choose_tq_attend(chunk_call(seed, n - 1, 1000), kHopper), TqAttendKernel::decode_mma_bf16);
  // head_dim 256 has no mma tiles for the dense forward: off Hopper each row reads the words (the presets' decode).
  EXPECT_EQ(cuda::choose_tq_attend(chunk_call(preset, 512, 0), kAmpere), TqAttendKernel::decode_tc);
  TqAttendCall exact = chunk_call(seed, 512, 1000);
  exact.exact = true;  // the f32 path, asked for
  EXPECT_EQ(cuda::choose_tq_attend(exact, kHopper), TqAttendKernel::decode_mma);
  TqAttendCall ragged = chunk_call(seed, 512, 1000);
  const std::int32_t starts[2] = {0, 7};
  ragged.start_positions = starts;  // positions on the device: the host cannot size one dense problem
  EXPECT_EQ(cuda::choose_tq_attend(ragged, kHopper), TqAttendKernel::decode_mma_bf16);
  TqAttendCall clamped = chunk_call(seed, 512, 1000);
  clamped.max_seq = 1200;  // rows past max_seq see a clamped prefix, which no causal offset describes
  EXPECT_EQ(cuda::choose_tq_attend(clamped, kHopper), TqAttendKernel::decode_mma_bf16);

  // The dense problem: keys from the window's first visible timestep, row j at start + j.
  TqAttendCall windowed = chunk_call(seed, 100, 1000);
  windowed.window = 300;
  const DenseProblem p = cuda::tq_prefill_problem(windowed);
  EXPECT_EQ(cuda::tq_prefill_first_key(windowed), 701);
  EXPECT_EQ(p.Sk, 1100 - 701);
  EXPECT_EQ(p.causal_offset, 1000 - 701);
  EXPECT_TRUE(p.causal);
  EXPECT_EQ(p.window, 300);
  EXPECT_EQ(p.B, 2);
  EXPECT_EQ(p.Sq, 100);
  EXPECT_EQ(p.H, 8);
  EXPECT_EQ(p.Hkv, 2);
  EXPECT_EQ(p.dtype, DType::bf16);
  EXPECT_EQ(cuda::tq_prefill_problem(chunk_call(seed, 100, 1000)).Sk, 1100);
}

TEST(KernelChoice, TurboQuantDecodeOfEveryPreset) {
  for (const TqPreset& preset : tq_presets()) {
    for (const std::int64_t D : {32, 64, 128, 256}) {
      const TqLayout layout = tq_preset_layout(preset.name, D, 2, 4096);
      const bool seed = std::string(preset.name) == "seed";
      const TqAttendKernel want = seed && D == 128  ? TqAttendKernel::decode_mma_bf16
                                  : !seed && D > 32 ? TqAttendKernel::decode_tc
                                                    : TqAttendKernel::split_k;
      EXPECT_EQ(cuda::choose_tq_attend(chunk_call(layout, 1, 3000), kHopper), want) << preset.name << " D " << D;
      EXPECT_EQ(cuda::choose_tq_attend(chunk_call(layout, 1, 3000), kAmpere), want) << preset.name << " D " << D;
      TqAttendCall exact = chunk_call(layout, 1, 3000);
      exact.exact = true;  // the seed's tensor-core decode has an exact variant; the presets' is bf16-class: split-K
      const TqAttendKernel want_exact = want == TqAttendKernel::decode_mma_bf16 ? TqAttendKernel::decode_mma
                                        : want == TqAttendKernel::decode_tc     ? TqAttendKernel::split_k
                                                                                : want;
      EXPECT_EQ(cuda::choose_tq_attend(exact, kHopper), want_exact) << preset.name << " D " << D;
    }
  }
}

// On the GPU: the kernel that served each case (Backend::last_kernel) is the one meant for it.
Backend* available_backend(const std::string& name) {
  for (Backend* b : all_backends())
    if (b->name() == name && b->available()) return b;
  return nullptr;
}
Backend* gpu() { return available_backend("cuda"); }

conformance::DenseCase dense_case(DType t, std::int64_t D, bool pedantic = false, std::int64_t Sq = 200,
                                  std::int64_t Sk = 200) {
  conformance::DenseCase c;
  c.B = 1, c.Sq = Sq, c.Sk = Sk, c.H = 4, c.Hkv = 2, c.D = D, c.dtype = t, c.pedantic = pedantic;
  c.causal = true;
  c.data_seed = fresh_seed();
  return c;
}

TEST(KernelChoiceOnGpu, EachDenseShapeRanItsKernel) {
  Backend* b = gpu();
  if (!b) GTEST_SKIP() << "no CUDA device here: the kernel that runs is checked on the GPU machine";
  const bool hopper = cuda::current_device_traits().hopper;
  struct Expect {
    DType t;
    std::int64_t D;
    bool pedantic;
    const char* forward;
    std::int64_t Sq = 200, Sk = 200;
  };
  const Expect cases[] = {
      // Decode steps, long enough that a GPU splits the keys (the conformance check passes the workspace).
      {DType::bf16, 128, false, "dense_forward_decode", 1, 5000},
      {DType::f16, 64, false, "dense_forward_decode", 3, 2000},
      {DType::bf16, 256, false, "dense_forward_decode", 2, 3000},
      {DType::bf16, 128, false, hopper ? "dense_forward_wgmma" : "dense_forward_mma"},
      {DType::f16, 64, false, hopper ? "dense_forward_wgmma" : "dense_forward_mma"},
      {DType::bf16, 96, false, "dense_forward_mma"},
      {DType::f32, 64, false, "dense_forward_tf32"},
      {DType::f32, 128, true, "dense_forward_ffma"},
      {DType::f32, 256, false, "dense_forward_warp_per_row"},
      {DType::f16, 512, false, "dense_forward_warp_per_row"},  // no tiled kernel past 256 (16 dims a lane)
  };
  // Softcap and sinks (docs/spec.md §1.8, §1.9) ride on the same kernels: a mild cap, and sinks (one
  // head's -inf among them, from the conformance draw) that hold part of every row's weight.
  for (const bool capped : {false, true}) {
    auto with_features = [capped](conformance::DenseCase c) {
      if (capped) c.softcap = 5.0f, c.sinks = true;
      return c;
    };
    for (const Expect& e : cases) {
      const conformance::DenseCase c = with_features(dense_case(e.t, e.D, e.pedantic, e.Sq, e.Sk));
      const conformance::CheckResult r = conformance::check_forward(*b, c);
      EXPECT_TRUE(r.passed) << c.describe() << ": " << r.detail;
      EXPECT_EQ(r.kernel, e.forward) << c.describe();
    }
    const conformance::DenseCase bf16 = with_features(dense_case(DType::bf16, 128));
    const conformance::CheckResult back = conformance::check_backward(*b, bf16);
    EXPECT_TRUE(back.passed) << bf16.describe() << ": " << back.detail;
    EXPECT_EQ(back.kernel, hopper ? "dense_backward_wgmma" : "dense_backward_warp_per_row");
    // Without a workspace the Hopper kernels keep the rows' statistics in scratch they allocate on the stream.
    const conformance::CheckResult own = conformance::check_backward(*b, bf16, /*workspace=*/false);
    EXPECT_TRUE(own.passed) << bf16.describe() << " without a workspace: " << own.detail;
    EXPECT_EQ(own.kernel, back.kernel);
    const conformance::DenseCase wide = with_features(dense_case(DType::bf16, 512));
    const conformance::CheckResult wide_back = conformance::check_backward(*b, wide);
    EXPECT_TRUE(wide_back.passed) << wide.describe() << ": " << wide_back.detail;
    EXPECT_EQ(wide_back.kernel, "dense_backward_warp_per_row");
    const conformance::DenseCase f32 = with_features(dense_case(DType::f32, 256));
    const conformance::CheckResult exact = conformance::check_backward(*b, f32);
    EXPECT_TRUE(exact.passed) << f32.describe() << ": " << exact.detail;
    EXPECT_EQ(exact.kernel, "dense_backward_warp_per_row");
  }
}

TEST(KernelChoiceOnGpu, TurboQuantDecodeRanTheTensorCoreKernel) {
  Backend* b = gpu();
  if (!b) GTEST_SKIP() << "no CUDA device here: the kernel that runs is checked on the GPU machine";
  conformance::TqCase c;
  c.layout = TqLayout{128, 2, 1024, 2, 2};
  c.H = 8, c.tokens = 700, c.n_queries = 1, c.start_pos = 699;
  c.seed = 5, c.data_seed = fresh_seed();
  const conformance::CheckResult r = conformance::check_tq_attend(*b, c);
  EXPECT_TRUE(r.passed) << c.describe() << ": " << r.detail;
  EXPECT_EQ(r.kernel, "tq_attend_decode_mma_bf16") << c.describe();
  c.layout.key_bits = 3;  // no tensor-core decode for it: the split-K kernel, deliberately
  const conformance::CheckResult wide = conformance::check_tq_attend(*b, c);
  EXPECT_TRUE(wide.passed) << c.describe() << ": " << wide.detail;
  EXPECT_EQ(wide.kernel, "tq_attend_split_k") << c.describe();
  c.exact = true;  // the seed's tensor-core decode has an exact variant: asking for exactness runs it
  c.layout.key_bits = 2;
  const conformance::CheckResult exact = conformance::check_tq_attend(*b, c);
  EXPECT_TRUE(exact.passed) << c.describe() << ": " << exact.detail;
  EXPECT_EQ(exact.kernel, "tq_attend_decode_mma") << c.describe();
  for (const char* preset : {"default", "quality", "small"}) {  // the presets' bf16-class decode, exact on request
    for (const std::int64_t D : {64, 128, 256}) {
      c.layout = tq_preset_layout(preset, D, 2, 1024);
      c.exact = false;
      const conformance::CheckResult fast = conformance::check_tq_attend(*b, c);
      EXPECT_TRUE(fast.passed) << c.describe() << ": " << fast.detail;
      EXPECT_EQ(fast.kernel, "tq_attend_decode_tc") << c.describe();
      c.exact = true;
      const conformance::CheckResult slow = conformance::check_tq_attend(*b, c);
      EXPECT_TRUE(slow.passed) << c.describe() << ": " << slow.detail;
      EXPECT_EQ(slow.kernel, "tq_attend_split_k") << c.describe();
    }
  }
}

TEST(KernelChoiceOnGpu, TurboQuantChunksRanTheBf16Prefill) {
  Backend* b = gpu();
  if (!b) GTEST_SKIP() << "no CUDA device here: the kernel that runs is checked on the GPU machine";
  conformance::TqCase c;
  c.layout = tq_preset_layout("default", 128, 2, 1024);
  c.H = 8, c.tokens = 700, c.n_queries = 300, c.start_pos = 400;
  c.seed = 5, c.data_seed = fresh_seed();
  const conformance::CheckResult r = conformance::check_tq_attend(*b, c);
  EXPECT_TRUE(r.passed) << c.describe() << ": " << r.detail;
  EXPECT_EQ(r.kernel, "tq_attend_prefill_bf16") << c.describe();
  c.layout = TqLayout{64, 2, 1024, 2, 2};  // the seed's keys with their QJL sketch, and a window
  c.window = 200;
  const conformance::CheckResult seed = conformance::check_tq_attend(*b, c);
  EXPECT_TRUE(seed.passed) << c.describe() << ": " << seed.detail;
  EXPECT_EQ(seed.kernel, "tq_attend_prefill_bf16") << c.describe();
}

// On a WebGPU adapter (lavapipe in CI): the tiled forward serves 16-bit inputs at head_dim 64 and 128 with every
// feature on, the one-row-a-thread kernel the rest; TurboQuant attention its grouped kernel.
TEST(KernelChoiceOnWebGpu, EachDenseShapeRanItsKernel) {
  Backend* b = available_backend("webgpu");
  if (!b) GTEST_SKIP() << "no WebGPU adapter here";
  // With subgroups of enough lanes (the description says how many: "subgroups of N") the fast kernels must run
  // their subgroup variants: the tiled forward from 8 lanes, TurboQuant attention from 32; without, the others.
  const std::string description = b->description();
  const std::size_t of = description.find("subgroups of ");
  const long lanes = of == std::string::npos ? 0 : std::stol(description.substr(of + 13));
  auto ran = [lanes](const std::string& kernel, const std::string& want) {
    const bool variant = want == "dense_forward_tiled" || want == "tq_attend_grouped";
    const long least = want == "tq_attend_grouped" ? 32 : 8;
    return kernel == (variant && lanes >= least ? want + "_subgroups" : want);
  };
  struct Expect {
    DType t;
    std::int64_t D;
    const char* forward;
  };
  const Expect cases[] = {{DType::f16, 128, "dense_forward_tiled"},  {DType::bf16, 64, "dense_forward_tiled"},
                          {DType::bf16, 128, "dense_forward_tiled"}, {DType::f32, 128, "dense_forward_rows"},
                          {DType::f16, 256, "dense_forward_rows"},   {DType::bf16, 96, "dense_forward_rows"}};
  for (const Expect& e : cases) {
    conformance::DenseCase c = dense_case(e.t, e.D, false, 77, 150);  // rows past one workgroup's, keys past a tile's
    c.softcap = 5.0f, c.sinks = true, c.window = 60, c.causal_offset = 20, c.mask = true, c.dropout_p = 0.2f,
    c.seed = 9;
    const conformance::CheckResult r = conformance::check_forward(*b, c);
    EXPECT_TRUE(r.passed) << c.describe() << ": " << r.detail;
    EXPECT_TRUE(ran(r.kernel, e.forward)) << c.describe() << " ran " << r.kernel;
    // The backward: tiled where the forward is (no subgroup variant).
    const conformance::CheckResult back = conformance::check_backward(*b, c);
    EXPECT_TRUE(back.passed) << c.describe() << ": " << back.detail;
    EXPECT_EQ(back.kernel, std::string(e.forward).find("tiled") != std::string::npos ? "dense_backward_tiled"
                                                                                     : "dense_backward_rows")
        << c.describe();
  }
  conformance::TqCase c;
  c.layout = tq_preset_layout("default", 128, 2, 1024);
  c.H = 12, c.tokens = 700, c.n_queries = 1, c.start_pos = 699;  // a GQA group of 6: two workgroups of heads
  c.seed = 5, c.data_seed = fresh_seed();
  const conformance::CheckResult r = conformance::check_tq_attend(*b, c);
  EXPECT_TRUE(r.passed) << c.describe() << ": " << r.detail;
  EXPECT_TRUE(ran(r.kernel, "tq_attend_grouped")) << c.describe() << " ran " << r.kernel;
  // A chunk of rows: keys and values decoded to bf16 once, then the dense forward (within llvmpipe's loop limit).
  c.tokens = 600, c.n_queries = 100, c.start_pos = 500;
  const conformance::CheckResult chunk = conformance::check_tq_attend(*b, c);
  EXPECT_TRUE(chunk.passed) << c.describe() << ": " << chunk.detail;
  EXPECT_EQ(chunk.kernel, "tq_attend_prefill") << c.describe();
  c.layout = TqLayout{64, 2, 1024, 2, 2};  // the seed's keys with their QJL sketch, a window, softcap and sinks
  c.window = 200, c.softcap = 5.0f, c.sinks = true;
  const conformance::CheckResult seed = conformance::check_tq_attend(*b, c);
  EXPECT_TRUE(seed.passed) << c.describe() << ": " << seed.detail;
  EXPECT_EQ(seed.kernel, "tq_attend_prefill") << c.describe();
  c.exact = true;  // the exact path stays on the split-K kernel
  const conformance::CheckResult exact = conformance::check_tq_attend(*b, c);
  EXPECT_TRUE(exact.passed) << c.describe() << ": " << exact.detail;
  EXPECT_TRUE(ran(exact.kernel, "tq_attend_grouped")) << c.describe() << " ran " << exact.kernel;
}

// Many rows over a long context: the exact path's split-K parts stay within a workspace bound by splitting each
// row's timesteps into longer pieces (here the bound is made tiny, so every split doubles as far as it may: up to
// the row's length, or 32 key blocks where the layout keeps block means). A kernel that read only its first 256
// timesteps of a split would miss keys and fail the oracle.
TEST(KernelChoiceOnWebGpu, ExactRowsOverLongSplitsStillSeeEveryKey) {
  Backend* b = available_backend("webgpu");
  if (!b) GTEST_SKIP() << "no WebGPU adapter here";
  ASSERT_EQ(setenv("FLASHTQ_WEBGPU_SPLIT_WORKSPACE_BYTES", "4096", 1), 0);
  conformance::TqCase c;
  c.H = 4, c.tokens = 900, c.n_queries = 3, c.start_pos = 897, c.exact = true;
  c.seed = 11, c.data_seed = fresh_seed();
  for (const TqLayout& layout : {TqLayout{64, 2, 1024, 2, 2}, tq_preset_layout("default", 64, 2, 1024)}) {
    c.layout = layout;
    const conformance::CheckResult r = conformance::check_tq_attend(*b, c);
    EXPECT_TRUE(r.passed) << c.describe() << ": " << r.detail;
  }
  unsetenv("FLASHTQ_WEBGPU_SPLIT_WORKSPACE_BYTES");
}

}  // namespace
}  // namespace flashtq

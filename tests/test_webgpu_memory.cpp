// The webgpu backend's device memory: views anywhere inside an allocation work like device
// pointers, and an address that is not the backend's, or a view that runs past its allocation,
// is an Error naming the argument, never a crash or an out-of-bounds access.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "flashtq/flashtq.hpp"
#include "seeded.hpp"

namespace flashtq {
namespace {

Backend* webgpu_or_skip() {
  for (Backend* b : all_backends()) {
    if (b->name() != "webgpu") continue;
    if (b->available()) return b;
    return nullptr;
  }
  return nullptr;
}

#define REQUIRE_WEBGPU(b)        \
  Backend* b = webgpu_or_skip(); \
  if (!b) GTEST_SKIP() << "the webgpu backend is not built or has no adapter here"

TEST(WebGpuMemory, ViewsAtOffsetsInsideOneAllocation) {
  REQUIRE_WEBGPU(gpu);
  const std::int64_t B = 1, S = 37, H = 2, D = 32, n = B * S * H * D, pad = 5;  // odd offsets of f32 elements
  std::mt19937_64 rng = test_rng();
  std::normal_distribution<float> dist(0, 1);
  std::vector<float> host(std::size_t(3 * (n + pad)));
  for (float& x : host) x = dist(rng);
  float* base = static_cast<float*>(gpu->allocate(host.size() * 4 + std::size_t(n) * 4));
  gpu->upload(base, host.data(), host.size() * 4);
  float* q = base + pad;
  float* k = q + n + pad;
  float* v = k + n + pad;
  float* out = base + 3 * (n + pad);
  auto view = [&](float* p) { return TensorView::bshd(p, DType::f32, B, S, H, D, Memory::webgpu); };
  attention_forward(*gpu, {view(q), view(k), view(v), view(out)}, AttentionParams{});
  std::vector<float> got(static_cast<std::size_t>(n)), want(static_cast<std::size_t>(n));
  gpu->download(got.data(), out, got.size() * 4);
  gpu->release(base);
  auto hview = [&](float* p) { return TensorView::bshd(p, DType::f32, B, S, H, D); };
  float* h = host.data();
  attention_forward(backend("reference"),
                    {hview(h + pad), hview(h + 2 * pad + n), hview(h + 3 * pad + 2 * n), hview(want.data())},
                    AttentionParams{});
  double err = 0, ref = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    err += (got[i] - want[i]) * double(got[i] - want[i]);
    ref += double(want[i]) * want[i];
  }
  EXPECT_LE(std::sqrt(err / ref), 1e-5);
}

TEST(WebGpuMemory, ForeignAndOverrunningAddressesAreErrors) {
  REQUIRE_WEBGPU(gpu);
  const std::int64_t B = 1, S = 8, H = 1, D = 32, n = B * S * H * D;
  float* buf = static_cast<float*>(gpu->allocate(std::size_t(4 * n) * 4));
  auto view = [&](float* p) { return TensorView::bshd(p, DType::f32, B, S, H, D, Memory::webgpu); };
  // q runs 1 element past the end of the allocation
  EXPECT_THROW(
      attention_forward(*gpu, {view(buf + 3 * n + 1), view(buf), view(buf + n), view(buf + 2 * n)}, AttentionParams{}),
      Error);
  std::vector<float> host(static_cast<std::size_t>(n));  // host memory labelled as webgpu memory
  try {
    attention_forward(*gpu, {view(host.data()), view(buf), view(buf + n), view(buf + 2 * n)}, AttentionParams{});
    ADD_FAILURE() << "a host address was accepted as webgpu memory";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "q");
  }
  gpu->release(buf);
}

}  // namespace
}  // namespace flashtq

namespace flashtq {
namespace {

// llvmpipe (lavapipe) stops a shader invocation's loops after 65535 iterations: a dense problem whose
// key loop is longer is refused with a reason naming it, rather than answered with unwritten outputs.
TEST(WebGpuLavapipe, RefusesKeyLoopsBeyondTheLoopLimit) {
  Backend* gpu = webgpu_or_skip();
  if (!gpu) GTEST_SKIP() << "the webgpu backend is not built or has no adapter here";
  if (gpu->description().find("llvmpipe") == std::string::npos)
    GTEST_SKIP() << "not on llvmpipe: " << gpu->description();
  DenseProblem p;
  p.B = 1;
  p.H = p.Hkv = 1;
  p.D = 128;
  p.Sq = 1;
  p.Sk = 512;
  EXPECT_FALSE(gpu->unsupported(p).has_value());
  p.Sk = 4096;
  const auto why = gpu->unsupported(p);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("llvmpipe"), std::string::npos) << *why;
  p.Sk = 512;
  p.H = 8;  // dK/dV walk the rows of every head of the group
  p.Sq = 1024;
  EXPECT_TRUE(gpu->unsupported(p).has_value());
}

}  // namespace
}  // namespace flashtq

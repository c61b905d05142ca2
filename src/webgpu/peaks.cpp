#include "webgpu/peaks.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "webgpu/context.hpp"

namespace flashtq::webgpu {
namespace {

// Median seconds of `repeats` runs of f, each waited for, after one warm-up.
template <typename F>
double median_seconds(Context& ctx, F&& f, int repeats) {
  f();
  ctx.wait_idle();
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    ctx.wait_idle();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// An allocation released with its scope.
struct Allocation {
  Context& ctx;
  void* at;
  std::uint64_t bytes;
  Allocation(Context& c, std::uint64_t n) : ctx(c), at(c.allocate(n)), bytes(n) {}
  ~Allocation() { ctx.release(at); }
  void* buffer() const { return ctx.locate(at, bytes, "peaks").buffer; }
};

double fma_tflops(Context& ctx, const std::string& kernel, bool cpu) {
  // A GPU gets a million invocations (every core busy for milliseconds); a CPU adapter few enough to finish at
  // once, and no more than lavapipe's 65535 loop iterations per invocation.
  const std::uint32_t groups = cpu ? 64 : 4096, iterations = cpu ? 1024 : 4096;
  Allocation sink(ctx, std::uint64_t(groups) * 256 * 4);
  const double s = median_seconds(
      ctx,
      [&] {
        ctx.dispatch(kernel, {iterations, 0, 0, 0}, {{sink.buffer()}}, groups, 1, 1);
      },
      5);
  return double(groups) * 256.0 * iterations * 64.0 / s / 1e12;
}

}  // namespace

std::optional<Peaks> measure_peaks() {
  if (!Context::usable()) return std::nullopt;
  Context& ctx = Context::get();
  const bool cpu = ctx.is_cpu_adapter();
  Peaks p;
  {
    // Two ways, several runs a timed call so that the host's submission and wait are a small part of it: the
    // queue's buffer copy command, and a copy kernel (peak_copy.wgsl), which is what the attention kernels' loads
    // can reach (on NVIDIA's Vulkan driver the command moves a fraction of it; on lavapipe the kernel does).
    const std::uint64_t bytes = cpu ? (std::uint64_t(32) << 20) : (std::uint64_t(512) << 20);
    const std::uint32_t words = std::uint32_t(bytes / 16), groups = cpu ? 64 : 8192, runs = cpu ? 1 : 8;
    Allocation src(ctx, bytes), dst(ctx, bytes);
    auto gbs = [&](auto&& run) {
      return 2.0 * double(bytes) * runs /
             median_seconds(
                 ctx,
                 [&] {
                   for (std::uint32_t i = 0; i < runs; ++i) run();
                 },
                 10) /
             1e9;
    };
    p.copy_command_gbs = gbs([&] { ctx.copy(src.buffer(), 0, dst.buffer(), 0, bytes); });
    p.copy_kernel_gbs = gbs([&] {
      ctx.dispatch("peak_copy", {words, groups * 256, 0, 0}, {{src.buffer()}, {dst.buffer()}}, groups, 1, 1);
    });
    p.copy_gbs = std::max(p.copy_command_gbs, p.copy_kernel_gbs);
  }
  p.f32_tflops = fma_tflops(ctx, "peak_fma", cpu);
  if (ctx.features().shader_f16) p.f16_tflops = fma_tflops(ctx, "peak_fma@real-f16", cpu);
  return p;
}

}  // namespace flashtq::webgpu

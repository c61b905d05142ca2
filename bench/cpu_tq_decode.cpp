// The cpu backend's TurboQuant decode of one preset, alone and repeated: Hq = 32, Hkv = 8, D = 128, one query
// over a cache of `--context` Gaussian tokens, `--calls` calls of TqKvCache::attend (with `--dense`, each
// followed by the dense f16 decode of the same keys and values). Prints the minimum and median wall time and
// the process CPU time per call. `flashtq bench` measures every preset side by side with PyTorch; this one
// exists to be run many times back to back on a noisy machine, and under callgrind
// (bench/cpu_tq_instructions.sh) to count the kernel's instructions per token.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <random>
#include <vector>

#include "core/half.hpp"
#include "flashtq/flashtq.hpp"

namespace {

double process_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) / 1e6;
}

template <class F>
double wall_ms(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace flashtq;
  CLI::App app{"cpu TurboQuant decode of one preset, repeated"};
  std::string preset = "default";
  std::int64_t context = 32768;
  int calls = 15, threads = 2;
  bool dense = false;
  app.add_option("--preset", preset, "TurboQuant preset (tq_presets())");
  app.add_option("--context", context, "Tokens in the cache")->check(CLI::Range(1, 1 << 20));
  app.add_option("--calls", calls, "Timed calls")->check(CLI::Range(1, 10000));
  app.add_option("--threads", threads, "cpu backend threads")->check(CLI::Range(1, 1024));
  app.add_flag("--dense", dense, "Also time the dense f16 decode, alternating with the TurboQuant one");
  CLI11_PARSE(app, argc, argv);
  try {
    Backend& cpu = backend("cpu");
    cpu.set_threads(threads);
    const std::int64_t H = 32, Hkv = 8, D = 128;
    std::mt19937_64 rng(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto f16s = [&](std::size_t n) {
      std::vector<std::uint16_t> x(n);
      for (auto& e : x) e = core::f32_to_f16(normal(rng));
      return x;
    };
    std::vector<std::uint16_t> k = f16s(std::size_t(context * Hkv * D)), v = f16s(k.size()), q = f16s(H * D),
                               o(q.size());
    const TensorView kv = TensorView::bshd(k.data(), DType::f16, 1, context, Hkv, D);
    const TensorView vv = TensorView::bshd(v.data(), DType::f16, 1, context, Hkv, D);
    TqKvCache cache(TqCacheConfig{1, tq_preset_layout(preset, D, Hkv, context), 7}, &cpu);
    cache.append(0, kv, vv, 0);
    std::vector<float> qf(std::size_t(H * D)), out(qf.size());
    for (float& e : qf) e = normal(rng);
    std::vector<double> tq_ms, dense_ms;
    double tq_cpu_ms = 0;
    for (int i = 0; i < calls; ++i) {
      const double cpu0 = process_cpu_ms();
      tq_ms.push_back(wall_ms([&] {
        cache.attend(0, TensorView::bshd(qf.data(), DType::f32, 1, 1, H, D), context - 1,
                     TensorView::bshd(out.data(), DType::f32, 1, 1, H, D));
      }));
      tq_cpu_ms += process_cpu_ms() - cpu0;
      if (dense)
        dense_ms.push_back(wall_ms([&] {
          attention_forward(cpu,
                            {TensorView::bshd(q.data(), DType::f16, 1, 1, H, D), kv, vv,
                             TensorView::bshd(o.data(), DType::f16, 1, 1, H, D)},
                            AttentionParams{});
        }));
    }
    std::sort(tq_ms.begin(), tq_ms.end());
    std::sort(dense_ms.begin(), dense_ms.end());
    fmt::print("{} context {} ({}, {} threads): min {:.2f} ms, median {:.2f} ms, process CPU {:.2f} ms per call",
               preset, context, cpu.last_kernel(), threads, tq_ms.front(), tq_ms[tq_ms.size() / 2], tq_cpu_ms / calls);
    if (dense)
      fmt::print("; dense f16 min {:.2f} ms, median {:.2f} ms: {:.2f}x by minimum, {:.2f}x by median", dense_ms.front(),
                 dense_ms[dense_ms.size() / 2], dense_ms.front() / tq_ms.front(),
                 dense_ms[dense_ms.size() / 2] / tq_ms[tq_ms.size() / 2]);
    fmt::print("\n");
  } catch (const Error& e) {
    fmt::print(stderr, "cpu_tq_decode: {}\n", e.what());
    return 1;
  }
  return 0;
}

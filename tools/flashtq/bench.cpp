// `flashtq bench`: the cpu backend against the machine's own limits (FMA peak and copy bandwidth,
// measured in the same run) and, when it is installed, PyTorch's CPU scaled_dot_product_attention.
#include <fmt/core.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "commands.hpp"
#include "timing.hpp"
#include "flashtq/flashtq.hpp"

namespace flashtq::cli {
namespace {

double copy_bandwidth_gbs(int threads) {
  const std::size_t bytes = std::size_t(1) << 29;
  std::vector<char> a(bytes, 1), b(bytes, 0);
  const double s = median_s(
      [&] {
#pragma omp parallel for num_threads(threads)
        for (int part = 0; part < 64; ++part) {
          std::memcpy(b.data() + part * (bytes / 64), a.data() + part * (bytes / 64), bytes / 64);
        }
      },
      3);
  return 2.0 * double(bytes) / s / 1e9;
}

template <typename T>
std::vector<T> random_bytes(std::size_t n, DType dtype, std::mt19937_64& rng) {
  std::vector<T> x(n * dtype_size(dtype) / sizeof(T));
  std::normal_distribution<float> dist(0, 1);
  for (std::size_t i = 0; i < n; ++i) {
    const float v = dist(rng);
    if (dtype == DType::f32) {
      std::memcpy(reinterpret_cast<char*>(x.data()) + 4 * i, &v, 4);
    } else {
      std::uint32_t bits;
      std::memcpy(&bits, &v, 4);
      const std::uint16_t h =
          dtype == DType::bf16 ? std::uint16_t(bits >> 16) : std::uint16_t(0x3C00 ^ (bits >> 22 & 0x1FF));
      std::memcpy(reinterpret_cast<char*>(x.data()) + 2 * i, &h, 2);
    }
  }
  return x;
}

// The presets with the seed's layout first (the decode rows of earlier runs are the seed's).
std::vector<TqPreset> tq_presets_seed_first() {
  std::vector<TqPreset> presets = tq_presets();
  std::stable_partition(presets.begin(), presets.end(),
                        [](const TqPreset& p) { return std::string(p.name) == "seed"; });
  return presets;
}

}  // namespace

Command add_bench(CLI::App& app) {
  struct Options {
    bool json = false, quick = false, decode_only = false, gpu = false;
    int threads = 0;
    std::string output, torch_json;
    std::vector<std::int64_t> decode_contexts;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand("bench", "Benchmark the cpu backend against the machine's limits and PyTorch");
  sub->add_flag("--json", opts->json, "Print the results as JSON");
  sub->add_flag("--quick", opts->quick, "Fewer shapes and repeats");
  sub->add_flag("--decode-only", opts->decode_only, "Only the decode comparison (dense f16 cache against TurboQuant)");
  sub->add_flag("--gpu", opts->gpu, "The GPU backends (cuda, webgpu) side by side instead of the cpu backend");
  sub->add_option("--threads", opts->threads, "Threads (default: all cores)");
  sub->add_option("--output", opts->output, "Also write the JSON to this file");
  sub->add_option("--torch-json", opts->torch_json, "PyTorch results (bench/torch_cpu_sdpa.py) to merge");
  sub->add_option("--decode-contexts", opts->decode_contexts,
                  "Contexts of the decode comparison (default 4096 32768 131072; 4096 with --quick)")
      ->check(CLI::Range(std::int64_t(1), std::int64_t(1) << 20));
  return {
      sub, [opts] {
        if (opts->gpu) {
          nlohmann::json r;
          r["gpu"] = bench_gpu_backends(opts->quick);
          if (r["gpu"].empty()) fmt::print(stderr, "flashtq bench --gpu: no GPU backend is available here\n");
          if (!opts->output.empty()) std::ofstream(opts->output) << r.dump(2) << "\n";
          fmt::print("{}\n", opts->json ? r.dump(2) : r.dump());
          return 0;
        }
        Backend& cpu = backend("cpu");
        cpu.set_threads(opts->threads);
        const int threads = cpu.threads();
        std::mt19937_64 rng(1);
        nlohmann::json r;
        r["threads"] = threads;
        r["backend"] = cpu.description();
        r["fma_peak_gflops"] = cpu.measure_fma_flops() / 1e9;
        r["copy_bandwidth_gbs"] = copy_bandwidth_gbs(threads);
        const double peak = r["fma_peak_gflops"], bw = r["copy_bandwidth_gbs"];
        fmt::print(stderr, "{} threads, {}: FMA peak {:.1f} GFLOP/s, copy {:.1f} GB/s\n", threads,
                   r["backend"].get<std::string>(), peak, bw);
        const int reps = opts->quick ? 1 : 3;
        const int decode_reps = opts->quick ? 1 : 7;  // decode calls are short: more rounds against the noise
        // Dense forward and backward: B = 1, H = 8, S x S.
        for (DType dtype : opts->decode_only ? std::vector<DType>{} : std::vector<DType>{DType::f32, DType::bf16}) {
          for (std::int64_t D : {64, 128}) {
            for (std::int64_t S :
                 opts->quick ? std::vector<std::int64_t>{1024} : std::vector<std::int64_t>{1024, 4096}) {
              const std::int64_t B = 1, H = 8, n = B * S * H * D;
              auto q = random_bytes<std::uint8_t>(std::size_t(n), dtype, rng),
                   k = random_bytes<std::uint8_t>(std::size_t(n), dtype, rng),
                   v = random_bytes<std::uint8_t>(std::size_t(n), dtype, rng), o = q, dout = q, dq = q, dk = q, dv = q;
              std::vector<float> lse(std::size_t(B * H * S));
              auto view = [&](std::vector<std::uint8_t>& x) { return TensorView::bshd(x.data(), dtype, B, S, H, D); };
              for (bool causal : {false, true}) {
                AttentionParams params;
                params.causal = causal;
                const double flops = 4.0 * double(B * H) * double(S) * double(S) * double(D) * (causal ? 0.5 : 1.0);
                const double fwd = median_s(
                    [&] {
                      attention_forward(cpu, {view(q), view(k), view(v), view(o), lse.data()}, params);
                    },
                    reps);
                nlohmann::json row = {{"dtype", dtype_name(dtype)},
                                      {"D", D},
                                      {"S", S},
                                      {"B", B},
                                      {"H", H},
                                      {"causal", causal},
                                      {"fwd_s", fwd},
                                      {"fwd_gflops", flops / fwd / 1e9},
                                      {"fwd_fraction_of_peak", flops / fwd / 1e9 / peak}};
                if (S == 1024 || !opts->quick) {
                  const double bwd = median_s(
                      [&] {
                        attention_backward(
                            cpu,
                            {view(q), view(k), view(v), view(o), view(dout), lse.data(), view(dq), view(dk), view(dv)},
                            params);
                      },
                      1);
                  row["bwd_s"] = bwd;
                  row["bwd_gflops"] = 2.5 * flops / bwd / 1e9;
                  row["bwd_fraction_of_peak"] = 2.5 * flops / bwd / 1e9 / peak;
                }
                fmt::print(stderr, "{}\n", row.dump());
                r["dense"].push_back(row);
              }
            }
          }
        }
        // Decode: Hq = 32, Hkv = 8, D = 128; a dense f16 cache against a TurboQuant cache.
        const std::vector<std::int64_t> contexts = !opts->decode_contexts.empty() ? opts->decode_contexts
                                                   : opts->quick                  ? std::vector<std::int64_t>{4096}
                                                                 : std::vector<std::int64_t>{4096, 32768, 131072};
        for (std::int64_t ctx : contexts) {
          const std::int64_t H = 32, Hkv = 8, D = 128;
          auto k = random_bytes<std::uint8_t>(std::size_t(ctx * Hkv * D), DType::f16, rng), v = k;
          auto q = random_bytes<std::uint8_t>(std::size_t(H * D), DType::f16, rng), o = q;
          auto dense_decode = [&] {
            attention_forward(cpu,
                              {TensorView::bshd(q.data(), DType::f16, 1, 1, H, D),
                               TensorView::bshd(k.data(), DType::f16, 1, ctx, Hkv, D),
                               TensorView::bshd(v.data(), DType::f16, 1, ctx, Hkv, D),
                               TensorView::bshd(o.data(), DType::f16, 1, 1, H, D)},
                              AttentionParams{});
          };
          // Every preset, the seed's layout first (the rows of earlier runs are the seed's); each timed alternately
          // with the dense f16 decode, so that a row's ratio compares the two in the same minutes.
          for (const TqPreset& preset : tq_presets_seed_first()) {
            const TqCacheConfig config{1, tq_preset_layout(preset.name, D, Hkv, ctx), 7};
            TqKvCache cache(config, &cpu);
            const TensorView kv = TensorView::bshd(k.data(), DType::f16, 1, ctx, Hkv, D);
            cache.append(0, kv, kv, 0);
            const double encode = median_s([&] { TqKvCache(config, &cpu).append(0, kv, kv, 0); }, 1);
            std::vector<float> qf(std::size_t(H * D), 0.5f), out(std::size_t(H * D));
            const auto [dense, tq] = alternating_median_s(
                dense_decode,
                [&] {
                  cache.attend(0, TensorView::bshd(qf.data(), DType::f32, 1, 1, H, D), ctx - 1,
                               TensorView::bshd(out.data(), DType::f32, 1, 1, H, D));
                },
                decode_reps);
            const double dense_bytes = double(ctx * Hkv * D * 2 * 2), tq_bytes = double(ctx * cache.bytes_per_token());
            nlohmann::json row = {{"ctx", ctx},
                                  {"preset", preset.name},
                                  {"kernel", cpu.last_kernel()},
                                  {"dense_f16_s", dense},
                                  {"turboquant_s", tq},
                                  {"speedup", dense / tq},
                                  {"dense_bytes_per_token", 2 * 2 * Hkv * D},
                                  {"turboquant_bytes_per_token", cache.bytes_per_token()},
                                  {"dense_gbs", dense_bytes / dense / 1e9},
                                  {"turboquant_gbs", tq_bytes / tq / 1e9},
                                  {"encode_tokens_per_s", double(ctx) / encode}};
            fmt::print(stderr, "{}\n", row.dump());
            r["decode"].push_back(row);
          }
        }
        if (!opts->torch_json.empty()) {
          std::ifstream f(opts->torch_json);
          if (f) r["torch"] = nlohmann::json::parse(f);
        }
        if (!opts->output.empty()) std::ofstream(opts->output) << r.dump(2) << "\n";
        fmt::print("{}\n", opts->json ? r.dump(2) : r.dump());
        return 0;
      }};
}

}  // namespace flashtq::cli

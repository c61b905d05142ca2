// `flashtq demo`: an embedded LLM-shaped workload on every available backend, then a TurboQuant
// cache of 16k tokens: memory saved and error against exact attention.
#include <fmt/core.h>

#include <chrono>
#include <cmath>
#include <random>

#include "commands.hpp"
#include "conformance/conformance.hpp"
#include "conformance/host_tensor.hpp"
#include "flashtq/flashtq.hpp"
#include "reference/dense.hpp"

namespace flashtq::cli {
namespace {

// A chunk of 128 queries against a 1024-token context: GQA 8/2, causal bottom-right (offset
// Sk - Sq), a 512-token window, an additive mask shared across the batch, dropout 0.1.
conformance::DenseCase default_workload() {
  conformance::DenseCase c;
  c.B = 2;
  c.Sq = 128;
  c.Sk = 1024;
  c.H = 8;
  c.Hkv = 2;
  c.D = 64;
  c.dtype = DType::f32;
  c.causal = true;
  c.window = 512;
  c.mask = true;
  c.mask_broadcast = {true, false, false, false};
  c.dropout_p = 0.1f;
  c.seed = 1234;
  c.data_seed = 42;
  return c;
}

void dense_part() {
  const auto c = default_workload();
  fmt::print("Dense attention: {}\n", c.describe());
  fmt::print("{:<10} {:<9} {:>14} {:>11} {:>8}\n", "backend", "case", "rel. error", "time (ms)", "status");
  for (Backend* b : available_backends()) {
    for (const auto& r : {conformance::check_forward(*b, c), conformance::check_backward(*b, c)}) {
      fmt::print("{:<10} {:<9} {:>14.3e} {:>11.2f} {:>8}\n", b->name(), r.op, r.error, r.seconds * 1e3,
                 r.passed ? "ok" : "FAIL");
    }
  }
}

void turboquant_part() {
  const std::int64_t ctx = 16384, Hkv = 2, H = 8, D = 128, chunk = 16;
  Backend& host = default_backend();
  fmt::print("\nTurboQuant KV cache on '{}': {} tokens, {} kv heads, head_dim {}, keys 2+1 bits, values 2 bits\n",
             host.name(), ctx, Hkv, D);
  std::mt19937_64 rng(7);
  std::normal_distribution<float> n(0, 1);
  std::vector<float> k(std::size_t(ctx * Hkv * D)), v(k.size()), q(std::size_t(chunk * H * D));
  for (float& x : k) x = n(rng);
  for (float& x : v) x = n(rng);
  // Each query row leans towards one earlier key of its kv head, so attention is not uniform.
  std::uniform_int_distribution<std::int64_t> pick(0, ctx - chunk - 1);
  for (std::int64_t row = 0; row < chunk; ++row)
    for (std::int64_t h = 0; h < H; ++h) {
      const float* target = k.data() + (pick(rng) * Hkv + h / (H / Hkv)) * D;
      for (std::int64_t d = 0; d < D; ++d) q[std::size_t((row * H + h) * D + d)] = 1.5f * target[d] + n(rng);
    }

  TqKvCache cache({1, {D, Hkv, ctx, 2, 2}, 2024}, &host);
  auto t0 = std::chrono::steady_clock::now();
  cache.append(0, TensorView::bshd(k.data(), DType::f32, 1, ctx, Hkv, D),
               TensorView::bshd(v.data(), DType::f32, 1, ctx, Hkv, D), 0);
  const double encode_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const double bf16_bytes = double(ctx * Hkv * D * 2 * 2);
  fmt::print(
      "memory: {:.2f} MiB packed against {:.2f} MiB as bf16 ({} bytes per token per kv head, {:.2f}x smaller); "
      "encode {:.1f} ms\n",
      cache.memory_bytes() / 1048576.0, bf16_bytes / 1048576.0, cache.layout().bytes_per_token_per_head(),
      cache.compression_vs_bf16(), encode_ms);

  fmt::print("{:<24} {:>14} {:>11}\n", "case", "rel. error", "time (ms)");
  for (std::int64_t rows : {std::int64_t(1), chunk}) {
    const std::int64_t start = ctx - rows;
    std::vector<float> out(std::size_t(rows * H * D));
    t0 = std::chrono::steady_clock::now();
    cache.attend(0, TensorView::bshd(q.data(), DType::f32, 1, rows, H, D), start,
                 TensorView::bshd(out.data(), DType::f32, 1, rows, H, D));
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    // Exact attention over the uncompressed keys and values, in double.
    DenseProblem p;
    p.B = 1;
    p.Sq = rows;
    p.Sk = ctx;
    p.H = H;
    p.Hkv = Hkv;
    p.D = D;
    p.scale = float(1.0 / std::sqrt(double(D)));
    p.causal = true;
    p.causal_offset = start;
    std::vector<double> qd(q.begin(), q.begin() + rows * H * D), kd(k.begin(), k.end()), vd(v.begin(), v.end()),
        exact(std::size_t(rows * H * D));
    reference::dense_forward(p, qd.data(), kd.data(), vd.data(), exact.data(), nullptr);
    fmt::print("{:<24} {:>14.3e} {:>11.2f}\n",
               rows == 1 ? "decode (1 row)" : fmt::format("chunked prefill ({} rows)", rows),
               conformance::relative_error(exact, std::vector<double>(out.begin(), out.end())), ms);
  }
}

}  // namespace

Command add_demo(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("demo", "Run the embedded default workload on every available backend");
  return {sub, [] {
            dense_part();
            turboquant_part();
            return 0;
          }};
}

}  // namespace flashtq::cli

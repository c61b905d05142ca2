// `flashtq bench --gpu`: every available GPU backend (cuda, webgpu) side by side in one run, on
// the same shapes: the dense f32 and f16 forward and backward, TurboQuant decode and chunked prefill (rotate + attend)
// over a packed cache. Times are medians of repeated calls, each followed by the backend's synchronize().
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "commands.hpp"
#include "conformance/device_buffer.hpp"
#include "core/half.hpp"
#include "flashtq/flashtq.hpp"
#include "timing.hpp"
#ifdef FLASHTQ_HAVE_WEBGPU
#include "webgpu/peaks.hpp"
#endif

namespace flashtq::cli {
namespace {

// Median seconds of synchronised calls: the backend's queue drained after each.
template <typename F>
double median_synced(Backend& b, F&& f, int repeats) {
  return median_s(
      [&] {
        f();
        b.synchronize();
      },
      repeats);
}

std::vector<float> random_floats(std::size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> d(0, 1);
  std::vector<float> x(n);
  for (float& e : x) e = d(rng);
  return x;
}

// The inputs in `dtype` (f32, or f16 with each value rounded once).
conformance::DeviceBuffer upload_as(Backend& b, const std::vector<float>& x, DType dtype) {
  if (dtype == DType::f32) return conformance::DeviceBuffer(b, x);
  std::vector<std::uint16_t> h(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) h[i] = core::f32_to_f16(x[i]);
  return conformance::DeviceBuffer(b, h);
}

// The dense forward (or, with `backward`, the backward after one forward) at B = 1, H = 16, D = 128, not causal.
nlohmann::json dense(Backend& b, std::int64_t S, DType dtype, bool backward, int repeats) {
  const std::int64_t B = 1, H = 16, D = 128;
  std::mt19937_64 rng(3);
  const std::size_t n = std::size_t(B * S * H * D), bytes = n * dtype_size(dtype);
  conformance::DeviceBuffer q = upload_as(b, random_floats(n, rng), dtype),
                            k = upload_as(b, random_floats(n, rng), dtype),
                            v = upload_as(b, random_floats(n, rng), dtype),
                            dout = upload_as(b, random_floats(n, rng), dtype), o(b, bytes), dq(b, bytes), dk(b, bytes),
                            dv(b, bytes), lse(b, std::size_t(B * H * S) * 4);
  auto view = [&](void* p) { return TensorView::bshd(p, dtype, B, S, H, D, b.memory()); };
  auto* lse_at = static_cast<float*>(lse.get());
  auto forward = [&] {
    ForwardArgs f{view(q.get()), view(k.get()), view(v.get()), view(o.get())};
    f.lse = lse_at;
    attention_forward(b, f, AttentionParams{});
  };
  if (backward) forward();
  const double s = median_synced(
      b,
      [&] {
        if (!backward) return forward();
        attention_backward(b,
                           {view(q.get()), view(k.get()), view(v.get()), view(o.get()), view(dout.get()), lse_at,
                            view(dq.get()), view(dk.get()), view(dv.get())},
                           AttentionParams{});
      },
      repeats);
  // 4 B H S^2 D for the forward's two products, 2.5 times that for the backward's five.
  const double flops = (backward ? 10.0 : 4.0) * double(B * H) * double(S) * double(S) * double(D);
  const std::string op =
      std::string(backward ? "dense_backward_" : "dense_forward_") + (dtype == DType::f32 ? "f32" : "f16");
  return {{"op", op},
          {"B", B},
          {"S", S},
          {"H", H},
          {"D", D},
          {"causal", false},
          {"ms", s * 1e3},
          {"tflops", flops / s / 1e12},
          {"kernel", b.last_kernel()}};
}

// TurboQuant attention of n_queries rows per sequence at the end of a `ctx`-token cache (rotate + attend): decode
// (one row) or a chunk of prefill; `exact` asks for the exact path (the split-K kernels), for comparison.
nlohmann::json turboquant_attend(Backend& b, std::int64_t batch, std::int64_t ctx, std::int64_t n_queries, bool exact,
                                 int repeats) {
  const std::int64_t H = 32, Hkv = 8, D = 128;
  const TqLayout layout{D, Hkv, ctx, 2, 2};
  const TqTables tables = make_tq_tables(layout, 1234, 0);
  std::mt19937_64 rng(5);
  conformance::DeviceBuffer keys(b, std::size_t(batch * layout.key_words()) * 4),
      values(b, std::size_t(batch * layout.value_words()) * 4);
  {  // encode each sequence's whole context in chunks
    const std::int64_t chunk = std::min<std::int64_t>(ctx, 4096);
    conformance::DeviceBuffer x(b, random_floats(std::size_t(chunk * Hkv * D), rng));
    const TensorView xv = TensorView::bshd(x.get(), DType::f32, 1, chunk, Hkv, D, b.memory());
    for (std::int64_t s = 0; s < batch; ++s) {
      auto* k_image = static_cast<std::uint32_t*>(keys.get()) + s * layout.key_words();
      auto* v_image = static_cast<std::uint32_t*>(values.get()) + s * layout.value_words();
      for (std::int64_t t = 0; t < ctx; t += chunk) {
        tq_encode_keys(b, {tables, xv, t, k_image, nullptr});
        tq_encode_values(b, {tables, xv, t, v_image, nullptr});
      }
    }
    b.synchronize();
  }
  const std::int64_t rows = batch * n_queries;
  conformance::DeviceBuffer q(b, random_floats(std::size_t(rows * H * D), rng)), out(b, std::size_t(rows * H * D) * 4),
      scratch(b, std::size_t(tq_scratch_floats(rows, H, D)) * 4);
  TqAttendArgs a;
  a.tables = tables;
  a.scratch = static_cast<const float*>(scratch.get());
  a.n_heads = H;
  a.batch = batch;
  a.n_queries = n_queries;
  a.start_pos = ctx - n_queries;
  a.exact = exact;
  a.k_cache = static_cast<const std::uint32_t*>(keys.get());
  a.v_cache = static_cast<const std::uint32_t*>(values.get());
  a.out = TensorView::bshd(out.get(), DType::f32, batch, n_queries, H, D, b.memory());
  const std::size_t ws_bytes = tq_attend_workspace_bytes(b, a);
  conformance::DeviceBuffer ws(b, std::max<std::size_t>(ws_bytes, 4));
  a.workspace = ws.get();
  a.workspace_bytes = ws_bytes;
  const TensorView qv = TensorView::bshd(q.get(), DType::f32, batch, n_queries, H, D, b.memory());
  const double s = median_synced(
      b,
      [&] {
        tq_rotate_queries(b, {tables, qv, rows, static_cast<float*>(scratch.get()), nullptr});
        tq_attend(b, a);
      },
      repeats);
  const double packed = double(batch * ctx) * double(layout.bytes_per_token_per_head() * Hkv);
  const std::string op = n_queries == 1 ? "turboquant_decode" : "turboquant_prefill";
  return {{"op", exact ? op + "_exact" : op},
          {"batch", batch},
          {"n_queries", n_queries},
          {"ctx", ctx},
          {"H", H},
          {"Hkv", Hkv},
          {"D", D},
          {"ms", s * 1e3},
          {"packed_gbs", packed / s / 1e9},
          {"kernel", b.last_kernel()}};
}

}  // namespace

nlohmann::json bench_gpu_backends(bool quick) {
  nlohmann::json rows = nlohmann::json::array();
  // The GPU's limits, measured through WebGPU (the same GPU the cuda rows run on): each row's fraction of them.
  struct Peaks {
    double copy_gbs, copy_command_gbs, copy_kernel_gbs, f32_tflops, f16_tflops;
  };
  std::optional<Peaks> peaks;
#ifdef FLASHTQ_HAVE_WEBGPU
  if (const auto p = webgpu::measure_peaks())
    peaks = Peaks{p->copy_gbs, p->copy_command_gbs, p->copy_kernel_gbs, p->f32_tflops, p->f16_tflops};
#endif
  if (peaks) {
    nlohmann::json r = {{"op", "limits"},
                        {"copy_gbs", peaks->copy_gbs},
                        {"copy_command_gbs", peaks->copy_command_gbs},
                        {"copy_kernel_gbs", peaks->copy_kernel_gbs},
                        {"f32_fma_tflops", peaks->f32_tflops},
                        {"f16_fma_tflops", peaks->f16_tflops},
                        {"backend", "webgpu"}};
    fmt::print(stderr, "{}\n", r.dump());
    rows.push_back(r);
  }
  for (Backend* b : available_backends()) {
    if (b->memory() == Memory::host) continue;
    fmt::print(stderr, "gpu bench: {} on {}\n", b->name(), b->description());
    const int repeats = quick ? 3 : 10;
    // Runs one row and records it beside the limits; a row the backend refuses (a problem past its adapter's
    // limits) is recorded with the reason instead, and the rest run.
    auto record = [&](auto&& row) {
      nlohmann::json r;
      try {
        r = row();
        if (peaks && r.contains("tflops"))
          r["fraction_of_f32_fma_peak"] = r["tflops"].get<double>() / peaks->f32_tflops;
        if (peaks && r.contains("packed_gbs"))
          r["fraction_of_copy_bw"] = r["packed_gbs"].get<double>() / peaks->copy_gbs;
        r["device"] = b->description();
      } catch (const Error& e) {
        r = {{"error", e.what()}};
      }
      r["backend"] = b->name();
      fmt::print(stderr, "{}\n", r.dump());
      rows.push_back(r);
    };
    for (std::int64_t S : quick ? std::vector<std::int64_t>{512} : std::vector<std::int64_t>{1024, 4096})
      for (const bool backward : {false, true})
        for (DType dtype : {DType::f32, DType::f16}) record([&] { return dense(*b, S, dtype, backward, repeats); });
    using Decode = std::pair<std::int64_t, std::int64_t>;  // (batch, context)
    for (const auto& [batch, ctx] :
         quick ? std::vector<Decode>{{1, 4096}} : std::vector<Decode>{{1, 32768}, {8, 32768}})
      record([&] { return turboquant_attend(*b, batch, ctx, 1, false, repeats); });
    // Chunked prefill, the bf16-class path and the exact one (quick: within lavapipe's loop limit).
    using Chunk = std::pair<std::int64_t, std::int64_t>;  // (context, chunk)
    for (const auto& [ctx, chunk] :
         quick ? std::vector<Chunk>{{768, 128}} : std::vector<Chunk>{{32768, 512}, {32768, 2048}})
      for (const bool exact : {false, true})
        record([&] { return turboquant_attend(*b, 1, ctx, chunk, exact, repeats); });
  }
  return rows;
}

}  // namespace flashtq::cli

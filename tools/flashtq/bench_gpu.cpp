// `flashtq bench --gpu`: every available GPU backend (cuda, webgpu) side by side in one run, on
// the same shapes: the dense f32 forward and TurboQuant decode (rotate + attend) over a packed
// cache. Times are medians of repeated calls, each followed by the backend's synchronize().
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "commands.hpp"
#include "flashtq/flashtq.hpp"

namespace flashtq::cli {
namespace {

double seconds_now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Median seconds of `repeats` synchronised calls after a warm-up.
template <typename F>
double median_synced(Backend& b, F&& f, int repeats) {
  f();
  b.synchronize();
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    const double t0 = seconds_now();
    f();
    b.synchronize();
    t.push_back(seconds_now() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// A buffer of the backend's memory holding `host`.
struct DeviceArray {
  Backend& b;
  void* ptr;
  template <typename T>
  DeviceArray(Backend& backend, const std::vector<T>& host) : b(backend), ptr(backend.allocate(host.size() * sizeof(T))) {
    b.upload(ptr, host.data(), host.size() * sizeof(T));
  }
  DeviceArray(Backend& backend, std::size_t bytes) : b(backend), ptr(backend.allocate(bytes)) {}
  ~DeviceArray() { b.release(ptr); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
};

std::vector<float> random_floats(std::size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> d(0, 1);
  std::vector<float> x(n);
  for (float& e : x) e = d(rng);
  return x;
}

nlohmann::json dense_forward(Backend& b, std::int64_t S, int repeats) {
  const std::int64_t B = 1, H = 16, D = 128;
  std::mt19937_64 rng(3);
  const std::size_t n = std::size_t(B * S * H * D);
  DeviceArray q(b, random_floats(n, rng)), k(b, random_floats(n, rng)), v(b, random_floats(n, rng)), o(b, n * 4);
  auto view = [&](void* p) { return TensorView::bshd(p, DType::f32, B, S, H, D, b.memory()); };
  const double s = median_synced(
      b, [&] { attention_forward(b, {view(q.ptr), view(k.ptr), view(v.ptr), view(o.ptr)}, AttentionParams{}); }, repeats);
  const double flops = 4.0 * double(B * H) * double(S) * double(S) * double(D);
  return {{"op", "dense_forward_f32"}, {"B", B}, {"S", S}, {"H", H}, {"D", D}, {"causal", false},
          {"ms", s * 1e3}, {"tflops", flops / s / 1e12}};
}

nlohmann::json turboquant_decode(Backend& b, std::int64_t ctx, int repeats) {
  const std::int64_t H = 32, Hkv = 8, D = 128;
  const TqLayout layout{D, Hkv, ctx, 2, 2};
  const TqTables tables = make_tq_tables(layout, 1234, 0);
  std::mt19937_64 rng(5);
  DeviceArray keys(b, std::size_t(layout.key_words()) * 4), values(b, std::size_t(layout.value_words()) * 4);
  {  // encode the whole context in chunks
    const std::int64_t chunk = std::min<std::int64_t>(ctx, 4096);
    DeviceArray x(b, random_floats(std::size_t(chunk * Hkv * D), rng));
    for (std::int64_t t = 0; t < ctx; t += chunk) {
      const TensorView xv = TensorView::bshd(x.ptr, DType::f32, 1, chunk, Hkv, D, b.memory());
      tq_encode_keys(b, {layout, tables, xv, t, static_cast<std::uint32_t*>(keys.ptr), nullptr});
      tq_encode_values(b, {layout, tables, xv, t, static_cast<std::uint32_t*>(values.ptr), nullptr});
    }
    b.synchronize();
  }
  DeviceArray q(b, random_floats(std::size_t(H * D), rng)), out(b, std::size_t(H * D) * 4),
      scratch(b, std::size_t(tq_scratch_floats(1, H, D)) * 4);
  TqAttendArgs a;
  a.layout = layout;
  a.tables = tables;
  a.scratch = static_cast<const float*>(scratch.ptr);
  a.n_heads = H;
  a.start_pos = ctx - 1;
  a.k_cache = static_cast<const std::uint32_t*>(keys.ptr);
  a.v_cache = static_cast<const std::uint32_t*>(values.ptr);
  a.out = TensorView::bshd(out.ptr, DType::f32, 1, 1, H, D, b.memory());
  const std::size_t ws_bytes = tq_attend_workspace_bytes(b, a);
  DeviceArray ws(b, std::max<std::size_t>(ws_bytes, 4));
  a.workspace = ws.ptr;
  a.workspace_bytes = ws_bytes;
  const TensorView qv = TensorView::bshd(q.ptr, DType::f32, 1, 1, H, D, b.memory());
  const double s = median_synced(
      b,
      [&] {
        tq_rotate_queries(b, {tables, qv, 1, static_cast<float*>(scratch.ptr), nullptr});
        tq_attend(b, a);
      },
      repeats);
  const double packed = double(ctx) * double(layout.bytes_per_token_per_head() * Hkv);
  return {{"op", "turboquant_decode"}, {"batch", 1}, {"ctx", ctx}, {"H", H}, {"Hkv", Hkv}, {"D", D},
          {"ms", s * 1e3}, {"packed_gbs", packed / s / 1e9}};
}

}  // namespace

nlohmann::json bench_gpu_backends(bool quick) {
  nlohmann::json rows = nlohmann::json::array();
  for (Backend* b : available_backends()) {
    if (b->memory() == Memory::host) continue;
    fmt::print(stderr, "gpu bench: {} on {}\n", b->name(), b->description());
    const int repeats = quick ? 3 : 10;
    auto record = [&](nlohmann::json r) {
      r["backend"] = b->name();
      r["device"] = b->description();
      fmt::print(stderr, "{}\n", r.dump());
      rows.push_back(r);
    };
    for (std::int64_t S : quick ? std::vector<std::int64_t>{512} : std::vector<std::int64_t>{1024, 4096}) record(dense_forward(*b, S, repeats));
    for (std::int64_t ctx : quick ? std::vector<std::int64_t>{4096} : std::vector<std::int64_t>{8192, 32768}) {
      record(turboquant_decode(*b, ctx, repeats));
    }
  }
  return rows;
}

}  // namespace flashtq::cli

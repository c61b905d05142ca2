// bench/cuda_dense: dense attention on the `cuda` backend (forward bf16/f16/f32 — f32 three ways:
// the default error-compensated TF32, pedantic f32 FMAs and the opt-in TF32, each with its error
// against a double reference on sampled rows — and backward bf16), D = 128, H = 16, B*S = 16k with
// S = 1k, 4k, 16k, timed with CUDA events (median); then bf16 rows at other head dims and with GQA
// (shape_rows). Prints JSON; bench/cuda_dense.sh runs it beside PyTorch SDPA in one run. `--varlen`:
// a ragged batch against its padded batch (varlen_rows); `--shapes`: the shape rows alone.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "cuda_timing.hpp"
#include "flashtq/flashtq.hpp"

namespace {

using flashtq::DType;
using flashtq::Memory;
using flashtq::TensorView;

// The median of 20 timed calls after one warm-up call.
template <typename F>
double median_ms(F&& f) {
  return flashtq::bench::time_ms(f, nullptr, 20, 1);
}

// `bytes` of 16-bit elements with small finite values (a hash of the byte index; no NaN or infinity).
std::vector<std::uint8_t> small_finite_bytes(std::size_t bytes) {
  std::vector<std::uint8_t> host(bytes);
  for (std::size_t i = 0; i < bytes; ++i) host[i] = std::uint8_t((i * 2654435761u) >> 24) & 0x3B;
  return host;
}

// An f32 problem's host copies ([B, S, H, D]), for the error below.
struct Inputs {
  const float *q, *k, *v;
  std::int64_t B, S, H, D;
  bool causal;
};

// ||out - ref|| / ||ref|| over sampled rows (batch 0, heads 0 and 1, 32 rows spread over S) against
// attention computed in double on the host (scale 1/sqrt(D)); the rows torch_dense.py samples for
// the efficient backend's error.
double sampled_error(const Inputs& in, const void* device_out) {
  const std::int64_t S = in.S, H = in.H, D = in.D;
  auto at = [&](std::int64_t s, std::int64_t h) { return std::size_t((s * H + h) * D); };  // batch 0
  std::vector<float> out(static_cast<std::size_t>(D));  // the sampled row, copied back alone
  double num = 0, den = 0;
  for (std::int64_t h = 0; h < 2; ++h) {
    for (int t = 0; t < 32; ++t) {
      const std::int64_t i = (S - 1) * t / 31, keys = in.causal ? i + 1 : S;
      cudaMemcpy(out.data(), static_cast<const float*>(device_out) + at(i, h), std::size_t(D) * sizeof(float),
                 cudaMemcpyDeviceToHost);
      std::vector<double> w(static_cast<std::size_t>(keys)), ref(static_cast<std::size_t>(D), 0.0);
      double top = -INFINITY, sum = 0;
      for (std::int64_t j = 0; j < keys; ++j) {
        double dot = 0;
        for (std::int64_t d = 0; d < D; ++d) dot += double(in.q[at(i, h) + d]) * double(in.k[at(j, h) + d]);
        w[j] = dot / std::sqrt(double(D));
        top = std::max(top, w[j]);
      }
      for (std::int64_t j = 0; j < keys; ++j) sum += (w[j] = std::exp(w[j] - top));
      for (std::int64_t j = 0; j < keys; ++j)
        for (std::int64_t d = 0; d < D; ++d) ref[d] += w[j] / sum * double(in.v[at(j, h) + d]);
      for (std::int64_t d = 0; d < D; ++d) {
        const double e = out[d] - ref[d];
        num += e * e;
        den += ref[d] * ref[d];
      }
    }
  }
  return std::sqrt(num / den);
}

}  // namespace

// `cuda_dense_bench --half` runs the f16/bf16 rows only, `--f32` the f32 ones (quick comparisons while tuning).
// `--varlen`: a ragged batch of 16 causal bf16 sequences of mixed lengths (256 to 4096 tokens, a fixed draw), H 16,
// D 128, forward and backward, against the padded batch of the same sequences ([16, longest, H, D]: what a caller
// without ragged batches runs). Both hold the same real tokens, so the per-token ratio is the ratio of the times.
nlohmann::json varlen_rows(flashtq::Backend& cuda) {
  const std::int64_t H = 16, D = 128, B = 16;
  std::mt19937 rng(7);
  std::vector<std::int32_t> cu{0};
  std::int64_t longest = 0;
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t n = std::int64_t(256 * (1 + rng() % 16));
    cu.push_back(cu.back() + std::int32_t(n));
    longest = std::max(longest, n);
  }
  const std::int64_t T = cu.back(), padded = B * longest;
  const std::size_t bytes = std::size_t(padded * H * D) * 2;
  const std::vector<std::uint8_t> host = small_finite_bytes(bytes);
  void *q, *k, *v, *o, *dq, *dk, *dv, *dout;
  float* lse;
  for (void** p : {&q, &k, &v, &o, &dq, &dk, &dv, &dout}) {
    cudaMalloc(p, bytes);
    cudaMemcpy(*p, host.data(), bytes, cudaMemcpyHostToDevice);
  }
  cudaMalloc(&lse, std::size_t(B * H * longest) * 4);
  double flops = 0;  // causal
  for (std::int64_t b = 0; b < B; ++b)
    flops += 2.0 * double(H) * double(cu[b + 1] - cu[b]) * double(cu[b + 1] - cu[b]) * double(D);
  auto time = [&](std::int64_t batch, std::int64_t S, const flashtq::AttentionParams& params) {
    auto view = [&](void* p) { return TensorView::bshd(p, DType::bf16, batch, S, H, D, Memory::cuda); };
    const double fwd = median_ms([&] {
      flashtq::attention_forward(cuda, {view(q), view(k), view(v), view(o), lse}, params);
    });
    const std::string fwd_kernel = cuda.last_kernel();
    const double bwd = median_ms([&] {
      flashtq::attention_backward(
          cuda, {view(q), view(k), view(v), view(o), view(dout), lse, view(dq), view(dk), view(dv)}, params);
    });
    return nlohmann::json{{"fwd_ms", fwd},
                          {"bwd_ms", bwd},
                          {"fwd_kernel", fwd_kernel},
                          {"bwd_kernel", cuda.last_kernel()},
                          {"fwd_tflops", flops / (fwd * 1e-3) / 1e12},
                          {"bwd_tflops", 2.5 * flops / (bwd * 1e-3) / 1e12}};
  };
  flashtq::AttentionParams ragged, pad;
  ragged.causal = pad.causal = true;
  ragged.varlen = flashtq::Varlen{B, cu.data(), cu.data(), longest, longest, nullptr};
  nlohmann::json row = {{"sequences", B}, {"tokens", T}, {"padded_tokens", padded},
                        {"H", H},         {"D", D},      {"lengths", std::vector<std::int32_t>(cu.begin(), cu.end())}};
  row["ragged"] = time(1, T, ragged);
  row["padded"] = time(B, longest, pad);
  row["fwd_ratio_vs_padded"] = row["padded"]["fwd_ms"].get<double>() / row["ragged"]["fwd_ms"].get<double>();
  row["bwd_ratio_vs_padded"] = row["padded"]["bwd_ms"].get<double>() / row["ragged"]["bwd_ms"].get<double>();
  for (void* p : {q, k, v, o, dq, dk, dv, dout}) cudaFree(p);
  cudaFree(lse);
  return row;
}

// The shapes beside the D = 128 table (bf16, forward and backward, causal and not; bench/torch_dense.py times
// SDPA over the same list in the same order): head_dim 64 and 256 at S = 4k, head_dim 512 at S = 1k (where
// kernels without a tiled path at 512 still finish in seconds), and GQA (Hq = 32, Hkv = 8, D = 128) at S = 4k.
struct ShapeRow {
  std::int64_t B, S, Hq, Hkv, D;
  int repeats;
};
constexpr ShapeRow kShapeRows[] = {
    {4, 4096, 16, 16, 64, 20}, {4, 4096, 16, 16, 256, 20}, {16, 1024, 16, 16, 512, 3}, {4, 4096, 32, 8, 128, 20}};

nlohmann::json shape_rows(flashtq::Backend& cuda) {
  nlohmann::json rows = nlohmann::json::array();
  for (const ShapeRow& s : kShapeRows) {
    const std::size_t q_bytes = std::size_t(s.B * s.S * s.Hq * s.D) * 2,
                      kv_bytes = std::size_t(s.B * s.S * s.Hkv * s.D) * 2;
    const std::vector<std::uint8_t> host = small_finite_bytes(q_bytes);
    void *q, *k, *v, *o, *dq, *dk, *dv, *dout;
    float* lse;
    for (void** p : {&q, &k, &v, &o, &dq, &dk, &dv, &dout}) {
      const std::size_t bytes = p == &k || p == &v || p == &dk || p == &dv ? kv_bytes : q_bytes;
      cudaMalloc(p, bytes);
      cudaMemcpy(*p, host.data(), bytes, cudaMemcpyHostToDevice);
    }
    cudaMalloc(&lse, std::size_t(s.B * s.Hq * s.S) * 4);
    auto qv = [&](void* p) { return TensorView::bshd(p, DType::bf16, s.B, s.S, s.Hq, s.D, Memory::cuda); };
    auto kv = [&](void* p) { return TensorView::bshd(p, DType::bf16, s.B, s.S, s.Hkv, s.D, Memory::cuda); };
    for (bool causal : {false, true}) {
      flashtq::AttentionParams params;
      params.causal = causal;
      const double flops = 4.0 * double(s.B * s.Hq) * double(s.S) * double(s.S) * double(s.D) * (causal ? 0.5 : 1.0);
      const double fwd = flashtq::bench::time_ms(
          [&] {
            flashtq::attention_forward(cuda, {qv(q), kv(k), kv(v), qv(o), lse}, params);
          },
          nullptr, s.repeats, 1);
      const std::string fwd_kernel = cuda.last_kernel();
      const double bwd = flashtq::bench::time_ms(
          [&] {
            flashtq::attention_backward(cuda, {qv(q), kv(k), kv(v), qv(o), qv(dout), lse, qv(dq), kv(dk), kv(dv)},
                                        params);
          },
          nullptr, s.repeats, 1);
      nlohmann::json row = {{"dtype", "bf16"},
                            {"B", s.B},
                            {"S", s.S},
                            {"Hq", s.Hq},
                            {"Hkv", s.Hkv},
                            {"D", s.D},
                            {"causal", causal},
                            {"fwd_ms", fwd},
                            {"fwd_kernel", fwd_kernel},
                            {"fwd_tflops", flops / (fwd * 1e-3) / 1e12},
                            {"bwd_ms", bwd},
                            {"bwd_kernel", cuda.last_kernel()},
                            {"bwd_tflops", 2.5 * flops / (bwd * 1e-3) / 1e12}};
      std::fprintf(stderr, "%s\n", row.dump().c_str());
      rows.push_back(row);
    }
    for (void* p : {q, k, v, o, dq, dk, dv, dout}) cudaFree(p);
    cudaFree(lse);
  }
  return rows;
}

int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  flashtq::Backend& cuda = flashtq::backend("cuda");
  if (only == "--varlen") {
    std::printf("%s\n", nlohmann::json{{"varlen", varlen_rows(cuda)}}.dump(2).c_str());
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
  }
  nlohmann::json report;
  if (only == "--shapes") {
    report["shapes"] = shape_rows(cuda);
    std::printf("%s\n", report.dump(2).c_str());
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
  }
  const std::int64_t H = 16, D = 128;
  const std::vector<DType> dtypes = only == "--half"  ? std::vector<DType>{DType::bf16, DType::f16}
                                    : only == "--f32" ? std::vector<DType>{DType::f32}
                                                      : std::vector<DType>{DType::bf16, DType::f16, DType::f32};
  for (DType dtype : dtypes) {
    for (std::int64_t S : {1024, 4096, 16384}) {
      const std::int64_t B = 16384 / S;
      const std::size_t n = std::size_t(B * S * H * D), bytes = n * flashtq::dtype_size(dtype);
      // f32: standard normal values, q, k and v independent (the errors below are measured on them).
      auto fill = [&](unsigned seed) {
        if (dtype != DType::f32) return small_finite_bytes(bytes);
        std::vector<std::uint8_t> host(bytes);
        std::mt19937 rng(seed);
        std::normal_distribution<float> normal;
        auto* x = reinterpret_cast<float*>(host.data());
        for (std::size_t i = 0; i < n; ++i) x[i] = normal(rng);
        return host;
      };
      const std::vector<std::uint8_t> host_q = fill(1), host_k = fill(2), host_v = fill(3);
      void *q, *k, *v, *o, *dq, *dk, *dv, *dout;
      float* lse;
      for (void** p : {&q, &k, &v, &o, &dq, &dk, &dv, &dout}) {
        cudaMalloc(p, bytes);
        const auto& src = p == &k ? host_k : p == &v ? host_v : host_q;
        cudaMemcpy(*p, src.data(), bytes, cudaMemcpyHostToDevice);
      }
      cudaMalloc(&lse, std::size_t(B * H * S) * 4);
      auto view = [&](void* p) { return TensorView::bshd(p, dtype, B, S, H, D, Memory::cuda); };
      for (bool causal : {false, true}) {
        flashtq::AttentionParams params;
        params.causal = causal;
        const double flops = 4.0 * double(B * H) * double(S) * double(S) * double(D) * (causal ? 0.5 : 1.0);
        const double fwd = median_ms([&] {
          flashtq::attention_forward(cuda, {view(q), view(k), view(v), view(o), lse}, params);
        });
        nlohmann::json row = {
            {"dtype", flashtq::dtype_name(dtype)},      {"S", S}, {"B", B}, {"causal", causal}, {"fwd_ms", fwd},
            {"fwd_tflops", flops / (fwd * 1e-3) / 1e12}};
        if (dtype == DType::f32) {  // the default (3xTF32), pedantic (FFMA) and TF32 paths, each with its error
          auto as_floats = [](const std::vector<std::uint8_t>& h) { return reinterpret_cast<const float*>(h.data()); };
          const Inputs in{as_floats(host_q), as_floats(host_k), as_floats(host_v), B, S, H, D, causal};
          row["rel_error"] = sampled_error(in, o);
          flashtq::AttentionParams pedantic = params, fast = params;
          pedantic.pedantic_f32 = true;
          fast.allow_tf32 = true;
          for (const auto& [name, variant] : {std::pair{"pedantic", pedantic}, std::pair{"tf32", fast}}) {
            const double ms = median_ms([&] {
              flashtq::attention_forward(cuda, {view(q), view(k), view(v), view(dq), nullptr}, variant);
            });
            row[std::string(name) + "_fwd_ms"] = ms;
            row[std::string(name) + "_fwd_tflops"] = flops / (ms * 1e-3) / 1e12;
            row[std::string(name) + "_rel_error"] = sampled_error(in, dq);
          }
        }
        if (dtype == DType::bf16) {
          const double bwd = median_ms([&] {
            flashtq::attention_backward(
                cuda, {view(q), view(k), view(v), view(o), view(dout), lse, view(dq), view(dk), view(dv)}, params);
          });
          row["bwd_ms"] = bwd;
          row["bwd_tflops"] = 2.5 * flops / (bwd * 1e-3) / 1e12;
        }
        std::fprintf(stderr, "%s\n", row.dump().c_str());
        report["forward"].push_back(row);
      }
      for (void* p : {q, k, v, o, dq, dk, dv, dout}) cudaFree(p);
      cudaFree(lse);
    }
  }
  if (only.empty()) report["shapes"] = shape_rows(cuda);
  std::printf("%s\n", report.dump(2).c_str());
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}

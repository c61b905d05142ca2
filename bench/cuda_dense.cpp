// bench/cuda_dense: dense attention on the `cuda` backend (forward bf16/f16/f32, the opt-in TF32
// forward with its error against the exact f32 one, backward bf16), D = 128, H = 16, B*S = 16k with
// S = 1k, 4k, 16k, timed with CUDA events (median). Prints JSON; bench/cuda_dense.sh runs it beside
// PyTorch SDPA in one run.
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

}  // namespace

// `cuda_dense_bench --half` runs the f16/bf16 rows only, `--f32` the f32 ones (quick comparisons while tuning).
int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  flashtq::Backend& cuda = flashtq::backend("cuda");
  nlohmann::json report;
  const std::int64_t H = 16, D = 128;
  const std::vector<DType> dtypes = only == "--half" ? std::vector<DType>{DType::bf16, DType::f16}
                                    : only == "--f32" ? std::vector<DType>{DType::f32}
                                                      : std::vector<DType>{DType::bf16, DType::f16, DType::f32};
  for (DType dtype : dtypes) {
    for (std::int64_t S : {1024, 4096, 16384}) {
      const std::int64_t B = 16384 / S;
      const std::size_t n = std::size_t(B * S * H * D), bytes = n * flashtq::dtype_size(dtype);
      std::vector<std::uint8_t> host(bytes);
      if (dtype == DType::f32) {  // standard normal values: the TF32 error below is measured on them
        std::mt19937 rng(1);
        std::normal_distribution<float> normal;
        auto* x = reinterpret_cast<float*>(host.data());
        for (std::size_t i = 0; i < n; ++i) x[i] = normal(rng);
      } else {
        for (std::size_t i = 0; i < bytes; ++i) host[i] = std::uint8_t((i * 2654435761u) >> 24) & 0x3B;  // small finite values
      }
      void *q, *k, *v, *o, *dq, *dk, *dv, *dout;
      float* lse;
      for (void** p : {&q, &k, &v, &o, &dq, &dk, &dv, &dout}) {
        cudaMalloc(p, bytes);
        cudaMemcpy(*p, host.data(), bytes, cudaMemcpyHostToDevice);
      }
      cudaMalloc(&lse, std::size_t(B * H * S) * 4);
      auto view = [&](void* p) { return TensorView::bshd(p, dtype, B, S, H, D, Memory::cuda); };
      for (bool causal : {false, true}) {
        flashtq::AttentionParams params;
        params.causal = causal;
        const double flops = 4.0 * double(B * H) * double(S) * double(S) * double(D) * (causal ? 0.5 : 1.0);
        const double fwd = median_ms([&] { flashtq::attention_forward(cuda, {view(q), view(k), view(v), view(o), lse}, params); });
        nlohmann::json row = {{"dtype", flashtq::dtype_name(dtype)}, {"S", S}, {"B", B}, {"causal", causal},
                              {"fwd_ms", fwd}, {"fwd_tflops", flops / (fwd * 1e-3) / 1e12}};
        if (dtype == DType::f32) {  // the TF32 path beside the exact one, and its error against it
          std::vector<float> exact(n), tf32(n);
          cudaMemcpy(exact.data(), o, bytes, cudaMemcpyDeviceToHost);
          flashtq::AttentionParams fast = params;
          fast.allow_tf32 = true;
          const double ms = median_ms([&] { flashtq::attention_forward(cuda, {view(q), view(k), view(v), view(dq), nullptr}, fast); });
          cudaMemcpy(tf32.data(), dq, bytes, cudaMemcpyDeviceToHost);
          double num = 0, den = 0;
          for (std::size_t i = 0; i < n; ++i) {
            num += double(tf32[i] - exact[i]) * double(tf32[i] - exact[i]);
            den += double(exact[i]) * double(exact[i]);
          }
          row["tf32_fwd_ms"] = ms;
          row["tf32_fwd_tflops"] = flops / (ms * 1e-3) / 1e12;
          row["tf32_rel_error"] = std::sqrt(num / den);
        }
        if (dtype == DType::bf16) {
          const double bwd = median_ms(
              [&] {
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
  std::printf("%s\n", report.dump(2).c_str());
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}

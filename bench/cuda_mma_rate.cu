// bench/cuda_mma_rate: the GPU's peak rate of the two warp-level tensor-core instructions the
// TurboQuant kernels use (mma.sync m16n8k32 s8.u8 and m16n8k16 bf16, f32 accumulate), measured with
// every SM's warps issuing independent chains. Prints JSON: instructions per second and TOPS.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "cuda_timing.hpp"

namespace {

constexpr int kChains = 4;  // independent accumulators per warp
constexpr int kIterations = 4096;

__global__ void imma_loop(int* sink, std::uint32_t seed) {
  int acc[kChains][4] = {};
  const std::uint32_t a = seed * threadIdx.x, b = seed ^ threadIdx.x;
  for (int i = 0; i < kIterations; ++i) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) {
      asm volatile(
          "mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
          : "+r"(acc[c][0]), "+r"(acc[c][1]), "+r"(acc[c][2]), "+r"(acc[c][3])
          : "r"(a), "r"(a + 1), "r"(a + 2), "r"(a + 3), "r"(b), "r"(b + c));
    }
  }
  int total = 0;
  for (auto& c : acc) total += c[0] + c[1] + c[2] + c[3];
  if (total == 0x7FFFFFFF) *sink = total;  // keeps the work alive
}

__global__ void hmma_loop(float* sink, std::uint32_t seed) {
  float acc[kChains][4] = {};
  const std::uint32_t a = 0x3F803F80u ^ (seed & threadIdx.x), b = 0x3F803F80u;
  for (int i = 0; i < kIterations; ++i) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
          : "+f"(acc[c][0]), "+f"(acc[c][1]), "+f"(acc[c][2]), "+f"(acc[c][3])
          : "r"(a), "r"(a), "r"(a), "r"(a), "r"(b), "r"(b + c));
    }
  }
  float total = 0;
  for (auto& c : acc) total += c[0] + c[1] + c[2] + c[3];
  if (total == -1.0f) *sink = total;
}

}  // namespace

int main() {
  using flashtq::bench::check;
  using flashtq::bench::time_ms;
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "device");
  void* sink;
  check(cudaMalloc(&sink, 4), "malloc");
  const int blocks = prop.multiProcessorCount * 4, threads = 256;  // 8 warps per block, 32 per SM
  const double instructions = double(blocks) * (threads / 32) * kIterations * kChains;
  const double imma_ms = time_ms([&] { imma_loop<<<blocks, threads>>>(static_cast<int*>(sink), 3); }, nullptr, 10);
  const double hmma_ms = time_ms([&] { hmma_loop<<<blocks, threads>>>(static_cast<float*>(sink), 3); }, nullptr, 10);
  check(cudaGetLastError(), "mma loops");
  const double imma_rate = instructions / (imma_ms * 1e-3), hmma_rate = instructions / (hmma_ms * 1e-3);
  std::printf("{\"device\": \"%s\", \"sms\": %d,\n", prop.name, prop.multiProcessorCount);
  std::printf(" \"imma_m16n8k32_s8_per_s\": %.4g, \"imma_tops\": %.1f,\n", imma_rate,
              imma_rate * 2 * 16 * 8 * 32 / 1e12);
  std::printf(" \"hmma_m16n8k16_bf16_per_s\": %.4g, \"hmma_tflops\": %.1f}\n", hmma_rate,
              hmma_rate * 2 * 16 * 8 * 16 / 1e12);
  cudaFree(sink);
  return 0;
}

// Timing shared by the GPU benchmark drivers: CUDA events around each call, median of the repeats.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace flashtq::bench {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Median milliseconds of `repeats` calls of f on `stream`, after `warmups` untimed calls.
template <typename F>
double time_ms(F&& f, cudaStream_t stream = nullptr, int repeats = 20, int warmups = 3) {
  for (int i = 0; i < warmups; ++i) f();
  check(cudaDeviceSynchronize(), "warm-up");
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    cudaEventRecord(a, stream);
    f();
    cudaEventRecord(b, stream);
    check(cudaEventSynchronize(b), "timing");
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace flashtq::bench

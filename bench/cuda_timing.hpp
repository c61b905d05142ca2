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

// Overwrites a buffer four times the size of the L2 cache on `stream`, so that the next call reads its inputs
// from memory (a decode step reads each layer's cache once).
inline void flush_l2(cudaStream_t stream) {
  static const std::size_t bytes = [] {
    int device = 0, l2 = 0;
    check(cudaGetDevice(&device), "device");
    check(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device), "L2 size");
    return std::size_t(4) * std::size_t(l2);
  }();
  static void* buffer = [] {
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "malloc L2 flush buffer");
    return p;
  }();
  static unsigned char value = 0;
  check(cudaMemsetAsync(buffer, ++value, bytes, stream), "L2 flush");
}

// Median milliseconds of `repeats` calls of f on `stream`, after `warmups` untimed calls; with `cold`, each
// call after an L2 flush (outside the timed interval).
template <typename F>
double time_ms(F&& f, cudaStream_t stream = nullptr, int repeats = 20, int warmups = 3, bool cold = false) {
  for (int i = 0; i < warmups; ++i) f();
  check(cudaDeviceSynchronize(), "warm-up");
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    if (cold) flush_l2(stream);
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

// Kernel launches that may overlap the previous kernel in the stream (programmatic dependent launch).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "cuda/cuda_check.hpp"

namespace flashtq::cuda {

// Whether the current device takes programmatic dependent launches (compute capability 9.0+).
inline bool dependent_launch_supported() {
  int device = 0, major = 0;
  FLASHTQ_CUDA_CHECK(cudaGetDevice(&device));
  FLASHTQ_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major >= 9;
}

// Whether the current device is a Hopper (sm_90: wgmma, TMA, setmaxnreg).
inline bool device_is_hopper() {
  int device = 0, major = 0, minor = 0;
  FLASHTQ_CUDA_CHECK(cudaGetDevice(&device));
  FLASHTQ_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  FLASHTQ_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major == 9 && minor == 0;
}

// Lets `Kernel` take `bytes` of dynamic shared memory (above the default 48 KB); once per process.
template <auto Kernel>
void allow_shared_bytes(int bytes) {
  static const bool configured = [bytes] {
    FLASHTQ_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    return true;
  }();
  (void)configured;
}

// Calls f(std::integral_constant<int, D>) for the head dims the tiled dense kernels are built for
// (32, 64, 96, 128); false for any other.
template <typename F>
bool for_head_dim(std::int64_t D, F&& f) {
  switch (D) {
    case 32: f(std::integral_constant<int, 32>{}); return true;
    case 64: f(std::integral_constant<int, 64>{}); return true;
    case 96: f(std::integral_constant<int, 96>{}); return true;
    case 128: f(std::integral_constant<int, 128>{}); return true;
    default: return false;
  }
}

// kernel<<<grid, block, 0, stream>>>(args...), allowed to start launching while the kernel before it
// drains: its blocks must call wait_for_previous_grid() (common.cuh) before they touch what that
// kernel writes or reads. On older devices an ordinary launch.
template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, const char* name,
                      Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = dependent_launch_supported() ? 1 : 0;
  check(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), name);
}

}  // namespace flashtq::cuda

// Kernel launches that may overlap the previous kernel in the stream (programmatic dependent launch).
#pragma once

#include <cuda_runtime.h>

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

// kernel<<<grid, block, 0, stream>>>(args...), allowed to start launching while the kernel before it
// drains: its blocks must call wait_for_previous_grid() (common.cuh) before they touch what that
// kernel writes or reads. On older devices an ordinary launch.
template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, const char* name, Args&&... args) {
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

// Kernel launches that may overlap the previous kernel in the stream (programmatic dependent launch).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "cuda/cuda_check.hpp"
#include "cuda/kernel_choice.hpp"
#include "flashtq/error.hpp"

namespace flashtq::cuda {

// Whether the current device takes programmatic dependent launches (compute capability 9.0+).
inline bool dependent_launch_supported() {
  int device = 0, major = 0;
  FLASHTQ_CUDA_CHECK(cudaGetDevice(&device));
  FLASHTQ_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major >= 9;
}

// The current device's streaming multiprocessors (grids sized to one wave of resident blocks).
inline int multiprocessors() {
  int device = 0, count = 0;
  FLASHTQ_CUDA_CHECK(cudaGetDevice(&device));
  FLASHTQ_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
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

// Calls f(std::integral_constant<int, D>) for D = head_dim, one of the head dims the tiled dense
// kernels are built for (tiles::kTiledForwardDims); choose_dense_forward gives them no other.
template <typename F, std::size_t... I>
bool for_tiled_dim(std::int64_t D, F&& f, std::index_sequence<I...>) {
  return ((D == tiles::kTiledForwardDims[I] ? (f(std::integral_constant<int, tiles::kTiledForwardDims[I]>{}), true)
                                            : false) ||
          ...);
}
template <typename F>
void for_head_dim(std::int64_t D, F&& f) {
  if (!for_tiled_dim(D, f, std::make_index_sequence<tiles::kTiledForwardDims.size()>{}))
    throw Error("backend", "cuda: no tiled dense kernel for head_dim " + std::to_string(D));
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

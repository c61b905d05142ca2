// CUDA errors become the library error, naming the call and the code.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "flashtq/error.hpp"

namespace flashtq::cuda {

inline void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess) {
    throw Error("cuda",
                std::string(call) + " failed: " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
  }
}

}  // namespace flashtq::cuda

#define FLASHTQ_CUDA_CHECK(call) ::flashtq::cuda::check((call), #call)
// After a launch: a bad configuration shows up here, not at the next call.
#define FLASHTQ_CUDA_CHECK_LAUNCH(name) ::flashtq::cuda::check(cudaGetLastError(), name)

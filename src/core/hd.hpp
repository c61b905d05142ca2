// Marks small helpers that CUDA kernels share with host code, so both compute the same thing.
#pragma once

#include "flashtq/config.hpp"

#if defined(__CUDACC__)
#define FLASHTQ_HD __host__ __device__ __forceinline__
#else
#define FLASHTQ_HD inline
#endif

// Compiler glue: helpers of the public structs that CUDA kernels call too.
#pragma once

#if defined(__CUDACC__)
#define FLASHTQ_HOST_DEVICE __host__ __device__
#else
#define FLASHTQ_HOST_DEVICE
#endif

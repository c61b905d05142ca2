// Rows of a view set to zero, for the rows a ragged batch's sequences leave to no kernel (ragged.cpp).
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"

namespace flashtq::cuda {
namespace {

// Rows [0, n) of a [1, n, heads, D] view set to zero (the bits of 0 in every dtype), one block per (row, head).
template <typename Word>
__global__ void zero_rows_kernel(TensorView v) {
  const std::int64_t heads = v.shape[2], s = blockIdx.x / heads, h = blockIdx.x % heads;
  Word* row = static_cast<Word*>(v.data) + row_offset(v, 0, s, h);
  for (std::int64_t d = threadIdx.x; d < v.shape[3]; d += blockDim.x) row[d] = Word(0);
}

}  // namespace

void launch_zero_rows(const TensorView& v, void* stream_handle) {
  auto stream = static_cast<cudaStream_t>(stream_handle);
  const std::int64_t blocks = v.shape[1] * v.shape[2];
  if (blocks == 0) return;
  if (dtype_size(v.dtype) == 4) {
    zero_rows_kernel<float><<<unsigned(blocks), 64, 0, stream>>>(v);
  } else {
    zero_rows_kernel<unsigned short><<<unsigned(blocks), 64, 0, stream>>>(v);
  }
  FLASHTQ_CUDA_CHECK_LAUNCH("ragged batch: zero rows");
}

}  // namespace flashtq::cuda

// After every dense forward and backward, on the same stream: the rows the f32 kernels could not
// finish (docs/spec.md §3; a score past f32's range leaves the row NaN at the store, a NaN or infinity
// of a key the row does not see reaches it through a zero weight of a tensor-core product) are
// found by their non-finite elements and recomputed in double (dense_repair.cuh). One warp per row;
// a finite row costs the read of its elements. Kept out of the tiled kernels: inlined there, the
// double loops cost the wgmma forward up to 40 % (bench/results/cuda_dense-0027194.json), and called
// out of line from them, 15 % (cuda_dense-dfb17c5.json).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/dense_repair.cuh"
#include "cuda/kernels.hpp"

namespace flashtq::cuda {
namespace {

constexpr int kWarps = 8;

template <typename T>
__device__ bool row_is_finite(const TensorView& t, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t D,
                              int lane) {
  bool finite = true;
  const T* row = static_cast<const T*>(t.data) + row_offset(t, b, s, h);
  for (std::int64_t d = lane; d < D; d += 32) finite &= isfinite(to_float(row[d]));
  return finite;
}

// A light kernel finds whether any row is unfinished (few registers, so it reads the rows at
// bandwidth) and raises a flag; the repair kernels, heavy in registers, return at once when it is
// down. Each warp walks rows at a stride of the grid's warps (a block per 8 rows of the heavy kernel
// took about 1 ms in waves: bench/results/cuda_dense-2d35114.json; the heavy kernel scanning every row
// itself, 0.2 ms: cuda_dense-f5686d0.json).
__device__ __forceinline__ void row_of(std::int64_t row, const DenseProblem& p, std::int64_t& b, std::int64_t& i,
                                       std::int64_t& h) {
  b = row / (p.Sq * p.H), i = (row / p.H) % p.Sq, h = row % p.H;
}

template <typename T>
__global__ void __launch_bounds__(32 * kWarps)
    find_unfinished_rows(DenseProblem p, TensorView t, const float* lse, unsigned* flag) {
  const int lane = threadIdx.x % 32;
  const std::int64_t warps = std::int64_t(gridDim.x) * kWarps;
  bool finite = true;
  for (std::int64_t row = std::int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; row < p.B * p.Sq * p.H; row += warps) {
    std::int64_t b, i, h;
    row_of(row, p, b, i, h);
    finite &= row_is_finite<T>(t, b, i, h, p.D, lane);
    if (lse != nullptr && lane == 0) finite &= !isnan(lse[(b * p.H + h) * p.Sq + i]);
  }
  if (!__all_sync(0xFFFFFFFFu, finite) && lane == 0) atomicOr(flag, 1u);
}

template <typename T>
__global__ void __launch_bounds__(32 * kWarps) repair_forward_rows(ForwardCall c, const unsigned* flag) {
  if (*flag == 0) return;
  const DenseProblem& p = c.p;
  const int lane = threadIdx.x % 32;
  const std::int64_t warps = std::int64_t(gridDim.x) * kWarps;
  for (std::int64_t row = std::int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; row < p.B * p.Sq * p.H; row += warps) {
    std::int64_t b, i, h;
    row_of(row, p, b, i, h);
    bool finite = row_is_finite<T>(c.out, b, i, h, p.D, lane);
    if (c.lse != nullptr && lane == 0) finite &= !isnan(c.lse[(b * p.H + h) * p.Sq + i]);
    if (__all_sync(0xFFFFFFFFu, finite)) continue;
    const repair::RowStats stats = repair::row_stats<T>(p, c.q, c.k, b, h, i);
    T* out = static_cast<T*>(c.out.data) + row_offset(c.out, b, i, h);
    for (std::int64_t d = lane; d < p.D; d += 32)
      out[d] = from_float<T>(repair::output<T>(p, c.q, c.k, c.v, stats, b, h, i, d));
    if (c.lse != nullptr && lane == 0) c.lse[(b * p.H + h) * p.Sq + i] = float(stats.lse());
  }
}

template <typename T>
__global__ void __launch_bounds__(32 * kWarps) repair_dq_rows(BackwardCall c, const unsigned* flag) {
  if (*flag == 0) return;
  const DenseProblem& p = c.p;
  const int lane = threadIdx.x % 32;
  const std::int64_t warps = std::int64_t(gridDim.x) * kWarps;
  for (std::int64_t row = std::int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; row < p.B * p.Sq * p.H; row += warps) {
    std::int64_t b, i, h;
    row_of(row, p, b, i, h);
    if (__all_sync(0xFFFFFFFFu, row_is_finite<T>(c.dq, b, i, h, p.D, lane))) continue;
    T* dq = static_cast<T*>(c.dq.data) + row_offset(c.dq, b, i, h);
    for (std::int64_t d = lane; d < p.D; d += 32) dq[d] = from_float<T>(repair::dq<T>(c, b, h, i, d));
  }
}

// The flag of the current device, allocated once per device.
unsigned* device_flag() {
  static std::mutex mutex;
  static std::map<int, unsigned*> flags;
  int device = 0;
  FLASHTQ_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  unsigned*& flag = flags[device];
  if (flag == nullptr) FLASHTQ_CUDA_CHECK(cudaMalloc(&flag, sizeof(unsigned)));
  return flag;
}

template <typename F>
void by_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); break;
    case DType::f16: f(__half{}); break;
    case DType::bf16: f(__nv_bfloat16{}); break;
  }
}

unsigned blocks(const DenseProblem& p) {
  static const int sms = [] {
    int device = 0, count = 0;
    FLASHTQ_CUDA_CHECK(cudaGetDevice(&device));
    FLASHTQ_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    return count;
  }();
  const std::int64_t needed = (p.B * p.Sq * p.H + kWarps - 1) / kWarps;
  return unsigned(std::min<std::int64_t>(needed, 4 * std::int64_t(sms)));
}

}  // namespace

void repair_dense_forward(const ForwardCall& c) {
  if (c.p.B * c.p.Sq * c.p.H == 0) return;
  auto stream = static_cast<cudaStream_t>(c.stream);
  unsigned* flag = device_flag();
  FLASHTQ_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(unsigned), stream));
  by_dtype(c.p.dtype, [&](auto tag) {
    using T = decltype(tag);
    find_unfinished_rows<T><<<blocks(c.p), 32 * kWarps, 0, stream>>>(c.p, c.out, c.lse, flag);
    repair_forward_rows<T><<<blocks(c.p), 32 * kWarps, 0, stream>>>(c, flag);
  });
  FLASHTQ_CUDA_CHECK_LAUNCH("dense forward repair kernels");
}

void repair_dense_dq(const BackwardCall& c) {
  if (c.p.B * c.p.Sq * c.p.H == 0) return;
  auto stream = static_cast<cudaStream_t>(c.stream);
  unsigned* flag = device_flag();
  FLASHTQ_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(unsigned), stream));
  by_dtype(c.p.dtype, [&](auto tag) {
    using T = decltype(tag);
    find_unfinished_rows<T><<<blocks(c.p), 32 * kWarps, 0, stream>>>(c.p, c.dq, nullptr, flag);
    repair_dq_rows<T><<<blocks(c.p), 32 * kWarps, 0, stream>>>(c, flag);
  });
  FLASHTQ_CUDA_CHECK_LAUNCH("dense dq repair kernels");
}

}  // namespace flashtq::cuda

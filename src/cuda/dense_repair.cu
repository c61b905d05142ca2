// After every dense forward and backward, on the same stream: the rows the f32 kernels could not
// finish (docs/spec.md §3; a score past f32's range leaves the row NaN at the store, a NaN or infinity
// of a key the row does not see reaches it through a zero weight of a tensor-core product) are
// recomputed in double (dense_repair.cuh). The kernels raise a flag at their store when they meet
// such a row (unfinished_rows.cuh); the repair kernel returns at once when it is down, so a call of
// finished rows costs one launch. Kept out of the tiled kernels: inlined there, the double loops cost
// the wgmma forward up to 40 % (bench/results/cuda_dense-0027194.json), and called out of line from
// them, 15 % (cuda_dense-dfb17c5.json).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/dense_repair.cuh"
#include "cuda/kernels.hpp"
#include "cuda/launch.hpp"
#include "cuda/unfinished_rows.cuh"

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

// One per device, zero when the module loads; raised by the tiled kernels, lowered by take_raised.
__device__ UnfinishedRows unfinished_rows;

// Whether a kernel before this one on the stream raised the flag. Every block asks once, at its
// start; the last block to ask lowers the flag for the next call on the stream (the others have read
// it by then, and the next kernel starts after this one ends).
__device__ bool take_raised() {
  __shared__ bool raised;
  if (threadIdx.x == 0) {
    raised = atomicAdd(&unfinished_rows.raised, 0u) != 0;
    __threadfence();
    if (atomicAdd(&unfinished_rows.done, 1u) == gridDim.x - 1) {
      atomicExch(&unfinished_rows.raised, 0u);
      atomicExch(&unfinished_rows.done, 0u);
    }
  }
  __syncthreads();
  return raised;
}

// Each warp walks rows at a stride of the grid's warps (a block per 8 rows took about 1 ms in waves:
// bench/results/cuda_dense-2d35114.json), recomputing those with an element that is not finite.
__device__ __forceinline__ void row_of(std::int64_t row, const DenseProblem& p, std::int64_t& b, std::int64_t& i,
                                       std::int64_t& h) {
  b = row / (p.Sq * p.H), i = (row / p.H) % p.Sq, h = row % p.H;
}

template <typename T>
__global__ void __launch_bounds__(32 * kWarps) repair_forward_rows(ForwardCall c) {
  wait_for_previous_grid();
  if (!take_raised()) return;
  const DenseProblem& p = c.p;
  const int lane = threadIdx.x % 32;
  const std::int64_t warps = std::int64_t(gridDim.x) * kWarps;
  for (std::int64_t row = std::int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; row < p.B * p.Sq * p.H; row += warps) {
    std::int64_t b, i, h;
    row_of(row, p, b, i, h);
    bool finite = row_is_finite<T>(c.out, b, i, h, p.D, lane);
    if (c.lse != nullptr && lane == 0) finite &= !isnan(c.lse[p.lse_at(b, h, i)]);
    if (__all_sync(0xFFFFFFFFu, finite)) continue;
    // With pages, the sequence's own length and causal offset (as the decode kernel takes them) and its keys
    // through the table.
    DenseProblem row_problem = p;
    const PagedTable pages = p.paged ? c.table : PagedTable{};
    if (pages.page_table != nullptr) {
      const std::int64_t n = pages.seq_lens_k[b];
      row_problem.Sk = n < 0 ? 0 : n > p.Sk ? p.Sk : n;
      if (pages.offset_from_end) row_problem.causal_offset = row_problem.Sk - p.Sq;
    }
    const repair::RowStats stats = repair::row_stats<T>(row_problem, c.q, c.k, b, h, i, pages);
    T* out = static_cast<T*>(c.out.data) + row_offset(c.out, b, i, h);
    for (std::int64_t d = lane; d < p.D; d += 32)
      out[d] = from_float<T>(repair::output<T>(row_problem, c.q, c.k, c.v, stats, b, h, i, d, pages));
    if (c.lse != nullptr && lane == 0) c.lse[p.lse_at(b, h, i)] = float(stats.lse());
  }
}

template <typename T>
__global__ void __launch_bounds__(32 * kWarps) repair_dq_rows(BackwardCall c) {
  wait_for_previous_grid();
  if (!take_raised()) return;
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

// One wave: a block per SM (at most one per 8 rows). Launched as a dependent of the kernel before it
// (launch.hpp), so that its launch overlaps that kernel's last blocks; a finished call then costs
// each block two atomics.
unsigned blocks(const DenseProblem& p) {
  static const int sms = multiprocessors();
  const std::int64_t needed = (p.B * p.Sq * p.H + kWarps - 1) / kWarps;
  return unsigned(std::min<std::int64_t>(needed, sms));
}

}  // namespace

void repair_dense_forward(const ForwardCall& c) {
  if (c.p.B * c.p.Sq * c.p.H == 0) return;
  by_dtype(c.p.dtype, [&](auto tag) {
    launch_dependent(repair_forward_rows<decltype(tag)>, dim3(blocks(c.p)), dim3(32 * kWarps),
                     static_cast<cudaStream_t>(c.stream), "dense forward repair kernel", c);
  });
}

void repair_dense_dq(const BackwardCall& c) {
  if (c.p.B * c.p.Sq * c.p.H == 0) return;
  by_dtype(c.p.dtype, [&](auto tag) {
    launch_dependent(repair_dq_rows<decltype(tag)>, dim3(blocks(c.p)), dim3(32 * kWarps),
                     static_cast<cudaStream_t>(c.stream), "dense dq repair kernel", c);
  });
}

unsigned* unfinished_rows_flag() {
  static std::mutex mutex;
  static std::map<int, unsigned*> flags;  // the symbol's address on each device
  int device = 0;
  FLASHTQ_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  unsigned*& flag = flags[device];
  if (flag == nullptr) {
    void* address = nullptr;
    FLASHTQ_CUDA_CHECK(cudaGetSymbolAddress(&address, unfinished_rows));
    flag = &static_cast<UnfinishedRows*>(address)->raised;
  }
  return flag;
}

}  // namespace flashtq::cuda

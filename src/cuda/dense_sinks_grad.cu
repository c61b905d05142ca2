// The sinks' gradient of the dense backward (docs/spec.md §1.9): dsinks_h = -sum over (b, i) of
// P_sink(b, h, i) * D_i, with P_sink = exp(sink_h - lse_i) (the forward's lse holds the sink) and
// D_i = <dout_i, out_i>. One block per head summing its rows in a fixed order, so that the result is
// the same on every run, like the rest of the backward (no atomics).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"

namespace flashtq::cuda {
namespace {

constexpr int kWarps = 8;

template <typename T>
__global__ void __launch_bounds__(32 * kWarps) sinks_grad_kernel(BackwardCall c) {
  const DenseProblem& p = c.p;
  const std::int64_t h = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Read before anything is written: dsinks may be the sinks' own memory.
  const float sink = p.sinks[h];
  double acc = 0.0;
  for (std::int64_t row = warp; sink != -INFINITY && row < p.B * p.Sq; row += kWarps) {
    const std::int64_t b = row / p.Sq, i = row % p.Sq;
    const float lse = c.lse[p.lse_at(b, h, i)];
    if (lse == -INFINITY) continue;
    const T* dout = static_cast<const T*>(c.dout.data) + row_offset(c.dout, b, i, h);
    const T* out = static_cast<const T*>(c.out.data) + row_offset(c.out, b, i, h);
    float delta = 0.0f;
    for (std::int64_t d = lane; d < p.D; d += 32) delta = fmaf(to_float(dout[d]), to_float(out[d]), delta);
    delta = warp_sum(delta);
    acc -= double(fminf(expf(sink - lse), 1.0f)) * double(delta);  // P_sink is a probability (docs/spec.md §3)
  }
  __shared__ double partial[kWarps];
  if (lane == 0) partial[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double sum = 0.0;
    for (int w = 0; w < kWarps; ++w) sum += partial[w];
    c.dsinks[h] = float(sum);
  }
}

}  // namespace

void launch_dense_sinks_grad(const BackwardCall& c) {
  if (c.dsinks == nullptr || c.p.H == 0) return;
  by_dtype(c.p.dtype, [&](auto tag) {
    sinks_grad_kernel<decltype(tag)><<<unsigned(c.p.H), 32 * kWarps, 0, static_cast<cudaStream_t>(c.stream)>>>(c);
  });
  FLASHTQ_CUDA_CHECK_LAUNCH("dense backward sinks gradient");
}

}  // namespace flashtq::cuda

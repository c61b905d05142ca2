// Dense attention on CUDA: exact f32 arithmetic, one warp per query row (forward and dq) or per
// key row (dk, dv). Every feature of docs/spec.md §1; deterministic (no atomics). A correctness-first
// path: the tensor-core kernels of the CUDA dense issue replace it for f16/bf16 speed.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "core/hash3.hpp"
#include "core/softcap.hpp"
#include "core/visibility.hpp"
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/dense_repair.cuh"
#include "cuda/kernels.hpp"

namespace flashtq::cuda {
namespace {

constexpr int kWarps = 4;
// Lane l owns dims l + 32 e, e < kPer: 8 up to head_dim 256, 16 up to 512 (kernels are instantiated for both,
// so that the common head_dims keep the smaller register file).
constexpr int kLanesDims = 8, kWideLaneDims = 16;

struct RowIndex {
  std::int64_t b, h, s;
};
__device__ __forceinline__ RowIndex split_row(std::int64_t row, std::int64_t S, std::int64_t H) {
  return {row / S / H, (row / S) % H, row % S};
}

template <typename T, int kPer>
__device__ __forceinline__ void load_row(float (&x)[kPer], const T* base, int D, int lane) {
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int d = lane + 32 * e;
    x[e] = d < D ? to_float(base[d]) : 0.0f;
  }
}

template <typename T, int kPer>
__device__ __forceinline__ void store_row(T* base, const float (&x)[kPer], float factor, int D, int lane) {
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int d = lane + 32 * e;
    if (d < D) base[d] = from_float<T>(x[e] * factor);
  }
}

template <typename T, int kPer>
__device__ __forceinline__ float dot_row(const float (&x)[kPer], const T* base, int D, int lane) {
  float acc = 0.0f;
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int d = lane + 32 * e;
    if (d < D) acc = fmaf(x[e], to_float(base[d]), acc);
  }
  return warp_sum(acc);
}

// The score of a visible key, softcap(scale * <q, k>) + mask (-inf when masked, <= -1e30), and the
// cap's slope there (docs/spec.md §1.8; 1 without a cap), which dS carries back to <q, k>.
struct Score {
  float s, slope;
};
__device__ __forceinline__ Score score_of(const DenseProblem& p, float dot, std::int64_t b, std::int64_t h,
                                          std::int64_t i, std::int64_t j) {
  const core::CappedScore<float> capped = core::capped_with_slope(p.softcap, p.scale * dot);
  float s = capped.s;
  const float slope = capped.slope;
  if (p.mask != nullptr) {
    const float mask =
        p.mask[b * p.mask_strides[0] + h * p.mask_strides[1] + i * p.mask_strides[2] + j * p.mask_strides[3]];
    if (mask == -INFINITY) return {-INFINITY, slope};  // whatever the key holds (NaN + -inf is NaN)
    s += mask;
  }
  return {s <= -1e30f ? -INFINITY : s, slope};
}

using repair::dropout_factor;

template <typename T, int kPer>
__global__ void __launch_bounds__(32 * kWarps)
    forward_kernel(DenseProblem p, TensorView qv, TensorView kv, TensorView vv, TensorView ov, float* lse) {
  const int lane = threadIdx.x % 32;
  const std::int64_t row = std::int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= p.B * p.H * p.Sq) return;
  const auto [b, h, i] = split_row(row, p.Sq, p.H);
  const std::int64_t hk = h / p.group();
  const int D = int(p.D);
  float q[kPer], acc[kPer] = {};
  load_row(q, static_cast<const T*>(qv.data) + row_offset(qv, b, i, h), D, lane);
  float m = -INFINITY, l = 0.0f;
  const core::KeyRange range = core::key_range(p, i, i + 1);
  for (std::int64_t j = range.begin; j < range.end; ++j) {
    if (!core::key_visible(p, i, j)) continue;
    const float s =
        score_of(p, dot_row(q, static_cast<const T*>(kv.data) + row_offset(kv, b, j, hk), D, lane), b, h, i, j).s;
    if (s == -INFINITY) continue;
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new), e = expf(s - m_new);
    l = l * corr + e;
    const float w = e * dropout_factor<float>(p, b, h, i, j);
    const T* vrow = static_cast<const T*>(vv.data) + row_offset(vv, b, j, hk);
#pragma unroll
    for (int x = 0; x < kPer; ++x) {
      const int d = lane + 32 * x;
      acc[x] = acc[x] * corr + (d < D ? w * to_float(vrow[d]) : 0.0f);
    }
    m = m_new;
  }
  // A score past f32's range leaves m or l not finite: the row is finished in double (dense_repair.cuh).
  if (!(m == -INFINITY && l == 0.0f) && !(isfinite(m) && isfinite(l) && l > 0.0f)) {
    const repair::RowStats exact = repair::row_stats<T>(p, qv, kv, b, h, i);
#pragma unroll
    for (int x = 0; x < kPer; ++x) {
      const int d = lane + 32 * x;
      if (d < D) acc[x] = repair::output<T>(p, qv, kv, vv, exact, b, h, i, d);
    }
    store_row(static_cast<T*>(ov.data) + row_offset(ov, b, i, h), acc, 1.0f, D, lane);
    if (lse != nullptr && lane == 0) lse[p.lse_at(b, h, i)] = float(exact.lse());
    return;
  }
  // Head h's sink logit joins the sum and the maximum (docs/spec.md §1.9); it has no value.
  const float sink = p.sinks != nullptr ? p.sinks[h] : -INFINITY;
  float weight = 1.0f;
  if (sink != -INFINITY) {
    const float top = fmaxf(m, sink);
    weight = expf(m - top);
    l = l * weight + expf(sink - top);
    m = top;
  }
  const float inv = l > 0.0f ? weight / l : 0.0f;
  store_row(static_cast<T*>(ov.data) + row_offset(ov, b, i, h), acc, inv, D, lane);
  if (lse != nullptr && lane == 0) lse[p.lse_at(b, h, i)] = l > 0.0f ? m + logf(l) : -INFINITY;
}

// dq for one query row: sum_j dS_ij k_j with dS = P (dP - D_i) scale.
template <typename T, int kPer>
__global__ void __launch_bounds__(32 * kWarps) dq_kernel(BackwardCall c) {
  const DenseProblem& p = c.p;
  const int lane = threadIdx.x % 32;
  const std::int64_t row = std::int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= p.B * p.H * p.Sq) return;
  const auto [b, h, i] = split_row(row, p.Sq, p.H);
  const std::int64_t hk = h / p.group();
  const int D = int(p.D);
  float q[kPer], dout[kPer], dq[kPer] = {};
  load_row(q, static_cast<const T*>(c.q.data) + row_offset(c.q, b, i, h), D, lane);
  load_row(dout, static_cast<const T*>(c.dout.data) + row_offset(c.dout, b, i, h), D, lane);
  const float delta = dot_row(dout, static_cast<const T*>(c.out.data) + row_offset(c.out, b, i, h), D, lane);
  const float row_lse = c.lse[p.lse_at(b, h, i)];
  const core::KeyRange range = core::key_range(p, i, i + 1);
  for (std::int64_t j = range.begin; row_lse != -INFINITY && j < range.end; ++j) {
    if (!core::key_visible(p, i, j)) continue;
    const T* krow = static_cast<const T*>(c.k.data) + row_offset(c.k, b, j, hk);
    const Score s = score_of(p, dot_row(q, krow, D, lane), b, h, i, j);
    if (s.s == -INFINITY) continue;
    const float prob = fminf(expf(s.s - row_lse), 1.0f);  // a probability (docs/spec.md §3)
    const float z = dropout_factor<float>(p, b, h, i, j);
    const float dp = dot_row(dout, static_cast<const T*>(c.v.data) + row_offset(c.v, b, j, hk), D, lane) * z;
    const float ds = prob * (dp - delta) * p.scale * s.slope;
#pragma unroll
    for (int x = 0; x < kPer; ++x) {
      const int d = lane + 32 * x;
      if (d < D) dq[x] = fmaf(ds, to_float(krow[d]), dq[x]);
    }
  }
  store_row(static_cast<T*>(c.dq.data) + row_offset(c.dq, b, i, h), dq, 1.0f, D, lane);
}

// dk, dv for one key row, summing over every query head of its group and every row that sees it.
template <typename T, int kPer>
__global__ void __launch_bounds__(32 * kWarps) dkdv_kernel(BackwardCall c) {
  const DenseProblem& p = c.p;
  const int lane = threadIdx.x % 32;
  const std::int64_t row = std::int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= p.B * p.Hkv * p.Sk) return;
  const auto [b, hk, j] = split_row(row, p.Sk, p.Hkv);
  const int D = int(p.D);
  float k[kPer], v[kPer], dk[kPer] = {}, dv[kPer] = {};
  load_row(k, static_cast<const T*>(c.k.data) + row_offset(c.k, b, j, hk), D, lane);
  load_row(v, static_cast<const T*>(c.v.data) + row_offset(c.v, b, j, hk), D, lane);
  // Rows that can see key j: causal needs i >= j - offset, the window |i + offset - j| < window.
  std::int64_t lo = 0, hi = p.Sq;
  if (p.causal) lo = max(lo, j - p.causal_offset);
  if (p.window > 0) {
    lo = max(lo, j - p.causal_offset - p.window + 1);
    hi = min(hi, j - p.causal_offset + p.window);
  }
  for (std::int64_t g = 0; g < p.group(); ++g) {
    const std::int64_t h = hk * p.group() + g;
    for (std::int64_t i = lo; i < hi; ++i) {
      if (!core::key_visible(p, i, j)) continue;
      const float row_lse = c.lse[p.lse_at(b, h, i)];
      if (row_lse == -INFINITY) continue;
      const T* qrow = static_cast<const T*>(c.q.data) + row_offset(c.q, b, i, h);
      const Score s = score_of(p, dot_row(k, qrow, D, lane), b, h, i, j);
      if (s.s == -INFINITY) continue;
      float dout[kPer];
      load_row(dout, static_cast<const T*>(c.dout.data) + row_offset(c.dout, b, i, h), D, lane);
      const float delta = dot_row(dout, static_cast<const T*>(c.out.data) + row_offset(c.out, b, i, h), D, lane);
      const float prob = fminf(expf(s.s - row_lse), 1.0f);  // a probability (docs/spec.md §3)
      const float z = dropout_factor<float>(p, b, h, i, j);
      float dp = 0.0f;
#pragma unroll
      for (int x = 0; x < kPer; ++x) dp = fmaf(dout[x], v[x], dp);
      dp = warp_sum(dp) * z;
      const float ds = prob * (dp - delta) * p.scale * s.slope;
#pragma unroll
      for (int x = 0; x < kPer; ++x) {
        const int d = lane + 32 * x;
        if (d < D) {
          dv[x] = fmaf(prob * z, dout[x], dv[x]);
          dk[x] = fmaf(ds, to_float(qrow[d]), dk[x]);
        }
      }
    }
  }
  store_row(static_cast<T*>(c.dk.data) + row_offset(c.dk, b, j, hk), dk, 1.0f, D, lane);
  store_row(static_cast<T*>(c.dv.data) + row_offset(c.dv, b, j, hk), dv, 1.0f, D, lane);
}

unsigned blocks_for(std::int64_t rows) { return unsigned((rows + kWarps - 1) / kWarps); }

}  // namespace

void launch_dense_forward(const ForwardCall& c, DenseForwardKernel kernel) {
  switch (kernel) {
    case DenseForwardKernel::wgmma: launch_dense_forward_wgmma(c); break;
    case DenseForwardKernel::decode: launch_dense_decode(c); break;
    case DenseForwardKernel::mma: launch_dense_forward_mma(c); break;
    case DenseForwardKernel::tf32: launch_dense_forward_tf32(c); break;
    case DenseForwardKernel::ffma: launch_dense_forward_ffma(c); break;
    case DenseForwardKernel::warp_per_row: break;
  }
  if (kernel != DenseForwardKernel::warp_per_row) {
    repair_dense_forward(c);
    return;
  }
  auto stream = static_cast<cudaStream_t>(c.stream);
  by_dtype(c.p.dtype, [&](auto tag) {
    using T = decltype(tag);
    const unsigned blocks = blocks_for(c.p.B * c.p.H * c.p.Sq);
    if (c.p.D <= 32 * kLanesDims) {
      forward_kernel<T, kLanesDims><<<blocks, 32 * kWarps, 0, stream>>>(c.p, c.q, c.k, c.v, c.out, c.lse);
    } else {
      forward_kernel<T, kWideLaneDims><<<blocks, 32 * kWarps, 0, stream>>>(c.p, c.q, c.k, c.v, c.out, c.lse);
    }
  });
  FLASHTQ_CUDA_CHECK_LAUNCH("dense forward kernel");
}

void launch_dense_backward(const BackwardCall& c, DenseBackwardKernel kernel) {
  launch_dense_sinks_grad(c);  // before the wgmma kernels stash their row statistics in dQ's rows
  if (kernel == DenseBackwardKernel::wgmma) {
    launch_dense_backward_wgmma(c);
    repair_dense_dq(c);  // dQ = dS K meets the NaN of a key the row does not see through dS = 0
    return;
  }
  auto stream = static_cast<cudaStream_t>(c.stream);
  by_dtype(c.p.dtype, [&](auto tag) {
    using T = decltype(tag);
    const unsigned q_blocks = blocks_for(c.p.B * c.p.H * c.p.Sq), kv_blocks = blocks_for(c.p.B * c.p.Hkv * c.p.Sk);
    if (c.p.D <= 32 * kLanesDims) {
      dq_kernel<T, kLanesDims><<<q_blocks, 32 * kWarps, 0, stream>>>(c);
      dkdv_kernel<T, kLanesDims><<<kv_blocks, 32 * kWarps, 0, stream>>>(c);
    } else {
      dq_kernel<T, kWideLaneDims><<<q_blocks, 32 * kWarps, 0, stream>>>(c);
      dkdv_kernel<T, kWideLaneDims><<<kv_blocks, 32 * kWarps, 0, stream>>>(c);
    }
  });
  FLASHTQ_CUDA_CHECK_LAUNCH("dense backward kernels");
}

}  // namespace flashtq::cuda

// The pieces the Hopper dense backward's kernels share (dense_backward_wgmma.cu: the design, the row statistics and
// the launch; dense_backward_dkdv.cu: dK and dV; dense_backward_dq.cu: dQ): the block shape, the TMA maps, where
// a row's statistics are stashed, the gradients one score contributes, and each kernel's launcher.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/hash3.hpp"
#include "core/softcap.hpp"
#include "core/visibility.hpp"
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernel_choice.hpp"
#include "cuda/kernels.hpp"
#include "cuda/launch.hpp"
#include "cuda/tensor_map.hpp"
#include "cuda/tma.cuh"
#include "cuda/unfinished_rows.cuh"
#include "cuda/wgmma.cuh"

namespace flashtq::cuda::backward_wgmma {

constexpr int kGroups = 2, kThreads = 128 * (kGroups + 1);  // two consumer warpgroups, one producer
constexpr int kStages = 3;
[[maybe_unused]] constexpr int kGroupRows = 64;  // rows (keys for dK/dV, queries for dQ) per consumer warpgroup

struct Maps {
  CUtensorMap q, k, v, dout;
};

// The statistics of row (b, i, h), (lse2, delta), in the call's workspace ([B, H, Sq] float2; the launch provides
// it when the caller did not).
__device__ __forceinline__ float2* stash_of(const BackwardCall& c, std::int64_t b, std::int64_t i, std::int64_t h) {
  return static_cast<float2*>(c.workspace) + (b * c.p.H + h) * c.p.Sq + i;
}

#ifdef FLASHTQ_WGMMA
// Registers per thread once the producer gives its own back (see dense_wgmma.cu).
constexpr int kProducerRegisters = 24, kConsumerRegisters = 240;

// The two gradients one score contributes: P with dropout applied (dV's weight) and dS / scale (the
// kernels multiply dK and dQ by the softmax scale once, when they store them). `lse2` is the row's LSE in log2 units
// (+inf for a row that sees nothing, so P = 0); `checked` asks for the per-element visibility test (tiles not fully
// visible). (Not inlining it, to spare the instruction cache, was slower: the call saves every accumulator.)
struct ScoreGrads {
  float p_kept, ds;
};
__device__ __forceinline__ ScoreGrads score_grads(const DenseProblem& p, float s, float dp, float lse2, float delta,
                                                  std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j,
                                                  bool checked, float scale_log2, float keep_scale) {
  if (checked && (i >= p.Sq || !core::key_visible(p, i, j))) return {0.0f, 0.0f};
  float x = s * scale_log2, slope = 1.0f;
  if (p.softcap > 0.0f || p.mask != nullptr) {
    // The score in natural units; docs/spec.md §1.8: dS reaches <q, k> through the cap's slope.
    const core::CappedScore<float> capped = core::capped_with_slope(p.softcap, s * p.scale);
    float v = capped.s;
    slope = capped.slope;
    if (p.mask != nullptr) {
      const float mask =
          p.mask[b * p.mask_strides[0] + h * p.mask_strides[1] + i * p.mask_strides[2] + j * p.mask_strides[3]];
      v += mask;
      if (mask == -INFINITY || v <= -1e30f) return {0.0f, 0.0f};  // a -inf entry whatever the key holds
    }
    x = v * kLog2e;
  }
  const float pr = fminf(exp2_approx(x - lse2), 1.0f);  // a probability (docs/spec.md §3)
  float z = 1.0f;
  if (p.dropout_p > 0.0f) {
    z = core::dropout_keep(p.dropout_p, p.seed, p.dropout_bh(b, h), std::uint32_t(i), std::uint32_t(j)) ? keep_scale
                                                                                                        : 0.0f;
  }
  return {pr * z, pr * (dp * z - delta) * slope};
}

#endif  // FLASHTQ_WGMMA

constexpr int kKvRows = tiles::kWgmmaBackwardKeyRows, kQueryTile = 64;  // keys per block; query rows per tile
constexpr int kQRows = tiles::kWgmmaBackwardQueryRows, kKeyTile = 64,
              kDqStages = 3;  // query rows per block; keys per tile; tiles in flight

// Each kernel's launch (instantiated for f16 and bf16 at tiles::kWgmmaBackwardDims).
template <typename T, int D>
void launch_dkdv(const BackwardCall& c, const Maps& maps, cudaStream_t stream);
template <typename T, int D>
void launch_dq(const BackwardCall& c, const Maps& maps, cudaStream_t stream);

}  // namespace flashtq::cuda::backward_wgmma

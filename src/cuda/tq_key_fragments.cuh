// The query side of the tensor-core TurboQuant decode's key product, shared by the kernel that builds
// it (tq_key_fragments.cu) and the decode kernel that reads it (tq_decode_mma.cu).
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "cuda/tq_attend.cuh"

namespace flashtq::cuda {

constexpr int kD = 128;        // the head_dim of the tensor-core decode path
constexpr int kKeySteps = 12;  // k-steps of the key product: 8 code words, then 4 QJL words

// What the prepare kernel builds for one (query row, group of 4 heads): the A fragments of the key
// product (lane `lane` of k-step `step` loads a[step][lane]) and per head the constants that turn
// the integer products back into dot products.
struct KeyFragments {
  uint4 a[kKeySteps][32];
  float key_unscale[4], key_offset[4], jl_unscale[4], jl_sum[4];
};
static_assert(sizeof(KeyFragments) == kKeyFragmentBytes, "the workspace query counts these bytes");

// The bf16-class decode's query side (TqAttendKernel::decode_mma_bf16): the queries as 15-bit fixed point in
// two limbs, the B operand of mma.m16n8k32.u8.s8 whose columns are (head, limb) and whose rows (k) meet the
// cache word's bits; lane `lane` of k-step `step` loads b[step][lane]. Same stride in the workspace as
// KeyFragments.
struct KeyFragmentsBf16 {
  uint2 b[kKeySteps][32];
  float key_unscale[4], key_offset[4], jl_unscale[4], jl_sum[4];
};
static_assert(sizeof(KeyFragmentsBf16) <= kKeyFragmentBytes && sizeof(KeyFragmentsBf16) % 16 == 0);

// Limbs of the queries' fixed point: 4 for the exact decode, 2 for the bf16-class one.
template <int kLimbs>
using KeyFragmentsFor = std::conditional_t<kLimbs == 4, KeyFragments, KeyFragmentsBf16>;

}  // namespace flashtq::cuda

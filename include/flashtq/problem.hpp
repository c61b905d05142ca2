// Low-level, validated descriptions of one call: what every backend receives. They are produced
// only by the validator (src/core/validate.cpp) from the public arguments; all defaults are
// resolved (scale, causal_offset) and every size is known to fit in 64 bits.
#pragma once

#include <array>
#include <cstdint>

#include "flashtq/config.hpp"
#include "flashtq/tensor.hpp"

namespace flashtq {

struct DenseProblem {
  std::int64_t B = 0, Sq = 0, Sk = 0, H = 0, Hkv = 0, D = 0;
  DType dtype = DType::f32;
  float scale = 0.0f;
  bool causal = false;
  std::int64_t causal_offset = 0;  // explicit: query row i sits at i + causal_offset
  std::int64_t window = 0;
  const float* mask = nullptr;
  std::array<std::int64_t, 4> mask_strides{};
  float dropout_p = 0.0f;
  std::uint32_t seed = 0;
  bool tf32 = false;  // f32 products may run on TF32 tensor cores (AttentionParams::allow_tf32)
  bool pedantic = false;  // f32 products in f32 FMAs only (AttentionParams::pedantic_f32, without tf32)

  FLASHTQ_HOST_DEVICE std::int64_t group() const { return H / Hkv; }  // query heads per kv head
};

struct ForwardCall {
  DenseProblem p;
  TensorView q, k, v, out;
  float* lse = nullptr;
  void* stream = nullptr;
};

struct BackwardCall {
  DenseProblem p;
  TensorView q, k, v, out, dout, dq, dk, dv;
  const float* lse = nullptr;
  void* stream = nullptr;
};

}  // namespace flashtq

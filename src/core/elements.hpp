// Reading and writing one element of a view whatever its dtype, and view addressing.
#pragma once

#include <cstdint>

#include "core/half.hpp"
#include "flashtq/tensor.hpp"

namespace flashtq::core {

inline std::int64_t offset(const TensorView& t, std::int64_t b, std::int64_t s, std::int64_t h) {
  return b * t.strides[0] + s * t.strides[1] + h * t.strides[2];
}

inline float load(const void* base, DType dtype, std::int64_t index) {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(base)[index];
    case DType::f16: return f16_to_f32(static_cast<const std::uint16_t*>(base)[index]);
    case DType::bf16: return bf16_to_f32(static_cast<const std::uint16_t*>(base)[index]);
  }
  return 0.0f;
}

inline void store(void* base, DType dtype, std::int64_t index, float value) {
  switch (dtype) {
    case DType::f32: static_cast<float*>(base)[index] = value; break;
    case DType::f16: static_cast<std::uint16_t*>(base)[index] = f32_to_f16(value); break;
    case DType::bf16: static_cast<std::uint16_t*>(base)[index] = f32_to_bf16(value); break;
  }
}

}  // namespace flashtq::core

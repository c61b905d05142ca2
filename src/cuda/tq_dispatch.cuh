// The TurboQuant kernels' dispatch on a view's dtype and on head_dim: the element type T and E, the
// coordinates each lane of a warp owns (head_dim / 32), as compile-time arguments of f(T{}, E).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "flashtq/error.hpp"
#include "flashtq/tensor.hpp"

namespace flashtq::cuda {

template <typename F>
void by_dtype_and_width(DType t, std::int64_t head_dim, F&& f) {
  auto width = [&](auto tag) {
    switch (head_dim) {
      case 32: f(tag, std::integral_constant<int, 1>{}); break;
      case 64: f(tag, std::integral_constant<int, 2>{}); break;
      case 128: f(tag, std::integral_constant<int, 4>{}); break;
      case 256: f(tag, std::integral_constant<int, 8>{}); break;
      default: throw Error("head_dim", "no CUDA TurboQuant kernel for this head_dim");
    }
  };
  switch (t) {
    case DType::f32: width(float{}); break;
    case DType::f16: width(__half{}); break;
    case DType::bf16: width(__nv_bfloat16{}); break;
  }
}

}  // namespace flashtq::cuda

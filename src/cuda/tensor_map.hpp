// TMA tensor maps over the [B, S, H, D] views of the API (16-bit elements), made on the host through
// the driver entry point the runtime hands out (no link against libcuda).
#pragma once

#include <cuda.h>

#include <optional>

#include "flashtq/tensor.hpp"

namespace flashtq::cuda {

// A map whose box is 64 elements of D (128 bytes, swizzled by 128 bytes as wgmma reads them) x one
// head x `rows` sequence rows x one batch; coordinates (d, h, s, b). Empty when the view's strides
// cannot be described (TMA wants 16-byte multiples below 2^40).
std::optional<CUtensorMap> row_tile_map(const TensorView& t, unsigned rows);

}  // namespace flashtq::cuda

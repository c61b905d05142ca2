// Calibration of outlier channels (docs/spec.md §2.6) for the caches: the mask words that make the channels of
// largest mean square over sample keys each kv head's outliers.
#pragma once

#include <cstdint>
#include <vector>

#include "flashtq/backend.hpp"
#include "flashtq/turboquant.hpp"

namespace flashtq::core {

// keys [1, T, n_kv_heads, head_dim] in the backend's memory (any dtype; validated here, finite or refused):
// the layout's n_kv_heads * head_dim / 32 mask words (TqLayout::key_mask_offset).
std::vector<std::uint32_t> calibrated_outlier_masks(Backend& backend, const TqLayout& layout, const TensorView& keys);

}  // namespace flashtq::core

// Outlier channels of keys (docs/spec.md §2.6, docs/turboquant_layout.md): which channels of a kv head
// are its outliers (a mask in the key words), the order that puts them first, and calibration.
#pragma once

#include <cstdint>
#include <vector>

#include "core/hd.hpp"
#include "flashtq/turboquant.hpp"

namespace flashtq::core {

// The most parts a key has (head_dim 512 with 16 outliers: 16, 256, 128, 64, 32, 16): kernels keep a
// layout's parts in an array of this size instead of recomputing TqLayout::key_part per key.
inline constexpr int kMaxKeyParts = 6;

// The mask words of kv head h (head_dim / 32 of them) in a layer's key words.
FLASHTQ_HD const std::uint32_t* key_outlier_mask(const TqLayout& l, const std::uint32_t* key_words, std::int64_t h) {
  return key_words + l.key_mask_offset() + h * (l.head_dim / 32);
}

// order[i] = the channel at coordinate i of the permuted key: the head's outlier channels ascending,
// then the others ascending. A mask without exactly key_outliers bits set (an uncalibrated cache's
// zeros, or damaged words) means channels [0, key_outliers), so every mask gives a permutation.
FLASHTQ_HD void key_channel_order(const TqLayout& l, const std::uint32_t* mask, std::int32_t* order) {
  const std::int32_t D = std::int32_t(l.head_dim);
  std::int32_t set = 0;
  for (std::int32_t c = 0; c < D; ++c) set += std::int32_t((mask[c / 32] >> (c % 32)) & 1u);
  const bool calibrated = set == l.key_outliers;
  auto outlier = [&](std::int32_t c) {
    return calibrated ? ((mask[c / 32] >> (c % 32)) & 1u) != 0 : c < l.key_outliers;
  };
  std::int32_t first = 0, rest = l.key_outliers;
  for (std::int32_t c = 0; c < D; ++c) {
    if (outlier(c)) {
      order[first++] = c;
    } else {
      order[rest++] = c;
    }
  }
}

// Calibration: the mask words (n_kv_heads * head_dim / 32) that make the key_outliers channels of
// largest mean square over `sum_squares` (per kv head and channel, [n_kv_heads][head_dim]) each
// head's outliers; ties go to the lower channel.
std::vector<std::uint32_t> outlier_masks_from_energy(const TqLayout& l, const std::vector<double>& sum_squares);

}  // namespace flashtq::core

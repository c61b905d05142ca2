#include "core/tq_outliers.hpp"

#include <algorithm>
#include <numeric>

namespace flashtq::core {

std::vector<std::uint32_t> outlier_masks_from_energy(const TqLayout& l, const std::vector<double>& sum_squares) {
  const std::int64_t D = l.head_dim;
  std::vector<std::uint32_t> masks(std::size_t(l.n_kv_heads * D / 32), 0u);
  std::vector<std::int32_t> channels(static_cast<std::size_t>(D));
  for (std::int64_t h = 0; h < l.n_kv_heads; ++h) {
    const double* energy = sum_squares.data() + h * D;
    std::iota(channels.begin(), channels.end(), 0);
    std::stable_sort(channels.begin(), channels.end(),
                     [&](std::int32_t a, std::int32_t b) { return energy[a] > energy[b]; });
    for (std::int32_t i = 0; i < l.key_outliers; ++i) {
      const std::int32_t c = channels[std::size_t(i)];
      masks[std::size_t(h * D / 32 + c / 32)] |= 1u << (c % 32);
    }
  }
  return masks;
}

}  // namespace flashtq::core

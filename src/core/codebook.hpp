// Lloyd–Max codebooks for one coordinate of a uniformly random unit vector in R^D, computed by
// Lloyd iterations on the exact density (1 - x^2)^((D-3)/2) and cached per (D, bits).
#pragma once

#include <cstdint>
#include <vector>

namespace flashtq::core {

struct Codebook {
  std::vector<double> centroids;   // 2^bits, ascending
  std::vector<double> boundaries;  // 2^bits - 1 midpoints
  double mse_per_coordinate = 0;   // expected squared error of one coordinate
};

// Thread-safe; the first call for a (D, bits) runs the iterations (milliseconds).
const Codebook& codebook(std::int64_t head_dim, int bits);

// Index = number of boundaries <= x.
template <typename T, typename B>
inline int quantize(T x, const B* boundaries, int n_boundaries) {
  int idx = 0;
  for (int i = 0; i < n_boundaries; ++i) idx += (x >= T(boundaries[i])) ? 1 : 0;
  return idx;
}

}  // namespace flashtq::core

#include "core/tq_calibration.hpp"

#include <cmath>
#include <string>

#include "core/elements.hpp"
#include "core/tq_outliers.hpp"
#include "core/validate.hpp"
#include "flashtq/error.hpp"

namespace flashtq::core {

std::vector<std::uint32_t> calibrated_outlier_masks(Backend& backend, const TqLayout& l, const TensorView& keys) {
  validate_tq_calibration(backend, l, keys);
  // The view's extent, copied to the host where it is not there already.
  std::int64_t extent = keys.shape[3];
  for (int d = 0; d < 3; ++d) extent += (keys.shape[d] - 1) * keys.strides[d];
  const std::size_t bytes = std::size_t(extent) * dtype_size(keys.dtype);
  std::vector<unsigned char> copy;
  TensorView host = keys;
  if (keys.memory != Memory::host) {
    copy.resize(bytes);
    backend.synchronize();
    backend.download(copy.data(), keys.data, bytes);
    host.data = copy.data();
    host.memory = Memory::host;
  }
  std::vector<double> energy(std::size_t(l.n_kv_heads * l.head_dim), 0.0);
  for (std::int64_t t = 0; t < keys.shape[1]; ++t) {
    for (std::int64_t h = 0; h < l.n_kv_heads; ++h) {
      const std::int64_t base = offset(host, 0, t, h);
      for (std::int64_t d = 0; d < l.head_dim; ++d) {
        const double x = load(host.data, host.dtype, base + d);
        if (!std::isfinite(x)) {
          throw Error("keys", "row (0, " + std::to_string(t) + ", " + std::to_string(h) +
                                  ") holds a NaN or an infinity; calibration needs finite keys");
        }
        energy[std::size_t(h * l.head_dim + d)] += x * x;
      }
    }
  }
  return outlier_masks_from_energy(l, energy);
}

}  // namespace flashtq::core

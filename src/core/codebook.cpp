#include "core/codebook.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <utility>

namespace flashtq::core {
namespace {

// Cumulative integrals of f and x*f on a fine grid, so any cell's mass and first moment are two
// interpolated lookups. The grid covers +-14 standard deviations (or all of [-1, 1]).
struct Density {
  std::vector<double> x, mass, moment, second;

  explicit Density(std::int64_t dim) {
    const double half_width = std::min(1.0, 14.0 / std::sqrt(double(dim)));
    const int n = 1 << 17;
    x.resize(n + 1);
    mass.assign(n + 1, 0.0);
    moment.assign(n + 1, 0.0);
    second.assign(n + 1, 0.0);
    const double exponent = 0.5 * double(dim - 3);
    auto f = [&](double t) { return std::exp(exponent * std::log1p(-t * t)); };
    const double h = 2 * half_width / n;
    double prev_f = f(-half_width);
    x[0] = -half_width;
    for (int i = 1; i <= n; ++i) {
      x[i] = -half_width + i * h;
      const double cur_f = (i == n && half_width >= 1.0) ? 0.0 : f(x[i]);
      const double a = x[i - 1], b = x[i];
      mass[i] = mass[i - 1] + 0.5 * h * (prev_f + cur_f);
      moment[i] = moment[i - 1] + 0.5 * h * (a * prev_f + b * cur_f);
      second[i] = second[i - 1] + 0.5 * h * (a * a * prev_f + b * b * cur_f);
      prev_f = cur_f;
    }
    const double total = mass[n];
    for (int i = 0; i <= n; ++i) {
      mass[i] /= total;
      moment[i] /= total;
      second[i] /= total;
    }
  }

  // Linear interpolation of a cumulative table at t.
  double at(const std::vector<double>& table, double t) const {
    if (t <= x.front()) return 0.0;
    if (t >= x.back()) return table.back();
    const double h = x[1] - x[0];
    const double pos = (t - x.front()) / h;
    const auto i = static_cast<std::size_t>(pos);
    const double frac = pos - double(i);
    return table[i] + frac * (table[i + 1] - table[i]);
  }
};

Codebook lloyd_max(std::int64_t dim, int bits) {
  const Density density(dim);
  const int levels = 1 << bits;
  const double lo = -2.0, hi = 2.0;  // beyond every grid: whole tails
  Codebook cb;
  cb.centroids.resize(levels);
  // Start from the Gaussian-limit quantiles, spread over +-2 standard deviations.
  const double sigma = 1.0 / std::sqrt(double(dim));
  for (int i = 0; i < levels; ++i) cb.centroids[i] = sigma * (-2.0 + 4.0 * (i + 0.5) / levels);
  cb.boundaries.resize(levels - 1);
  for (int iter = 0; iter < 5000; ++iter) {
    for (int i = 0; i + 1 < levels; ++i) cb.boundaries[i] = 0.5 * (cb.centroids[i] + cb.centroids[i + 1]);
    double change = 0;
    for (int i = 0; i < levels; ++i) {
      const double a = i == 0 ? lo : cb.boundaries[i - 1];
      const double b = i == levels - 1 ? hi : cb.boundaries[i];
      const double m = density.at(density.mass, b) - density.at(density.mass, a);
      const double mx = density.at(density.moment, b) - density.at(density.moment, a);
      const double c = m > 0 ? mx / m : cb.centroids[i];
      change = std::max(change, std::abs(c - cb.centroids[i]));
      cb.centroids[i] = c;
    }
    if (change < 1e-15) break;
  }
  // Symmetrize: the density is even, so the exact quantizer is too.
  for (int i = 0; i < levels / 2; ++i) {
    const double c = 0.5 * (cb.centroids[levels - 1 - i] - cb.centroids[i]);
    cb.centroids[i] = -c;
    cb.centroids[levels - 1 - i] = c;
  }
  for (int i = 0; i + 1 < levels; ++i) cb.boundaries[i] = 0.5 * (cb.centroids[i] + cb.centroids[i + 1]);
  double mse = 0;
  for (int i = 0; i < levels; ++i) {
    const double a = i == 0 ? lo : cb.boundaries[i - 1];
    const double b = i == levels - 1 ? hi : cb.boundaries[i];
    const double c = cb.centroids[i];
    const double m = density.at(density.mass, b) - density.at(density.mass, a);
    const double mx = density.at(density.moment, b) - density.at(density.moment, a);
    const double mxx = density.at(density.second, b) - density.at(density.second, a);
    mse += mxx - 2 * c * mx + c * c * m;
  }
  cb.mse_per_coordinate = mse;
  return cb;
}

}  // namespace

const Codebook& codebook(std::int64_t head_dim, int bits) {
  static std::mutex mutex;
  static std::map<std::pair<std::int64_t, int>, Codebook> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto key = std::make_pair(head_dim, bits);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, lloyd_max(head_dim, bits)).first;
  return it->second;
}

}  // namespace flashtq::core

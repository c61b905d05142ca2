// Host tensors for the suite: random data rounded into a dtype, poisoning, and gathering values.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/elements.hpp"
#include "flashtq/tensor.hpp"

namespace flashtq::conformance {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct HostTensor {
  std::vector<std::uint8_t> bytes;
  TensorView view;  // points into bytes

  HostTensor(std::array<std::int64_t, 4> shape, DType dtype, bool bhsd) {
    const auto [B, S, H, D] = shape;
    bytes.assign(std::size_t(B * S * H * D) * dtype_size(dtype), 0);
    view = bhsd ? TensorView::bhsd(bytes.data(), dtype, B, H, S, D) : TensorView::bshd(bytes.data(), dtype, B, S, H, D);
  }
  HostTensor(const HostTensor& o) : bytes(o.bytes), view(o.view) { view.data = bytes.data(); }
  HostTensor& operator=(const HostTensor&) = delete;

  // Replaces the contents (same size), keeping the view's pointer valid.
  void assign(const std::vector<std::uint8_t>& from) { std::copy(from.begin(), from.end(), bytes.begin()); }

  std::int64_t numel() const { return view.shape[0] * view.shape[1] * view.shape[2] * view.shape[3]; }

  // Every element at its logical index (b, s, h, d) in [B, S, H, D] order.
  template <typename F>
  void for_each(F&& f) const {
    const auto [B, S, H, D] = view.shape;
    std::int64_t n = 0;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t d = 0; d < D; ++d) f(n++, core::offset(view, b, s, h) + d);
  }
  void fill_normal(std::mt19937_64& rng, double stddev = 1.0) {
    std::normal_distribution<float> dist(0.0f, float(stddev));
    for_each([&](std::int64_t, std::int64_t at) { core::store(view.data, view.dtype, at, dist(rng)); });
  }
  void fill(const std::vector<double>& values) {
    for_each([&](std::int64_t n, std::int64_t at) {
      core::store(view.data, view.dtype, at, float(values[std::size_t(n)]));
    });
  }
  // x <- f(b, s, h, x) for every element.
  template <typename F>
  void map(F&& f) {
    const auto [B, S, H, D] = view.shape;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t d = 0; d < D; ++d) {
            const std::int64_t at = core::offset(view, b, s, h) + d;
            core::store(view.data, view.dtype, at, f(b, s, h, core::load(view.data, view.dtype, at)));
          }
  }
  // Row (b, s, h) <- f(d).
  template <typename F>
  void set_row(std::int64_t b, std::int64_t s, std::int64_t h, F&& f) {
    for (std::int64_t d = 0; d < view.shape[3]; ++d)
      core::store(view.data, view.dtype, core::offset(view, b, s, h) + d, float(f(d)));
  }
  void poison() {
    for_each([&](std::int64_t, std::int64_t at) {
      core::store(view.data, view.dtype, at, std::numeric_limits<float>::quiet_NaN());
    });
  }
  // Values in contiguous [B, S, H, D] order, as the oracle takes them.
  std::vector<double> values() const {
    std::vector<double> x(static_cast<std::size_t>(numel()));
    for_each([&](std::int64_t n, std::int64_t at) { x[std::size_t(n)] = core::load(view.data, view.dtype, at); });
    return x;
  }
  // The same tensor, its data in a backend buffer.
  TensorView on(void* device_data, Memory memory) const {
    TensorView v = view;
    v.data = device_data;
    v.memory = memory;
    return v;
  }
};

// ||got - ref|| / max(||ref||, floor_rms * sqrt(n)); infinity (with a reason) for a NaN, or where
// infinite entries disagree. The floor keeps a reference that cancels to (nearly) zero from turning
// f32 rounding into a huge relative error (a gradient of a softmax over one key, say).
inline double relative_error(const std::vector<double>& ref, const std::vector<double>& got, std::string& detail,
                             double floor_rms = 0.0) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const bool ref_inf = std::isinf(ref[i]);
    if (ref_inf || std::isnan(got[i]) || std::isinf(got[i])) {
      if (ref_inf && got[i] == ref[i]) continue;
      detail = "element " + std::to_string(i) + " is " + std::to_string(got[i]) + ", oracle " + std::to_string(ref[i]);
      return std::numeric_limits<double>::infinity();
    }
    diff += (got[i] - ref[i]) * (got[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  norm = std::max(norm, floor_rms * floor_rms * double(ref.size()));
  if (norm == 0) return std::sqrt(diff);
  return std::sqrt(diff / norm);
}

inline double relative_error(const std::vector<double>& ref, const std::vector<double>& got) {
  std::string detail;
  return relative_error(ref, got, detail);
}

}  // namespace flashtq::conformance

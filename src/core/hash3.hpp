// The seeds' counter-based hash, bit-exact: every backend must make the same dropout decisions.
#pragma once

#include <cstdint>

#include "core/hd.hpp"

namespace flashtq::core {

FLASHTQ_HD float hash3(std::uint32_t x, std::uint32_t y, std::uint32_t z) {
  std::uint32_t a = x * 1664525u + 1013904223u;
  std::uint32_t b = y * 1664525u + 1013904223u;
  std::uint32_t c = z * 1664525u + 1013904223u;
  a = a + b * c;
  b = b + c * a;
  c = c + a * b;
  a = a ^ (a >> 16);
  b = b ^ (b >> 16);
  c = c ^ (c >> 16);
  // f32(u32) rounds to nearest even, then an exact scale by 2^-32, as in WGSL.
  return float(a + b + c) * 2.3283064365386963e-10f;
}

// Dropout decision for attention weight (b*H + h, row i, key j); all arithmetic wraps in u32.
FLASHTQ_HD bool dropout_keep(float p, std::uint32_t seed, std::uint32_t bh, std::uint32_t i, std::uint32_t j) {
  return p <= 0.0f || hash3(bh, i, j + seed) >= p;
}

}  // namespace flashtq::core

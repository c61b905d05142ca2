// The documented sign generator: (seed, layer) -> s_polar, s_jl in {+1, -1}^256.
//
// For stream `which` (0 = polar, 1 = jl) the state starts at
//   seed XOR (0x9E3779B97F4A7C15 * (2 * layer + which + 1))
// and four splitmix64 outputs give 256 bits; coordinate d takes bit (d % 64) of output d / 64, and a
// set bit means -1. A head_dim D uses the first D signs, so every D of one seed shares a prefix.
#pragma once

#include <array>
#include <cstdint>

namespace flashtq::core {

inline std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// 256 sign bits as eight u32 words (bit d % 32 of word d / 32; set = -1).
inline std::array<std::uint32_t, 8> sign_bits(std::uint64_t seed, std::int64_t layer, int which) {
  std::uint64_t state = seed ^ (0x9E3779B97F4A7C15ull * (2ull * std::uint64_t(layer) + std::uint64_t(which) + 1ull));
  std::array<std::uint32_t, 8> bits{};
  for (int w = 0; w < 4; ++w) {
    const std::uint64_t z = splitmix64(state);
    bits[2 * w] = std::uint32_t(z);
    bits[2 * w + 1] = std::uint32_t(z >> 32);
  }
  return bits;
}

inline double sign_of(const std::array<std::uint32_t, 8>& bits, std::int64_t d) {
  return ((bits[d / 32] >> (d % 32)) & 1u) ? -1.0 : 1.0;
}

}  // namespace flashtq::core

// f16 and bf16 <-> f32 conversion, round to nearest even, as WGSL pack2x16float and CUDA's
// __float2half_rn / __float2bfloat16_rn. Plain bit manipulation so every backend agrees.
#pragma once

#include <bit>
#include <cstdint>

namespace flashtq::core {

inline std::uint16_t f32_to_f16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t abs = x & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {  // inf or NaN (NaN keeps a quiet payload bit)
    return std::uint16_t(sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477FF000u) return std::uint16_t(sign | 0x7C00u);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {                              // below the smallest normal f16 (2^-14): subnormal or zero
    if (abs < 0x33000000u) return std::uint16_t(sign);  // < 2^-25 rounds to zero
    const std::uint32_t exp = abs >> 23;
    const std::uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
    const std::uint32_t shift = 126u - exp;  // 14..24 bits to drop, keeping 10
    const std::uint32_t kept = mant >> shift;
    const std::uint32_t rest = mant & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    const std::uint32_t rounded = kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
    return std::uint16_t(sign | rounded);
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits.
  const std::uint32_t rebased = abs - 0x38000000u;
  const std::uint32_t rest = rebased & 0x1FFFu;
  std::uint32_t h = rebased >> 13;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry may reach inf: correct
  return std::uint16_t(sign | h);
}

inline float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  std::uint32_t mant = h & 0x3FFu;
  if (exp == 0x1Fu) return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return std::bit_cast<float>(sign);
    // Subnormal: value = mant * 2^-24, exact in f32.
    const float v = float(mant) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline std::uint16_t f32_to_bf16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return std::uint16_t((x >> 16) | 0x40u);  // quiet NaN
  const std::uint32_t rounding = 0x7FFFu + ((x >> 16) & 1u);
  return std::uint16_t((x + rounding) >> 16);
}

inline float bf16_to_f32(std::uint16_t b) { return std::bit_cast<float>(std::uint32_t(b) << 16); }

}  // namespace flashtq::core

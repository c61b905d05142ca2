// Bit-stream access to the packed codes of one slot: `bits` per coordinate, LSB first, a code may
// straddle two words (3 bits). For 2 bits this is the seed's 16-codes-per-word layout.
#pragma once

#include <cstdint>

#include "core/hd.hpp"

namespace flashtq::core {

// The `bits` bits from bit `pos` of the stream.
FLASHTQ_HD std::uint32_t get_bits(const std::uint32_t* words, std::int64_t pos, int bits) {
  const std::int64_t w = pos / 32;
  const int shift = int(pos % 32);
  const std::uint32_t mask = (1u << bits) - 1u;
  std::uint32_t v = words[w] >> shift;
  if (shift + bits > 32) v |= words[w + 1] << (32 - shift);
  return v & mask;
}

FLASHTQ_HD std::uint32_t get_code(const std::uint32_t* words, std::int64_t d, int bits) {
  return get_bits(words, d * bits, bits);
}

// ORs `bits` bits of code at bit `pos` of zero-initialised words.
FLASHTQ_HD void put_bits(std::uint32_t* words, std::int64_t pos, int bits, std::uint32_t code) {
  const std::int64_t w = pos / 32;
  const int shift = int(pos % 32);
  words[w] |= code << shift;
  if (shift + bits > 32) words[w + 1] |= code >> (32 - shift);
}

FLASHTQ_HD void put_code(std::uint32_t* words, std::int64_t d, int bits, std::uint32_t code) {
  put_bits(words, d * bits, bits, code);
}

// The f16 bits a block mean stores (docs/turboquant_layout.md): a zero of either sign is +0.
FLASHTQ_HD std::uint32_t block_mean_half(std::uint32_t f16) { return (f16 & 0x7FFFu) == 0 ? 0u : f16; }

}  // namespace flashtq::core

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of cache files: a running value
// over any number of pieces, crc32c(crc32c(0, a), b) == crc32c(0, a + b).
#pragma once

#include <cstddef>
#include <cstdint>

namespace flashtq::core {

std::uint32_t crc32c(std::uint32_t crc, const void* data, std::size_t bytes);

}  // namespace flashtq::core

// Rows the cpu backend's f32 tiles cannot finish, recomputed in double with the oracle's row
// arithmetic (core/dense_row.hpp) straight from the caller's views: a score past f32's range, or a
// NaN or infinity in a key that the row does not see (the tiles' products multiply it by a zero
// weight). Rare and slow; the tiles stay as they are for every other row.
#pragma once

#include <cstdint>

#include "flashtq/problem.hpp"

namespace flashtq::cpu {

// Output row (b, i, h) and its lse.
void dense_row_in_double(const ForwardCall& c, std::int64_t b, std::int64_t h, std::int64_t i);

// dq row (b, i, h) of the backward.
void dq_row_in_double(const BackwardCall& c, std::int64_t b, std::int64_t h, std::int64_t i);

// dk and dv rows (b, j, hk) of the backward.
void dkv_row_in_double(const BackwardCall& c, std::int64_t b, std::int64_t hk, std::int64_t j);

}  // namespace flashtq::cpu

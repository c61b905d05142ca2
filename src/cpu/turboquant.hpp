// The cpu backend's TurboQuant operations (validated calls, host memory).
#pragma once

#include "flashtq/problem.hpp"

namespace flashtq::cpu {

void tq_encode(const TqEncodeCall& call, int threads);
void tq_rotate(const TqRotateCall& call, int threads);
// Returns the kernel that served it: "tq_attend_simd", or "tq_attend_rows" (the oracle's per-row code,
// where the SIMD target has no 128-bit vectors).
const char* tq_attend(const TqAttendCall& call, int threads);
// The SIMD path, every layout; false (nothing done) where the SIMD target cannot run it.
bool tq_attend_simd(const TqAttendCall& call, int threads);

}  // namespace flashtq::cpu

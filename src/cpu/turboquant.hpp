// The cpu backend's TurboQuant operations (validated calls, host memory).
#pragma once

#include "flashtq/problem.hpp"

namespace flashtq::cpu {

void tq_encode(const TqEncodeCall& call, int threads);
void tq_rotate(const TqRotateCall& call, int threads);
void tq_attend(const TqAttendCall& call, int threads);
// The SIMD path for 2-bit codebooks; false (nothing done) when it does not apply.
bool tq_attend_simd(const TqAttendCall& call, int threads);

}  // namespace flashtq::cpu

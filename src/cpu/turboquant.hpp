// The cpu backend's TurboQuant operations (validated calls, host memory).
#pragma once

#include "flashtq/turboquant.hpp"

namespace flashtq::cpu {

void tq_encode(const TqEncodeArgs& call, bool keys, int threads);
void tq_rotate(const TqRotateArgs& call, int threads);
void tq_attend(const TqAttendArgs& call, int threads);
// The SIMD path for 2-bit codebooks; false (nothing done) when it does not apply.
bool tq_attend_simd(const TqAttendArgs& call, int threads);

}  // namespace flashtq::cpu

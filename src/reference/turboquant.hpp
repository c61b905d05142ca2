// The oracle for TurboQuant: encode, query rotation and attention over the packed words, in double
// with the exact Lloyd–Max codebooks (the per-row arithmetic is core/tq_rows.hpp). Host memory;
// validated calls.
#pragma once

#include "flashtq/problem.hpp"

namespace flashtq::reference {

void tq_encode(const TqEncodeCall& call);
void tq_rotate_queries(const TqRotateCall& call);
void tq_attend(const TqAttendCall& call);

}  // namespace flashtq::reference

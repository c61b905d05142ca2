// The cpu backend's dense attention (validated calls, host memory).
#pragma once

#include "flashtq/problem.hpp"

namespace flashtq::cpu {

void dense_forward(const ForwardCall& call, int threads);
void dense_backward(const BackwardCall& call, int threads);

}  // namespace flashtq::cpu

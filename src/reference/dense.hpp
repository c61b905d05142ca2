// The oracle for dense attention: plain loops in double over contiguous [B, S, H, D] arrays.
// The public reference backend gathers views into these arrays; tests call them directly.
#pragma once

#include "flashtq/problem.hpp"

namespace flashtq::reference {

// out [B, Sq, H, D]; lse [B, H, Sq] (may be null).
void dense_forward(const DenseProblem& p, const double* q, const double* k, const double* v, double* out, double* lse);

// Gradients of sum(out * dout); out and lse are the forward's. dsinks [H] (may be null) gets the sinks'
// gradient when p.sinks is given (0 without).
void dense_backward(const DenseProblem& p, const double* q, const double* k, const double* v, const double* out,
                    const double* dout, const double* lse, double* dq, double* dk, double* dv,
                    double* dsinks = nullptr);

}  // namespace flashtq::reference

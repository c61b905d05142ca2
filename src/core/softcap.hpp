// docs/spec.md §1.8's softcap, for the host oracle (core/dense_row.hpp, core/tq_rows.cpp), the CUDA repair
// (cuda/dense_repair.cuh) and the CUDA kernels' f32 scores alike: the scaled product x = scale * <q, k> after a
// cap c > 0 (c tanh(x / c); 0 = none), and the cap's derivative there.
#pragma once

#include <cmath>

#include "core/hd.hpp"
#include "flashtq/problem.hpp"

namespace flashtq::core {

FLASHTQ_HD float softcap_tanh(float x) { return tanhf(x); }  // not an approximation: f32 problems keep 1e-5
FLASHTQ_HD double softcap_tanh(double x) { return ::tanh(x); }

// A capped score and the cap's slope 1 - tanh^2 there (1 without a cap), in the caller's precision: the slope
// is what dS carries back to <q, k>.
template <typename Real>
struct CappedScore {
  Real s, slope;
};
template <typename Real>
FLASHTQ_HD CappedScore<Real> capped_with_slope(float softcap, Real x) {
  if (!(softcap > 0.0f)) return {x, Real(1)};
  const Real t = softcap_tanh(x / Real(softcap));
  return {Real(softcap) * t, Real(1) - t * t};
}

FLASHTQ_HD double softcapped(float softcap, double x) { return capped_with_slope(softcap, x).s; }
FLASHTQ_HD double softcapped(const DenseProblem& p, double x) { return softcapped(p.softcap, x); }
FLASHTQ_HD double softcap_slope(const DenseProblem& p, double x) { return capped_with_slope(p.softcap, x).slope; }

}  // namespace flashtq::core

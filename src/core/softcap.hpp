// docs/spec.md §1.8's softcap in double, for the host oracle (core/dense_row.hpp, core/tq_rows.cpp) and the
// CUDA repair (cuda/dense_repair.cuh) alike: the scaled product x = scale * <q, k> after a cap c > 0
// (c tanh(x / c); 0 = none), and the cap's derivative there.
#pragma once

#include <cmath>

#include "core/hd.hpp"
#include "flashtq/problem.hpp"

namespace flashtq::core {

FLASHTQ_HD double softcapped(float softcap, double x) {
  return softcap > 0.0f ? double(softcap) * ::tanh(x / double(softcap)) : x;
}
FLASHTQ_HD double softcapped(const DenseProblem& p, double x) { return softcapped(p.softcap, x); }
FLASHTQ_HD double softcap_slope(const DenseProblem& p, double x) {
  if (!(p.softcap > 0.0f)) return 1.0;
  const double t = ::tanh(x / double(p.softcap));
  return 1.0 - t * t;
}

}  // namespace flashtq::core

// Measurements of TurboQuant's quality on random data, shared by `flashtq eval` and the tests.
#pragma once

#include <cstdint>
#include <random>

namespace flashtq::reference {

// Mean squared error ||x - dequant(quant(x))||^2 over `trials` random unit vectors in R^D.
double measure_mse(std::int64_t head_dim, int bits, int trials, std::mt19937_64& rng);

struct EstimatorStats {
  double slope = 0;    // least-squares slope of the estimate on the true <q, k>
  double dprod_d = 0;  // E[(estimate - truth)^2] * D, per unit key and unit query
};

// The key inner-product estimator (b_mse bits + the QJL bit) over `pairs` random unit keys and
// unit queries correlated with them, so the true products span [-1, 1].
EstimatorStats measure_key_estimator(std::int64_t head_dim, int b_mse, std::int64_t pairs, std::mt19937_64& rng);

}  // namespace flashtq::reference

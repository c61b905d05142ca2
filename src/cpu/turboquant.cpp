// TurboQuant on the CPU: encode and rotation run the oracle's per-row code (core/tq_rows.hpp: double
// precision, so the packed words match it exactly) in parallel; attention takes the SIMD path
// (tq_attend_simd.cpp), and the per-(row, head) code only where the SIMD target cannot run it.
#include <omp.h>

#include <algorithm>

#include "core/tq_rows.hpp"
#include "cpu/turboquant.hpp"

namespace flashtq::cpu {

void tq_encode(const TqEncodeCall& c, int threads) {
  if (core::tq_encode_uses_block_means(c)) {  // a head's timesteps depend on each other (their block's mean)
    const std::int64_t heads = c.layout().n_kv_heads;
#pragma omp parallel for schedule(dynamic) num_threads(threads)
    for (std::int64_t h = 0; h < heads; ++h) core::tq_encode_head_with_means(c, h);
    return;
  }
  const std::int64_t T = c.tokens(), chunk = 16;
#pragma omp parallel for schedule(dynamic) num_threads(threads)
  for (std::int64_t t0 = 0; t0 < T; t0 += chunk) core::tq_encode_rows(c, t0, std::min(T, t0 + chunk));
}

void tq_rotate(const TqRotateCall& c, int threads) {
  const std::int64_t rows = c.rows();
#pragma omp parallel for schedule(dynamic) num_threads(threads)
  for (std::int64_t row = 0; row < rows; ++row) core::tq_rotate_rows(c, row, row + 1);
}

const char* tq_attend(const TqAttendCall& c, int threads) {
  if (tq_attend_simd(c, threads)) return "tq_attend_simd";
  const std::int64_t units = c.rows() * c.n_heads;
#pragma omp parallel for schedule(dynamic) num_threads(threads)
  for (std::int64_t u = 0; u < units; ++u) core::tq_attend_row_head(c, u / c.n_heads, u % c.n_heads);
  return "tq_attend_rows";
}

}  // namespace flashtq::cpu

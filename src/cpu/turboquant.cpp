// TurboQuant on the CPU: encode and rotation run the oracle's per-row code (double precision, so the
// packed words match it exactly) in parallel; attention takes the SIMD path for 2-bit codebooks and
// the oracle's per-(row, head) code otherwise.
#include <omp.h>

#include <algorithm>

#include "cpu/turboquant.hpp"
#include "reference/turboquant.hpp"

namespace flashtq::cpu {

void tq_encode(const TqEncodeArgs& a, bool keys, int threads) {
  const std::int64_t T = a.x.shape[1], chunk = 16;
  const std::int64_t esize = std::int64_t(dtype_size(a.x.dtype));
#pragma omp parallel for schedule(dynamic) num_threads(threads)
  for (std::int64_t t0 = 0; t0 < T; t0 += chunk) {
    TqEncodeArgs part = a;  // timesteps [t0, t0 + chunk) of the rows
    part.x.data = static_cast<char*>(a.x.data) + t0 * a.x.strides[1] * esize;
    part.x.shape[1] = std::min(chunk, T - t0);
    part.start_pos = a.start_pos + t0;
    if (keys) {
      reference::tq_encode_keys(part);
    } else {
      reference::tq_encode_values(part);
    }
  }
}

void tq_rotate(const TqRotateArgs& a, int threads) {
  const std::int64_t rows = a.q.shape[0] * a.q.shape[1];
#pragma omp parallel for schedule(dynamic) num_threads(threads)
  for (std::int64_t row = 0; row < rows; ++row) reference::tq_rotate_rows(a, row, row + 1);
}

void tq_attend(const TqAttendArgs& a, int threads) {
  if (tq_attend_simd(a, threads)) return;
  const std::int64_t units = a.batch * a.n_queries * a.n_heads;
#pragma omp parallel for schedule(dynamic) num_threads(threads)
  for (std::int64_t u = 0; u < units; ++u) reference::tq_attend_row_head(a, u / a.n_heads, u % a.n_heads);
}

}  // namespace flashtq::cpu

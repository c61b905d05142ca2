// The oracle for TurboQuant: encode, query rotation and attention over the packed words, in double
// with the exact Lloyd–Max codebooks. Host memory; arguments already validated.
#pragma once

#include <vector>

#include "flashtq/turboquant.hpp"

namespace flashtq::reference {

void tq_encode_keys(const TqEncodeArgs& a);
void tq_encode_values(const TqEncodeArgs& a);
void tq_rotate_queries(const TqRotateArgs& a);
void tq_attend(const TqAttendArgs& a);

// One row's encoding as tq_encode_* computes it: its norm; the polar-rotated unit vector and its codes;
// for keys, the residual's norm and its QJL projection H diag(s_jl) e, whose signs are the bits.
// rotated and codes are empty for a zero vector, projected when the residual is zero.
struct EncodedRow {
  double norm = 0, gamma = 0;
  std::vector<double> rotated, projected;
  std::vector<int> codes;
};
EncodedRow encode_row(std::vector<double> x, const TqTables& tables, int bits, bool keys);

// Pieces of the above that other host backends run in parallel: scratch rows [first, end) of a
// rotation (row = b * n_queries + j), and one (row, head) of an attention.
void tq_rotate_rows(const TqRotateArgs& a, std::int64_t first, std::int64_t end);
void tq_attend_row_head(const TqAttendArgs& a, std::int64_t row, std::int64_t head);

// The estimate of <q, k_t> (no softmax scale) for one rotated query row against key slot `slot`:
// n_t * (sum_d q_rot[d] c[idx_d] + gamma_t * qjl_scale * (2 sum_{bit=1} q_jl[d] - q_jl_sum)).
double tq_key_dot(const TqLayout& layout, const float* q_rot, const float* q_jl, double q_jl_sum,
                  const std::uint32_t* k_cache, std::int64_t slot, double qjl_scale);

}  // namespace flashtq::reference

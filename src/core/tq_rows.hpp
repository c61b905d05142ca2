// TurboQuant's scalar per-row code in double with the exact codebooks: the oracle's arithmetic,
// which the cpu backend also runs (in parallel, so its packed words match the oracle's exactly).
// Validated calls, host memory.
#pragma once

#include <cstdint>
#include <vector>

#include "flashtq/problem.hpp"

namespace flashtq::core {

// A row shorter than this is a zero vector: every word of its slot is 0.
inline constexpr double kZeroNorm = 1e-12;

// One row's encoding: its norm; the polar-rotated unit vector and its codes; for keys, the
// residual's norm and its QJL projection H diag(s_jl) e, whose signs are the bits. rotated and codes
// are empty for a zero vector, projected when the residual is zero.
struct EncodedRow {
  double norm = 0, gamma = 0;
  double stored_norm = 0;  // what the norm word holds: norm, or norm / |c[idx]| with norm correction
  std::vector<double> rotated, projected;
  std::vector<int> codes;
  // Keys with outlier channels: codes and rotated are in permuted coordinates (norm * rotated is the
  // exact row), part_norms what each part's norm half holds, and stored_norm the largest of them.
  std::vector<double> part_norms;
};
// order: a key's channel order (key_channel_order), needed for keys with outlier channels only.
EncodedRow encode_row(std::vector<double> x, const TqTables& tables, bool keys, const std::int32_t* order = nullptr);

// Encodes the call's timesteps [first, end) (indices into its x rows).
void tq_encode_rows(const TqEncodeCall& call, std::int64_t first, std::int64_t end);
// Block means on the call's side (layout.key_block or value_block): the call's timesteps are not coded as
// they come; tq_encode_head_with_means(call, h) does kv head h's whole call instead of tq_encode_rows.
bool tq_encode_uses_block_means(const TqEncodeCall& call);
// Writes the new rows' exact copies and codes the timesteps that leave the recent window, each minus its
// block's mean (written with the block's first timestep), from the exact rows: timesteps before
// call.start_pos come from the cache, so calls must be contiguous appends.
void tq_encode_head_with_means(const TqEncodeCall& call, std::int64_t kv_head);
// Rotates scratch rows [first, end) (row = b * n_queries + j).
void tq_rotate_rows(const TqRotateCall& call, std::int64_t first, std::int64_t end);
// One (scratch row, query head) of an attention.
void tq_attend_row_head(const TqAttendCall& call, std::int64_t row, std::int64_t head);

// Element d of an exact row (bf16 pairs, element 2i in the low half of word i).
double exact_element(const std::uint32_t* row_words, std::int64_t d);

// The estimate of <q, k_t> (no softmax scale) for one rotated query row against key slot `slot`:
// n_t * (sum_d q_rot[d] c[idx_d] + gamma_t * qjl_scale * (2 sum_{bit=1} q_jl[d] - q_jl_sum)).
double tq_key_dot(const TqTables& tables, const float* q_rot, const float* q_jl, double q_jl_sum,
                  const std::uint32_t* k_cache, std::int64_t slot, double qjl_scale);

}  // namespace flashtq::core

// The one validator (SPEC §4): every public entry point passes through here before any work.
#pragma once

#include <algorithm>

#include "flashtq/attention.hpp"
#include "flashtq/backend.hpp"
#include "flashtq/problem.hpp"
#include "flashtq/turboquant.hpp"

namespace flashtq::core {

ForwardCall validate_forward(const Backend& backend, const ForwardArgs& args,
                             const AttentionParams& params);
BackwardCall validate_backward(const Backend& backend, const BackwardArgs& args,
                               const AttentionParams& params);

void validate_tq_layout(const TqLayout& layout);
TqEncodeArgs validate_tq_encode(const Backend& backend, const TqEncodeArgs& args);
TqRotateArgs validate_tq_rotate(const Backend& backend, const TqRotateArgs& args);
TqAttendArgs validate_tq_attend(const Backend& backend, const TqAttendArgs& args, bool check_workspace = true);

// The most timesteps any query row of a validated attention call sees (the kernels' split count
// depends on it): max_seq with per-sequence start positions, else the last row's causal limit.
inline std::int64_t tq_longest_row(const TqAttendArgs& validated) {
  const TqAttendArgs& c = validated;
  return c.start_positions ? *c.max_seq : std::min(c.start_pos + c.n_queries, *c.max_seq);
}

}  // namespace flashtq::core

// Ragged batches (docs/spec.md §1.6). Host backends: the batch is checked whole, then run as one call per
// sequence (B = 1, its dropout decisions those of its batch index), with lse gathered to and from the [H, Tq]
// layout and the sinks' gradient summed over the sequences. Device backends: every sequence is validated as its
// own call, then the batch runs as one (DenseProblem::packed, the offsets in RaggedTable). Nothing is written
// until every sequence's call has been validated.
#pragma once

#include "flashtq/attention.hpp"
#include "flashtq/backend.hpp"

namespace flashtq::core {

void varlen_forward(Backend& backend, const ForwardArgs& args, const AttentionParams& params);
// The one call a device backend gets for a ragged batch (validated, not run): what its workspace is sized for.
ForwardCall validate_packed_forward(const Backend& backend, const ForwardArgs& args, const AttentionParams& params);
// The ragged backward's one call for a device backend (the workspace query's).
BackwardCall validate_packed_backward(const Backend& backend, const BackwardArgs& args, const AttentionParams& params);
void varlen_backward(Backend& backend, const BackwardArgs& args, const AttentionParams& params);

}  // namespace flashtq::core

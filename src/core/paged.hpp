// Paged keys and values (docs/spec.md §1.7) on host backends: the table and lengths are checked whole, each
// sequence's keys and values gathered from its pages into one contiguous block, and the batch run as one call
// per sequence (its dropout decisions those of its batch index). Nothing is written before every sequence's
// call has been validated; an append writes nothing before every row's page is known to exist.
#pragma once

#include "flashtq/attention.hpp"
#include "flashtq/backend.hpp"

namespace flashtq::core {

void paged_forward(Backend& backend, const ForwardArgs& args, const AttentionParams& params);
// The one call a device backend gets for a paged forward whose table lives in its memory (docs/spec.md §1.7).
ForwardCall validate_on_device(const Backend& backend, const ForwardArgs& args, const AttentionParams& params);
void paged_append(Backend& backend, const PagedAppendArgs& args);

}  // namespace flashtq::core

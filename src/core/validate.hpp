// The one validator (docs/spec.md §4): every public entry point passes through here before any work.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>

#include "flashtq/attention.hpp"
#include "flashtq/backend.hpp"
#include "flashtq/problem.hpp"
#include "flashtq/turboquant.hpp"

namespace flashtq::core {

// The only maker of Validated stamps (see flashtq/problem.hpp).
struct Validator {
  static Validated stamp() { return Validated{}; }
};

// A pointer that must not be null and must be aligned; one view in the backend's memory whose extent fits in
// 64 bits (the checks every call's tensors pass).
void check_pointer(const std::string& name, const void* ptr, std::size_t alignment);
void check_view(const std::string& name, const TensorView& view, const Backend& backend);

ForwardCall validate_forward(const Backend& backend, const ForwardArgs& args, const AttentionParams& params);
BackwardCall validate_backward(const Backend& backend, const BackwardArgs& args, const AttentionParams& params);

void validate_tq_layout(const TqLayout& layout);
// A pool's table (TqPageTable) for `batch` sequences: its pointers, max_pages, and where the backend reads
// it on the host, every sequence's exact set. Returns the timesteps a sequence can hold (tq_reach). A
// contiguous layout takes no table.
std::int64_t check_tq_page_table(const Backend& backend, const TqLayout& layout, const TqPageTable& table,
                                 std::int64_t batch);
// Where the backend reads tables on the host: the pages of sequence b's timesteps [0, end) exist.
void check_tq_pages_read(const Backend& backend, const TqLayout& layout, const TqPageTable& table, std::int64_t b,
                         std::int64_t end);
// `view` names args.x in errors (TqKvCache calls it "k" or "v"). Every row's norm is checked last: on
// the host for host memory, else by backend.tq_unstorable_row (on the device: a synchronisation).
TqEncodeCall validate_tq_encode(const Backend& backend, const TqEncodeArgs& args, bool keys, const char* view = "x");
// The two halves of validate_tq_encode: every check of the arguments and views, which reads no element,
// then the norm rule, which reads every row. A call with two views (TqKvCache's k and v) checks both
// views before either's rows, so that a call refused for a view never reads the other's memory.
TqEncodeCall validate_tq_encode_views(const Backend& backend, const TqEncodeArgs& args, bool keys, const char* view);
void check_tq_rows_storable(const Backend& backend, const TqEncodeCall& call, const char* view);
TqRotateCall validate_tq_rotate(const Backend& backend, const TqRotateArgs& args);
// TqKvCache::calibrate: a layout with outlier channels, keys [1, T, n_kv_heads, head_dim] in the backend's memory.
void validate_tq_calibration(const Backend& backend, const TqLayout& layout, const TensorView& keys);
// check_workspace = false when the call is resolved only to ask for its workspace size.
TqAttendCall validate_tq_attend(const Backend& backend, const TqAttendArgs& args, bool check_workspace = true);

}  // namespace flashtq::core

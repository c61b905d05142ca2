// Public entry points: validate once, then hand the resolved call to the backend. Each is a function-try-block
// whose handler lets nothing but a flashtq::Error out (core/entry_guard.hpp).
#include "core/entry_guard.hpp"
#include "core/paged.hpp"
#include "core/validate.hpp"
#include "core/varlen.hpp"
#include "flashtq/attention.hpp"
#include "flashtq/error.hpp"
#include "flashtq/backend.hpp"
#include "flashtq/turboquant.hpp"

namespace flashtq {
namespace {

void refuse_paged_backward(const AttentionParams& params) {
  if (params.paged) throw Error("paged", "the backward takes contiguous keys and values (docs/spec.md §1.7)");
}

}  // namespace

void attention_forward(Backend& backend, const ForwardArgs& args, const AttentionParams& params) try {
  if (params.paged) return core::paged_forward(backend, args, params);
  if (params.varlen) return core::varlen_forward(backend, args, params);
  backend.forward(core::validate_forward(backend, args, params));
} catch (...) {
  core::rethrow_as_error("backend");
}

std::size_t attention_forward_workspace_bytes(Backend& backend, const ForwardArgs& args,
                                              const AttentionParams& params) try {
  // Ragged batches and host paging run as one call per sequence on host backends, which need none.
  ForwardArgs without = args;
  without.workspace = nullptr;
  if (backend.memory() != Memory::host) {
    if (params.paged) return backend.forward_workspace(core::validate_on_device(backend, without, params));
    if (params.varlen) return backend.forward_workspace(core::validate_packed_forward(backend, without, params));
  }
  if (params.paged || params.varlen) return 0;
  return backend.forward_workspace(core::validate_forward(backend, without, params));
} catch (...) {
  core::rethrow_as_error("backend");
}

void attention_backward(Backend& backend, const BackwardArgs& args, const AttentionParams& params) try {
  refuse_paged_backward(params);
  if (params.varlen) return core::varlen_backward(backend, args, params);
  backend.backward(core::validate_backward(backend, args, params));
} catch (...) {
  core::rethrow_as_error("backend");
}

std::size_t attention_backward_workspace_bytes(Backend& backend, const BackwardArgs& args,
                                               const AttentionParams& params) try {
  BackwardArgs without = args;
  without.workspace = nullptr;
  without.workspace_bytes = 0;
  refuse_paged_backward(params);
  // A ragged batch runs as one call per sequence on host backends, which need none.
  if (params.varlen) {
    if (backend.memory() == Memory::host) return 0;
    return backend.backward_workspace(core::validate_packed_backward(backend, without, params));
  }
  return backend.backward_workspace(core::validate_backward(backend, without, params));
} catch (...) {
  core::rethrow_as_error("backend");
}

void paged_kv_append(Backend& backend, const PagedAppendArgs& args) try {
  core::paged_append(backend, args);
} catch (...) {
  core::rethrow_as_error("backend");
}

void tq_encode_keys(Backend& backend, const TqEncodeArgs& args) try {
  backend.tq_encode(core::validate_tq_encode(backend, args, /*keys=*/true));
} catch (...) {
  core::rethrow_as_error("backend");
}

void tq_encode_values(Backend& backend, const TqEncodeArgs& args) try {
  backend.tq_encode(core::validate_tq_encode(backend, args, /*keys=*/false));
} catch (...) {
  core::rethrow_as_error("backend");
}

void tq_rotate_queries(Backend& backend, const TqRotateArgs& args) try {
  backend.tq_rotate_queries(core::validate_tq_rotate(backend, args));
} catch (...) {
  core::rethrow_as_error("backend");
}

void tq_attend(Backend& backend, const TqAttendArgs& args) try {
  backend.tq_attend(core::validate_tq_attend(backend, args));
} catch (...) {
  core::rethrow_as_error("backend");
}

std::size_t tq_attend_workspace_bytes(Backend& backend, const TqAttendArgs& args) try {
  TqAttendArgs probe = args;
  probe.workspace = nullptr;
  probe.workspace_bytes = 0;
  return backend.tq_attend_workspace(core::validate_tq_attend(backend, probe, /*check_workspace=*/false));
} catch (...) {
  core::rethrow_as_error("backend");
}

}  // namespace flashtq

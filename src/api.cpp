// Public entry points: validate once, then hand the resolved call to the backend; nothing but a
// flashtq::Error leaves them (core/entry_guard.hpp).
#include "core/entry_guard.hpp"
#include "core/validate.hpp"
#include "flashtq/attention.hpp"
#include "flashtq/backend.hpp"
#include "flashtq/turboquant.hpp"

namespace flashtq {

void attention_forward(Backend& backend, const ForwardArgs& args, const AttentionParams& params) {
  core::guarded("backend", [&] { backend.forward(core::validate_forward(backend, args, params)); });
}

void attention_backward(Backend& backend, const BackwardArgs& args, const AttentionParams& params) {
  core::guarded("backend", [&] { backend.backward(core::validate_backward(backend, args, params)); });
}

void tq_encode_keys(Backend& backend, const TqEncodeArgs& args) {
  core::guarded("backend", [&] { backend.tq_encode(core::validate_tq_encode(backend, args, /*keys=*/true)); });
}

void tq_encode_values(Backend& backend, const TqEncodeArgs& args) {
  core::guarded("backend", [&] { backend.tq_encode(core::validate_tq_encode(backend, args, /*keys=*/false)); });
}

void tq_rotate_queries(Backend& backend, const TqRotateArgs& args) {
  core::guarded("backend", [&] { backend.tq_rotate_queries(core::validate_tq_rotate(backend, args)); });
}

void tq_attend(Backend& backend, const TqAttendArgs& args) {
  core::guarded("backend", [&] { backend.tq_attend(core::validate_tq_attend(backend, args)); });
}

std::size_t tq_attend_workspace_bytes(Backend& backend, const TqAttendArgs& args) {
  return core::guarded("backend", [&] {
    TqAttendArgs probe = args;
    probe.workspace = nullptr;
    probe.workspace_bytes = 0;
    return backend.tq_attend_workspace(core::validate_tq_attend(backend, probe, /*check_workspace=*/false));
  });
}

}  // namespace flashtq

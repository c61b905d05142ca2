// A ragged batch on cuda (docs/spec.md §1.6): one launch of the kernel kernel_choice picks for each sequence, its
// views the sequence's rows and keys of the packed tensors, its lse rows at the sequence's place in [H, Tq]
// (DenseProblem::lse_rows), its dropout decisions those of its batch index (batch0), its mask at its offset. The
// offsets are host memory, checked whole by core, so the launches need no synchronisation. Sequences without keys or
// rows get their zeros (and a row's sink or -inf lse) from launch_zero_rows and the warp-per-row forward.

#include <algorithm>
#include <functional>

#include "core/sequence_rows.hpp"
#include "cuda/kernels.hpp"

namespace flashtq::cuda {
namespace {

struct Sequence {
  std::int64_t q0, n_q, k0, n_k;
};

Sequence sequence(const RaggedTable& t, std::int64_t b) {
  return {t.cu_seqlens_q[b], t.cu_seqlens_q[b + 1] - t.cu_seqlens_q[b], t.cu_seqlens_k[b],
          t.cu_seqlens_k[b + 1] - t.cu_seqlens_k[b]};
}

// Sequence b of a ragged call as a call of its own (ForwardCall or BackwardCall): a batch of one, its rows and keys
// views into the packed tensors, its lse at its first row.
template <typename Call>
Call sequence_call(const Call& c, std::int64_t b, const Sequence& s) {
  const RaggedTable& t = c.ragged;
  Call one = c;
  DenseProblem& p = one.p;
  p.packed = false;
  p.varlen = true;
  p.B = 1;
  p.Sq = s.n_q;
  p.Sk = s.n_k;
  p.batch0 = b;
  p.causal_offset = t.offset_from_end ? s.n_k - s.n_q : c.p.causal_offset;
  if (p.mask != nullptr && t.mask_offsets != nullptr) p.mask += t.mask_offsets[b];
  p.lse_rows = t.total_q;
  one.q = core::rows_of(c.q, s.q0, s.n_q);
  one.out = core::rows_of(c.out, s.q0, s.n_q);
  one.k = core::rows_of(c.k, s.k0, s.n_k);
  one.v = core::rows_of(c.v, s.k0, s.n_k);
  one.lse = c.lse != nullptr ? c.lse + s.q0 : nullptr;
  return one;
}

}  // namespace

void ragged_forward(const ForwardCall& c, const std::function<void(const ForwardCall&)>& run) {
  for (std::int64_t b = 0; b < c.p.B; ++b) {
    const Sequence s = sequence(c.ragged, b);
    if (s.n_q == 0) continue;
    // The call's workspace serves each sequence in turn (they run in stream order): a decode-shaped sequence
    // splits its keys across the GPU as far as it holds.
    ForwardCall one = sequence_call(c, b, s);
    // No keys: out = 0 and lse = the sink or -inf, which the warp-per-row kernel writes for a key range that is empty.
    if (s.n_k == 0) {
      launch_dense_forward(one, DenseForwardKernel::warp_per_row);
    } else {
      run(one);
    }
  }
}

namespace {

template <typename Call>
std::size_t largest_workspace(const Call& c, const std::function<std::size_t(const Call&)>& each) {
  std::size_t most = 0;
  for (std::int64_t b = 0; b < c.p.B; ++b) {
    const Sequence s = sequence(c.ragged, b);
    if (s.n_q > 0 && s.n_k > 0) most = std::max(most, each(sequence_call(c, b, s)));
  }
  return most;
}

}  // namespace

std::size_t ragged_forward_workspace(const ForwardCall& c, const std::function<std::size_t(const ForwardCall&)>& each) {
  return largest_workspace(c, each);
}

std::size_t ragged_backward_workspace(const BackwardCall& c,
                                      const std::function<std::size_t(const BackwardCall&)>& each) {
  return largest_workspace(c, each);
}

void ragged_backward(const BackwardCall& c, const std::function<void(const BackwardCall&)>& run) {
  void* stream = c.stream;
  if (c.dsinks != nullptr) {  // over every row at once: [1, Tq] rows and the [H, Tq] lse
    BackwardCall whole = c;
    whole.p.packed = false;
    whole.p.B = 1;
    whole.p.Sq = c.ragged.total_q;
    whole.p.Sk = c.ragged.total_k;
    launch_dense_sinks_grad(whole);
  }
  for (std::int64_t b = 0; b < c.p.B; ++b) {
    const Sequence s = sequence(c.ragged, b);
    BackwardCall one = sequence_call(c, b, s);
    one.dout = core::rows_of(c.dout, s.q0, s.n_q);
    one.dq = core::rows_of(c.dq, s.q0, s.n_q);
    one.dk = core::rows_of(c.dk, s.k0, s.n_k);
    one.dv = core::rows_of(c.dv, s.k0, s.n_k);
    one.dsinks = nullptr;
    if (s.n_q > 0 && s.n_k > 0) {
      run(one);
    } else {  // rows that see no key have dq = 0; keys that no row sees have dk = dv = 0
      launch_zero_rows(one.dq, stream);
      launch_zero_rows(one.dk, stream);
      launch_zero_rows(one.dv, stream);
    }
  }
}

}  // namespace flashtq::cuda

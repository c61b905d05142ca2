// Launchers of the CUDA kernels (one per operation; each dispatches on dtype and head_dim).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>

#include "cuda/kernel_choice.hpp"
#include "flashtq/problem.hpp"
#include "flashtq/turboquant.hpp"

namespace flashtq::cuda {

// Each dense launcher runs the kernel choose_dense_forward / choose_dense_backward gave
// (kernel_choice.hpp), whose conditions it takes as given.
void launch_dense_forward(const ForwardCall& call, DenseForwardKernel kernel);
void launch_dense_forward_mma(const ForwardCall& call);
// The decode kernel (dense_decode.cu) and the workspace its split plan uses (0 when it runs one split).
void launch_dense_decode(const ForwardCall& call);
std::size_t dense_decode_workspace(const ForwardCall& call);
void launch_dense_forward_wgmma(const ForwardCall& call);
// The f32 forward on TF32 tensor cores: one product per multiply with AttentionParams::allow_tf32,
// else three (error-compensated, f32 accuracy).
void launch_dense_forward_tf32(const ForwardCall& call);
void launch_dense_forward_ffma(const ForwardCall& call);
void launch_dense_backward(const BackwardCall& call, DenseBackwardKernel kernel);
void launch_dense_backward_wgmma(const BackwardCall& call);
// The workspace the wgmma backward keeps its rows' statistics in (without one it allocates them on the stream).
std::size_t dense_backward_wgmma_workspace(const BackwardCall& call);
// dsinks when the call asks for it (dense_sinks_grad.cu); launch_dense_backward runs it first.
void launch_dense_sinks_grad(const BackwardCall& call);

// Rows the kernels above could not finish in f32, recomputed in double (dense_repair.cu); launched
// after every forward and backward. The kernels say that there are some by raising the flag at
// unfinished_rows_flag() (UnfinishedRows::raised of the current device, unfinished_rows.cuh).
void repair_dense_forward(const ForwardCall& call);
void repair_dense_dq(const BackwardCall& call);
unsigned* unfinished_rows_flag();

// A ragged batch (p.packed) as one call per sequence (ragged.cpp): `run` launches the kernel of a sequence that has
// rows and keys; the rest are written here, and the sinks' gradient once over the whole batch.
void ragged_forward(const ForwardCall& call, const std::function<void(const ForwardCall&)>& run);
// The largest workspace `each` asks for any of the batch's sequences (one workspace serves them in turn).
std::size_t ragged_forward_workspace(const ForwardCall& call,
                                     const std::function<std::size_t(const ForwardCall&)>& each);
void ragged_backward(const BackwardCall& call, const std::function<void(const BackwardCall&)>& run);
std::size_t ragged_backward_workspace(const BackwardCall& call,
                                      const std::function<std::size_t(const BackwardCall&)>& each);
// Rows [0, n) of a [1, n, heads, D] view set to zero (zero_rows.cu), on the stream.
void launch_zero_rows(const TensorView& rows, void* stream);

// Rows appended into pages through a device table (paged_append.cu).
void launch_paged_append(const PagedAppendCall& call);

void launch_tq_encode(const TqEncodeCall& call);
// Keys with outlier channels (tq_outliers.cu): launch_tq_encode and launch_tq_rotate send them there.
void launch_tq_encode_parts(const TqEncodeCall& call);
// Block means on the call's side (tq_block_means.cu): launch_tq_encode sends them there.
void launch_tq_encode_with_means(const TqEncodeCall& call);
void launch_tq_rotate_parts(const TqRotateCall& call);
// The first row (t * n_kv_heads + h) of the call's x whose norm f16 cannot hold, rows of at most
// always_fits passing on their norm alone; waits for the call's stream (src/cuda/tq_norm_check.cu).
std::optional<std::int64_t> first_unstorable_tq_row(const TqEncodeCall& call, double always_fits);
void launch_tq_rotate(const TqRotateCall& call);
// tq_attend's workspace and launch for the kernel choose_tq_attend gave; the chunked-prefill path's own
// pieces (tq_prefill.cu), which these two send it to.
std::size_t tq_attend_workspace(const TqAttendCall& call, TqAttendKernel kernel);
void launch_tq_attend(const TqAttendCall& call, TqAttendKernel kernel);
std::size_t tq_prefill_workspace(const TqAttendCall& call);
void launch_tq_prefill(const TqAttendCall& call);

}  // namespace flashtq::cuda

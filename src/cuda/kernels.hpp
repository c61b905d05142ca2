// Launchers of the CUDA kernels (one per operation; each dispatches on dtype and head_dim).
#pragma once

#include <cstddef>

#include "flashtq/problem.hpp"
#include "flashtq/turboquant.hpp"

namespace flashtq::cuda {

void launch_dense_forward(const ForwardCall& call);
// The tensor-core forward (f16/bf16, head_dim 32..128, 16-byte aligned rows); false when it does not apply.
bool launch_dense_forward_mma(const ForwardCall& call);
// The Hopper forward (wgmma; f16/bf16, head_dim 64, 128 and 256, 16-byte aligned rows, sm_90 devices); false when it
// does not apply.
bool launch_dense_forward_wgmma(const ForwardCall& call);
// The f32 forward on TF32 tensor cores (head_dim 32..128, 16-byte aligned rows): one product per
// multiply with AttentionParams::allow_tf32, else three (error-compensated, f32 accuracy); false
// with pedantic_f32.
bool launch_dense_forward_tf32(const ForwardCall& call);
// The f32 forward in f32 FMAs, tiled (AttentionParams::pedantic_f32; head_dim 32..128, 16-byte aligned rows).
bool launch_dense_forward_ffma(const ForwardCall& call);
void launch_dense_backward(const BackwardCall& call);
// The Hopper backward (wgmma; f16/bf16, head_dim 64 and 128, 16-byte aligned rows, sm_90 devices); false when it does
// not apply.
bool launch_dense_backward_wgmma(const BackwardCall& call);

void launch_tq_encode(const TqEncodeCall& call);
void launch_tq_rotate(const TqRotateCall& call);
std::size_t tq_attend_workspace(const TqAttendCall& call);
void launch_tq_attend(const TqAttendCall& call);

}  // namespace flashtq::cuda

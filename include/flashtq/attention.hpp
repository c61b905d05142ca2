// Dense (exact) attention: forward with optional LSE, and backward. Semantics: docs/spec.md §1.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

#include "flashtq/tensor.hpp"

namespace flashtq {

class Backend;

// A ragged batch (docs/spec.md §1.6): q and out are [1, Tq, H, D] views and k, v [1, Tk, Hkv, D]; sequence b
// owns query rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 and keys cu_seqlens_k[b] .. cu_seqlens_k[b + 1] - 1,
// and every rule of §1 holds within it with local row and key indices. lse is [H, Tq].
struct Varlen {
  std::int64_t batch = 0;                      // B, the number of sequences
  const std::int32_t* cu_seqlens_q = nullptr;  // [B + 1]: 0, then non-decreasing, ending at Tq
  const std::int32_t* cu_seqlens_k = nullptr;  // [B + 1]: 0, then non-decreasing, ending at Tk
  // Hints, as FlashAttention takes them: the longest sequence's rows and keys (0 = not given); when
  // given, a longer sequence is an error.
  std::int64_t max_seqlen_q = 0, max_seqlen_k = 0;
  // With a mask: [B] element offsets of each sequence's mask element (local row 0, local key 0); null
  // means 0 for every sequence (one mask shared by all). The mask strides address local rows and keys.
  const std::int64_t* mask_offsets = nullptr;
};

// Paged keys and values (docs/spec.md §1.7): the forward's k and v are [num_pages, page_size, Hkv, D] views of the
// pages (page_size a power of two in [16, 256]); key j of sequence b is row j mod page_size of page
// page_table[b * max_pages + j / page_size]. The queries are [B, Sq, H, D] as in §1.
//
// The table and lengths live where the backend reads them (Backend::page_table_memory): host memory for reference,
// cpu and webgpu (checked before any work), the device's memory for cuda, with `tables` set to it (a serving
// engine's table, updated on the device and read by the kernel, so that a decode step can be captured in a CUDA
// graph). A device table is the caller's contract, not checked: the kernel
// clamps each length to [0, max_pages * page_size] and each page index to [0, num_pages), so a bad entry gives
// wrong numbers for its sequence but never reads (or, appending, writes) outside the pages. On cuda the paged forward
// runs the decode kernel: a few query rows per kv head (Sq x group within its columns), f16/bf16, head_dim 64/128/256,
// no mask or dropout, page rows on 16 bytes.
struct PagedKv {
  const std::int32_t* page_table = nullptr;  // [B, max_pages] int32
  std::int64_t max_pages = 0;
  const std::int32_t* seq_lens_k = nullptr;  // [B] int32: the keys of each sequence
  Memory tables = Memory::host;              // where page_table and seq_lens_k live
};

struct AttentionParams {
  // Softmax scale; empty means 1/sqrt(D).
  std::optional<float> scale;
  bool causal = false;
  // Absolute position of query row i is i + causal_offset. Empty means Sk - Sq: bottom-right
  // alignment, as FlashAttention >= 2.1 and decoding against a KV cache. Set 0 for top-left
  // alignment (PyTorch's is_causal). Applies to the window as well as to causal masking.
  std::optional<std::int64_t> causal_offset;
  // 0 = no window; otherwise key j is visible only when |p_i - j| < window.
  std::int64_t window = 0;
  // Optional additive f32 mask, element (b, h, i, j) at
  // b*mask_strides[0] + h*mask_strides[1] + i*mask_strides[2] + j*mask_strides[3];
  // a stride of 0 broadcasts. mask_elements is the allocation's size, checked against the strides.
  const float* mask = nullptr;
  std::array<std::int64_t, 4> mask_strides{};
  std::int64_t mask_elements = 0;
  // Dropout probability in [0, 1); decisions come from hash3 (bit-identical on every backend).
  float dropout_p = 0.0f;
  std::uint32_t seed = 0;
  // f32 inputs only: allow the forward's products on TF32 tensor cores (10-bit mantissas; docs/spec.md §3
  // bounds the error at 2e-3 instead of 1e-5). The cuda backend takes it; others stay exact.
  bool allow_tf32 = false;
  // f32 inputs only, without allow_tf32: the forward's products in f32 FMAs only (cuBLAS's
  // PEDANTIC_MATH). By default the cuda backend may run them as error-compensated TF32 (three
  // tensor-core products per multiply, f32 accuracy: docs/spec.md §3's 1e-5), as PyTorch's efficient attention
  // does; other backends always use f32 FMAs.
  bool pedantic_f32 = false;
  // Logit soft-capping (docs/spec.md §1.8, Gemma 2): with softcap > 0 the score is
  // softcap * tanh(scale * <q, k> / softcap), the mask added after; 0 = none.
  float softcap = 0.0f;
  // Attention sinks (docs/spec.md §1.9, gpt-oss): optional f32 [H] logits in the backend's memory, one
  // per query head, that join every row's softmax denominator and carry no value; -inf = no sink.
  const float* sinks = nullptr;
  // A ragged batch instead of the [B, S, H, D] one (docs/spec.md §1.6); its arrays in host memory. Every backend.
  std::optional<Varlen> varlen;
  // Keys and values in pages (docs/spec.md §1.7), forward only; every backend (cuda: decode shapes).
  std::optional<PagedKv> paged;
};

struct ForwardArgs {
  TensorView q;            // [B, Sq, H, D]
  TensorView k;            // [B, Sk, Hkv, D]
  TensorView v;            // [B, Sk, Hkv, D]
  TensorView out;          // [B, Sq, H, D], q's dtype
  float* lse = nullptr;    // optional [B, H, Sq] contiguous, natural log
  void* stream = nullptr;  // backend stream (cudaStream_t for cuda); null = default
  // Optional scratch in the backend's memory, 16-byte aligned: attention_forward_workspace_bytes() large lets a
  // decode (a few query rows against many keys) split the keys across the GPU and merge the parts by LSE; a
  // smaller one (or none) means fewer splits, never an error. Taken from the caller so that a call allocates
  // nothing and can be captured in a CUDA graph.
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

struct BackwardArgs {
  TensorView q, k, v, out, dout;  // as in the forward; dout shaped like out
  const float* lse = nullptr;     // required, from the forward
  TensorView dq, dk, dv;          // shaped like q, k, v
  void* stream = nullptr;
  // With params.sinks: optional f32 [H] in the backend's memory, written with the sinks' gradient
  // (summed over the batch and the rows); null when the caller does not need it. After the stream, so that
  // positional initialisers written before it keep their meaning.
  float* dsinks = nullptr;
  // Optional scratch in the backend's memory, 16-byte aligned, attention_backward_workspace_bytes() large: the
  // cuda backend keeps each row's statistics there (its Hopper kernels). Without it (or with too little) the
  // backend allocates that scratch on the stream itself; with it a call allocates nothing (a CUDA graph).
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

// New rows appended to each sequence's pages (docs/spec.md §1.7): row t of sequence b goes to position
// pages.seq_lens_k[b] + t (the caller then adds T to its lengths), so a decode step is an append and a paged forward.
struct PagedAppendArgs {
  TensorView k_pages, v_pages;  // [num_pages, page_size, Hkv, D]
  PagedKv pages;                // the table, with each sequence's length before the append
  TensorView k, v;              // [B, T, Hkv, D], the pages' dtype
  void* stream = nullptr;
};

// Runs on the named backend's memory (see backend.hpp). Validation happens before any work.
void attention_forward(Backend& backend, const ForwardArgs& args, const AttentionParams& params);
// The workspace with which attention_forward runs its fastest plan for these arguments (0: none helps); validates
// them as attention_forward does, the workspace aside.
std::size_t attention_forward_workspace_bytes(Backend& backend, const ForwardArgs& args, const AttentionParams& params);
void attention_backward(Backend& backend, const BackwardArgs& args, const AttentionParams& params);
// The workspace attention_backward uses for these arguments (0: none); validates them as attention_backward does, the
// workspace aside.
std::size_t attention_backward_workspace_bytes(Backend& backend, const BackwardArgs& args,
                                               const AttentionParams& params);
void paged_kv_append(Backend& backend, const PagedAppendArgs& args);

}  // namespace flashtq

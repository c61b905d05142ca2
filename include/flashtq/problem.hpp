// Low-level, validated descriptions of one call: what every backend receives. They are produced
// only by the validator (src/core/validate.cpp) from the public arguments; all defaults are
// resolved (scale, causal_offset, max_seq, q_cap) and every size is known to fit in 64 bits.
#pragma once

#include <array>
#include <cstdint>

#include "flashtq/config.hpp"
#include "flashtq/tensor.hpp"
#include "flashtq/turboquant.hpp"

namespace flashtq {

namespace core {
struct Validator;
}

// Proof that a call came out of the validator: only core::Validator can make one, and every call
// type below is constructed from one, so a backend's compute methods cannot be reached with
// arguments the validator has not seen. Calls copy freely.
class Validated {
  Validated() = default;
  friend struct core::Validator;
};

struct DenseProblem {
  std::int64_t B = 0, Sq = 0, Sk = 0, H = 0, Hkv = 0, D = 0;
  DType dtype = DType::f32;
  float scale = 0.0f;
  bool causal = false;
  std::int64_t causal_offset = 0;  // explicit: query row i sits at i + causal_offset
  std::int64_t window = 0;
  const float* mask = nullptr;
  std::array<std::int64_t, 4> mask_strides{};
  float dropout_p = 0.0f;
  std::uint32_t seed = 0;
  bool tf32 = false;             // f32 products may run on TF32 tensor cores (AttentionParams::allow_tf32)
  bool pedantic = false;         // f32 products in f32 FMAs only (AttentionParams::pedantic_f32, without tf32)
  float softcap = 0.0f;          // > 0: scores are softcap * tanh(scale * <q, k> / softcap) (docs/spec.md §1.8)
  const float* sinks = nullptr;  // [H] logits in the backend's memory, or none (docs/spec.md §1.9)
  // One sequence of a ragged batch (docs/spec.md §1.6): B = 1, and its dropout decisions are those of
  // batch index `batch0` (bh = batch0 * H + h), as in the padded layout.
  bool varlen = false;
  std::int64_t batch0 = 0;
  // Keys in pages read through a table (ForwardCall::table): Sk is then the longest sequence the table allows, each
  // sequence's own length read by the kernel.
  bool paged = false;
  // A whole ragged batch in one call (ForwardCall::ragged, BackwardCall::ragged; docs/spec.md §1.6): B sequences, Sq
  // and Sk the longest of them, the views packed [1, T, heads, D], lse [H, Tq].
  bool packed = false;

  // Rows of lse per (batch, head): 0 means Sq; a sequence of a ragged batch run on its own (cuda) writes the
  // batch's [H, Tq] lse, its pointer at the sequence's first row, with lse_rows = Tq.
  std::int64_t lse_rows = 0;

  FLASHTQ_HOST_DEVICE std::int64_t group() const { return H / Hkv; }  // query heads per kv head
  FLASHTQ_HOST_DEVICE std::int64_t lse_at(std::int64_t b, std::int64_t h, std::int64_t i) const {
    return (b * H + h) * (lse_rows > 0 ? lse_rows : Sq) + i;
  }
  // The dropout hash's (batch, head) index of batch b, head h (docs/spec.md §1; §1.6: a sequence's batch index).
  FLASHTQ_HOST_DEVICE std::uint32_t dropout_bh(std::int64_t b, std::int64_t h) const {
    return std::uint32_t((batch0 + b) * H + h);
  }
};

// A paged forward with the table in the backend's memory (docs/spec.md §1.7): the call's k and v are the pages
// [num_pages, page_size, Hkv, D]; sequence b has min(max(seq_lens_k[b], 0), p.Sk) keys, key j in row j % page_size
// of page page_table[b * max_pages + j / page_size] clamped to [0, num_pages); its causal offset is its length - Sq
// when the caller gave none (offset_from_end), else p.causal_offset.
struct PagedTable {
  const std::int32_t* page_table = nullptr;
  const std::int32_t* seq_lens_k = nullptr;
  std::int64_t max_pages = 0, page_size = 0, num_pages = 0;
  bool offset_from_end = true;
};

// A ragged batch run as one call (p.packed): sequence b's query rows are [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of the
// packed views, its keys likewise; its causal offset is its keys minus its rows (offset_from_end) or p.causal_offset;
// its mask element (local row 0, local key 0) is p.mask + mask_offsets[b] (none: 0; mask_elements in all); its dropout
// decisions are those of batch index b. The arrays are in host memory, checked whole by the validator (so far).
struct RaggedTable {
  const std::int32_t* cu_seqlens_q = nullptr;  // [B + 1]
  const std::int32_t* cu_seqlens_k = nullptr;  // [B + 1]
  const std::int64_t* mask_offsets = nullptr;  // [B] or null
  std::int64_t total_q = 0, total_k = 0, mask_elements = 0;
  bool offset_from_end = true;
};

struct ForwardCall {
  explicit ForwardCall(Validated) {}
  DenseProblem p;
  TensorView q, k, v, out;
  float* lse = nullptr;
  void* stream = nullptr;
  void* workspace = nullptr;  // ForwardArgs::workspace: null, or 16-byte aligned in the backend's memory
  std::size_t workspace_bytes = 0;
  PagedTable table;    // with p.paged
  RaggedTable ragged;  // with p.packed
};

struct BackwardCall {
  explicit BackwardCall(Validated) {}
  DenseProblem p;
  TensorView q, k, v, out, dout, dq, dk, dv;
  const float* lse = nullptr;
  float* dsinks = nullptr;  // [H], only with p.sinks; null = not wanted
  void* stream = nullptr;
  RaggedTable ragged;         // with p.packed
  void* workspace = nullptr;  // BackwardArgs::workspace: null, or 16-byte aligned in the backend's memory
  std::size_t workspace_bytes = 0;
};

// Rows appended into pages on a device backend (docs/spec.md §1.7; host backends are written by core): row t of
// sequence b (k, v [B, T, Hkv, D]) to key seq_lens_k[b] + t of its pages. With a table in the backend's memory the
// kernel clamps as the paged forward does (a length to [0, max_pages * page_size], a page index to [0, num_pages))
// and skips rows past the table's reach; a host table was checked whole before.
struct PagedAppendCall {
  explicit PagedAppendCall(Validated) {}
  TensorView k_pages, v_pages, k, v;
  PagedTable table;
  void* stream = nullptr;
};

// Encode of T rows of keys or values into timesteps start_pos .. start_pos + T - 1.
struct TqEncodeCall {
  explicit TqEncodeCall(Validated) {}
  TqTables tables;  // tables.layout is the cache's layout
  bool keys = true;
  TensorView x;  // [1, T, n_kv_heads, head_dim]
  std::int64_t start_pos = 0;
  std::uint32_t* cache = nullptr;
  void* stream = nullptr;
  TqPageTable pages;  // a pool's: the sequence's pages (row 0) and exact set (layout().paged())

  const TqLayout& layout() const { return tables.layout; }
  std::int64_t tokens() const { return x.shape[1]; }
  FLASHTQ_HOST_DEVICE TqSequence sequence() const { return tq_sequence(tables.layout, pages, 0); }
};

// Rotation of q [batch, n_queries, n_heads, head_dim] into scratch rows b * n_queries + j.
struct TqRotateCall {
  explicit TqRotateCall(Validated) {}
  TqTables tables;
  TensorView q;
  TqScratchLayout scratch_layout;  // rows = q_cap
  float* scratch = nullptr;
  const std::uint32_t* k_cache = nullptr;  // with outlier channels: the keys whose masks order q's channels
  void* stream = nullptr;

  std::int64_t rows() const { return q.shape[0] * q.shape[1]; }
};

// Attention over packed caches with every default filled in (see TqAttendArgs).
struct TqAttendCall {
  explicit TqAttendCall(Validated) {}
  TqTables tables;
  TqScratchLayout scratch_layout;  // rows = q_cap, n_heads, head_dim
  const float* scratch = nullptr;
  std::int64_t n_heads = 0, n_queries = 1, start_pos = 0, batch = 1;
  std::int64_t max_seq = 0;      // causal clamp, resolved
  std::int64_t longest_row = 0;  // the last timestep + 1 any row sees: what split plans are sized by
  std::int64_t window = 0;       // 0 = none; else row p sees timesteps (p - window, p] only
  const std::int32_t* start_positions = nullptr;
  float scale = 0.0f, qjl_scale = 0.0f;
  const std::uint32_t* k_cache = nullptr;
  const std::uint32_t* v_cache = nullptr;
  TensorView out;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  void* stream = nullptr;
  bool exact = false;            // TqAttendArgs::exact
  float softcap = 0.0f;          // TqAttendArgs::softcap (docs/spec.md §1.8)
  const float* sinks = nullptr;  // TqAttendArgs::sinks: [n_heads] in the backend's memory (docs/spec.md §1.9)
  TqPageTable pages;             // a pool's (layout().paged())
  std::int64_t reach = 0;        // timesteps a sequence can hold (tq_reach): what positions are clamped to

  const TqLayout& layout() const { return tables.layout; }
  std::int64_t rows() const { return batch * n_queries; }  // scratch rows in use
  std::int64_t group() const { return n_heads / tables.layout.n_kv_heads; }
  FLASHTQ_HOST_DEVICE TqSequence sequence(std::int64_t b) const { return tq_sequence(tables.layout, pages, b); }
  FLASHTQ_HOST_DEVICE const std::uint32_t* keys(std::int64_t b) const {
    return k_cache + tq_sequence_base(tables.layout, b, true);
  }
  FLASHTQ_HOST_DEVICE const std::uint32_t* values(std::int64_t b) const {
    return v_cache + tq_sequence_base(tables.layout, b, false);
  }
  // The first timestep a row at absolute position p sees.
  // The end of a sequence whose query rows start at `start`: where its exact recent window ends.
  FLASHTQ_HOST_DEVICE std::int64_t sequence_end(std::int64_t start) const {
    const std::int64_t e = start + n_queries < max_seq ? start + n_queries : max_seq;
    return e < reach ? e : reach;
  }
  FLASHTQ_HOST_DEVICE std::int64_t first_visible(std::int64_t p) const {
    return window > 0 && p >= window ? p - window + 1 : 0;  // p - window + 1 > 0, without the sum
  }
};

}  // namespace flashtq

// Parameters shared by the TurboQuant attention kernels (scalar split-K, tensor-core decode, merge).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/page_window.cuh"
#include "flashtq/problem.hpp"

namespace flashtq::cuda {

constexpr int kSplitTokens = 256;     // tokens per block of the scalar kernel
constexpr int kMmaSplitTokens = 512;  // least tokens per block of the tensor-core decode kernel
constexpr int kMmaMaxSplitTokens = 4096;

struct AttendParams {
  TqLayout l;
  const float* scratch;
  TqScratchLayout scratch_layout;
  std::int64_t H, n_queries, start_pos, max_seq;
  float scale, qjl_scale;
  const std::uint32_t* k;
  const std::uint32_t* v;
  float* out;
  std::int64_t out_batch_stride, out_row_stride, out_head_stride;
  std::int64_t batch;
  const std::int32_t* starts;  // per sequence, or null: start_pos for all
  std::int64_t first_row;      // first batch row of this launch (grids hold at most 65535 rows in z)
  float* ws;
  void* key_fragments;  // the tensor-core decode's per (row, head group) query fragments, in the workspace
  int mean_dot_rows;    // decode_tc with key block means: the key blocks one warp's timesteps may touch
  int n_splits, n_tiles;
  int split_tokens;     // timesteps per block (split)
  std::int64_t window;  // 0 = none; else row p sees (p - window, p]
  TqPageTable pages;    // a pool's (l.paged()): sequence b's timesteps through row b
  std::int64_t reach;   // timesteps a sequence can hold (tq_reach): what positions are clamped to
  float softcap;        // TqAttendCall::softcap (0 = none)
  const float* sinks;   // [H] or null (TqAttendCall::sinks): the merge joins them
  float key_centroids[16], value_centroids[16];
  float outlier_centroids[16];  // keys with outlier channels: part 0's codebook
  std::uint32_t polar_signs[8];
};

__device__ __forceinline__ float f16_low(std::uint32_t w) {
  return __half2float(__ushort_as_half(std::uint16_t(w & 0xFFFFu)));
}

// docs/spec.md §1.8 on a score in the units of `cap`: the softcap for natural-log scores, softcap * log2(e)
// for base-2 ones (0 = none); a hidden timestep's -inf stays.
__device__ __forceinline__ float capped_score(float s, float cap) {
  return cap > 0.0f && s != -INFINITY ? cap * tanhf(s / cap) : s;
}

// Timesteps that row z = b * n_queries + j sees, clamped into [0, capacity].
__device__ __forceinline__ std::int64_t seq_len_of(const AttendParams& a, std::int64_t z) {
  const std::int64_t b = z / a.n_queries, j = z % a.n_queries;
  const std::int64_t start = a.starts != nullptr ? std::int64_t(a.starts[b]) : a.start_pos;
  return max(std::int64_t(0), min(min(start + j + 1, a.max_seq), a.reach));
}

// Where row z's sequence ends: its exact recent window's end (TqAttendCall::sequence_end).
__device__ __forceinline__ std::int64_t sequence_end_of(const AttendParams& a, std::int64_t z) {
  const std::int64_t b = z / a.n_queries;
  const std::int64_t start = a.starts != nullptr ? std::int64_t(a.starts[b]) : a.start_pos;
  return max(std::int64_t(0), min(min(start + a.n_queries, a.max_seq), a.reach));
}

// The first timestep row z sees (the sliding window's start; 0 without one).
__device__ __forceinline__ std::int64_t first_visible_of(const AttendParams& a, std::int64_t z) {
  if (a.window <= 0) return 0;
  const std::int64_t b = z / a.n_queries, j = z % a.n_queries;
  const std::int64_t p = (a.starts != nullptr ? std::int64_t(a.starts[b]) : a.start_pos) + j;
  return p >= a.window ? p - a.window + 1 : 0;  // TqAttendCall::first_visible
}

// Row z's sequence's caches (a pool's are shared) and where its timesteps and exact rows are in them.
__device__ __forceinline__ const std::uint32_t* keys_of(const AttendParams& a, std::int64_t z) {
  return a.k + tq_sequence_base(a.l, z / a.n_queries, true);
}
__device__ __forceinline__ const std::uint32_t* values_of(const AttendParams& a, std::int64_t z) {
  return a.v + tq_sequence_base(a.l, z / a.n_queries, false);
}
__device__ __forceinline__ TqSequence sequence_of(const AttendParams& a, std::int64_t z) {
  return tq_sequence(a.l, a.pages, z / a.n_queries);
}

// A warp's walk over consecutive tiles of one sequence (a tile within one page): how far each tile's timesteps
// lie from where a contiguous image has them (0 without pages), the table read through a WarpPageWindow. Every
// lane of the warp calls moved_at with the same timestep.
struct PageWalk {
  TqSequence sq;
  std::int64_t limit;  // the walk's end: no entry past it is loaded
  std::int64_t page = -2;
  WarpPageWindow entries{sq.pages, (limit + (std::int64_t(1) << sq.page_shift) - 1) >> sq.page_shift, sq.page_count};

  __device__ __forceinline__ std::int64_t moved_at(std::int64_t t) {
    if (sq.pages == nullptr) return 0;
    page = t >> sq.page_shift;
    return (entries(page) - page) << sq.page_shift;
  }
};

constexpr std::int64_t kMaxGridZ = 65535;

// A split's partial in the workspace, per (row, head, split): the running maximum (natural log), the
// sum of weights, two unused floats, then the D accumulators, so that every partial's accumulators
// start on a 16-byte boundary (the merge reads them as float4).
constexpr int kPartialHeader = 4;
__host__ __device__ constexpr int partial_stride(int head_dim) { return head_dim + kPartialHeader; }

// The tensor-core decode of the seed's layout (tq_decode_mma.cu; kernel_choice.hpp says which calls), exact
// or bf16-class (`bf16`: TqAttendKernel::decode_mma_bf16).
// Bytes of the prepared query fragments per (query row, group of 4 heads).
constexpr std::size_t kKeyFragmentBytes = 6208;
// Builds the query fragments of every row of the batch (once per call, before the decode launches).
void launch_mma_prepare(const AttendParams& a, bool bf16, cudaStream_t stream);
void launch_mma_decode(const AttendParams& a, bool bf16, dim3 grid, cudaStream_t stream);

// The tensor-core decode of keys without QJL (tq_decode_tc.cu; kernel_choice.hpp says which layouts):
// at most 8 query heads per block (grid y: kv heads x ceil(group / 8)), splits of split_tokens timesteps
// (a multiple of 64), and with exact tokens one split more, the last, for them. Launches the key block
// means' dot products first when the layout has them.
constexpr int kTcHeads = 8;
constexpr int kTcSplitTokens = 256;  // least timesteps per split
constexpr int kTcSplitStep = 64;     // splits are multiples of it: 16-timestep tiles for each of the 4 warps
// Blocks of decode_tc resident per SM, which its registers are held to: 3 up to D = 128 (168 registers a thread,
// none spilled; held to 128 for 4 blocks, the tile loop spilled and ran slower), 2 above.
constexpr int tc_blocks_per_sm(int head_dim) { return head_dim <= 128 ? 3 : 2; }
// What a block costs besides its timesteps (tables, key mean dots, the combine), in timesteps: about one tile a warp.
constexpr int kTcBlockCostTokens = 64;
void launch_tc_decode(const AttendParams& a, dim3 grid, cudaStream_t stream);

}  // namespace flashtq::cuda

// Rows of one head of a [B, S, H, D] view into a padded shared-memory tile, 16 bytes per cp.async:
// the staging step of the mma.sync dense kernels (f16/bf16 and f32 alike).
#pragma once

#include <cstdint>

#include "cuda/common.cuh"

namespace flashtq::cuda {

// Copies rows [row0, row0 + rows) of head h of batch b into `tile` (rows of D + Pad elements); rows
// at or past `limit` are zero-filled. Where the block's threads tile a row evenly, each thread copies
// the same 16 bytes of every (Threads / chunks-per-row)-th row, walking one pointer.
template <typename T, int D, int Pad, int Threads>
__device__ __forceinline__ void stage_rows(T (*tile)[D + Pad], const TensorView& t, std::int64_t b, std::int64_t h,
                                           std::int64_t row0, int rows, std::int64_t limit, int tid) {
  auto copy = [](T* dst, const T* src, bool inside) { cp_async16_zfill(shared_address(dst), src, inside); };
  constexpr int per_chunk = 16 / int(sizeof(T)), per_row = D / per_chunk;
  if constexpr (Threads % per_row == 0) {
    constexpr int pass_rows = Threads / per_row;
    const int r0 = tid / per_row, d0 = (tid % per_row) * per_chunk;
    const std::int64_t step = pass_rows * t.strides[1];
    const T* src = static_cast<const T*>(t.data) + row_offset(t, b, row0 + r0, h) + d0;
    for (int r = r0; r < rows; r += pass_rows, src += step) {
      const bool inside = row0 + r < limit;
      copy(&tile[r][d0], inside ? src : static_cast<const T*>(t.data), inside);
    }
  } else {
    for (int e = tid; e < rows * per_row; e += Threads) {
      const int r = e / per_row, d0 = (e % per_row) * per_chunk;
      const bool inside = row0 + r < limit;
      copy(&tile[r][d0], static_cast<const T*>(t.data) + row_offset(t, b, inside ? row0 + r : 0, h) + d0, inside);
    }
  }
}

// Calls f(pointer) on each 16-byte chunk stage_rows<T, D, Pad, Threads> gave this thread (in the
// same order), e.g. to transform the chunks in place once this thread's copies have landed.
template <typename T, int D, int Pad, int Threads, typename F>
__device__ __forceinline__ void for_staged_chunks(T (*tile)[D + Pad], int rows, int tid, F&& f) {
  constexpr int per_chunk = 16 / int(sizeof(T)), per_row = D / per_chunk;
  for (int e = tid; e < rows * per_row; e += Threads) f(&tile[e / per_row][(e % per_row) * per_chunk]);
}

// The mma.sync dense kernels' key loop: tiles of kKeys keys from begin (rounded down to a tile) to end, each staged
// by stage_tile(j0, stage) (which commits its copies) one tile ahead, in two stages. landed(j0, stage) runs once
// this thread's own copies of tile j0 (and whatever it committed before the first tile: Q) have arrived, before
// the block syncs; body(j0, stage) once the whole tile is visible to every warp; the block syncs again after it,
// so that no warp still reads the stage the next turn refills.
template <int kKeys, typename Stage, typename Landed, typename Body>
__device__ __forceinline__ void for_each_key_tile(std::int64_t begin, std::int64_t end, Stage&& stage_tile,
                                                  Landed&& landed, Body&& body) {
  const std::int64_t first = begin / kKeys * kKeys;
  if (first < end) {
    stage_tile(first, 0);
  } else {
    cp_async_commit();
  }
  int stage = 0;
  for (std::int64_t j0 = first; j0 < end; j0 += kKeys, stage ^= 1) {
    if (j0 + kKeys < end) {
      stage_tile(j0 + kKeys, stage ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    landed(j0, stage);
    __syncthreads();
    body(j0, stage);
    __syncthreads();
  }
}

}  // namespace flashtq::cuda

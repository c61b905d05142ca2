// A warp's view of one page-table row that it walks in increasing order: lane i holds entry window + i of the
// current window of 32 entries and, in a second register, entry window + 32 + i, loaded as the window is entered.
// An entry is thus read 32 pages before the warp stages from it, in one 128-byte load per window; looked up as its
// tile was staged (or one page ahead), a page of 16 timesteps put a dependent global load in front of almost every
// tile's copies. Every lane of the warp must call with the same index.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace flashtq::cuda {

struct WarpPageWindow {
  const std::int32_t* row = nullptr;  // the sequence's row of the table
  std::int64_t readable = 0;          // entries of the row the walk may read (none past it is loaded)
  std::int64_t pages = 1;             // entries are clamped into [0, pages): a device table is the caller's word
  std::int64_t window = -64;          // the first entry of the window held (a multiple of 32)
  std::int32_t held = 0, next = 0;

  __device__ __forceinline__ std::int32_t load(std::int64_t i) const {
    if (i >= readable) return 0;
    const std::int32_t e = row[i];
    return e < 0 ? 0 : e >= pages ? std::int32_t(pages - 1) : e;
  }
  // Entry i of the row, clamped.
  __device__ __forceinline__ std::int64_t operator()(std::int64_t i) {
    const std::int64_t w = i & ~std::int64_t(31);
    if (w != window) {
      const int lane = int(threadIdx.x & 31u);
      held = w == window + 32 ? next : load(w + lane);
      next = load(w + 32 + lane);
      window = w;
    }
    return __shfl_sync(0xFFFFFFFFu, held, int(i - w));
  }
};

}  // namespace flashtq::cuda

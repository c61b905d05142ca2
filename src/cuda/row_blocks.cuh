// The launch grid of the row-blocked dense forwards: one block per (batch x head, block of query
// rows), the heaviest row blocks (under a causal mask, the last) first.
// Blocks start in x-then-y order. RowOrder::heaviest_first, when rows see different numbers of keys
// (causal, window), puts row blocks in y so that every head's heaviest block starts before any
// lighter one: longest first keeps the last wave short. Otherwise rows go in x, keeping a head's
// blocks together while its K and V are in L2 — what the Hopper bf16 forward keeps (heaviest-first
// was slower there). Timings of both orders: docs/benchmarks.md.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernel_choice.hpp"
#include "flashtq/problem.hpp"

namespace flashtq::cuda {

inline dim3 row_block_grid(const DenseProblem& p, int rows, RowOrder order) {
  const unsigned row_blocks = unsigned((p.Sq + rows - 1) / rows), heads = unsigned(p.B * p.H);
  return rows_in_y(p, order) ? dim3(heads, row_blocks) : dim3(row_blocks, heads);
}

struct RowBlock {
  std::int64_t b, h, hk;  // batch, query head, its kv head
  std::int64_t i0;        // first query row
};

// This block's batch, heads and first row under row_block_grid(p, rows, order).
__device__ __forceinline__ RowBlock this_row_block(const DenseProblem& p, int rows, RowOrder order) {
  const bool y = rows_in_y(p, order);
  const unsigned block = y ? blockIdx.y : blockIdx.x, blocks = y ? gridDim.y : gridDim.x;
  const std::int64_t bh = y ? blockIdx.x : blockIdx.y, h = bh % p.H;
  return {bh / p.H, h, h / p.group(), std::int64_t(blocks - 1 - block) * rows};
}

}  // namespace flashtq::cuda

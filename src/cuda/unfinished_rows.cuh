// The flag by which the tiled dense kernels tell the repair kernels of dense_repair.cu that a row
// needs them (docs/spec.md §3): raised at the store by a thread that met a row it could not finish in
// f32 or an element that is not finite, read and lowered again by the repair kernel that follows on the
// stream, so that a call whose rows are all finished costs one atomic-free store check and one
// repair launch that returns at once.
#pragma once

namespace flashtq::cuda {

struct UnfinishedRows {
  unsigned raised;  // nonzero once a kernel met a row it could not finish
  unsigned done;    // repair blocks that have read `raised` (the last one lowers both)
};

__device__ __forceinline__ void raise_unfinished(unsigned* raised, bool bad) {
  if (bad) atomicOr(raised, 1u);  // rare: only extreme inputs reach it
}

}  // namespace flashtq::cuda

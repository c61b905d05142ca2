// Hopper's tensor memory accelerator (TMA) and shared-memory barriers (mbarrier), sm_90: the copy
// engine fills a shared tile from a tensor map and signals an mbarrier with the bytes it wrote;
// consumers wait on the barrier's phase. Device side only; the maps are made by tensor_map.hpp.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/wgmma.cuh"

namespace flashtq::cuda::tma {

#ifdef FLASHTQ_WGMMA
__device__ __forceinline__ void barrier_init(unsigned bar, unsigned arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}
// Makes initialised barriers visible to the copy engine (then a block barrier to the other threads).
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// One arrival that also tells the barrier to expect `bytes` more from the copy engine in this phase.
__device__ __forceinline__ void arrive_expect_bytes(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Waits until the barrier's phase with the given parity (0 for its 1st, 3rd, ... completion) is over.
__device__ __forceinline__ void wait(unsigned bar, unsigned parity) {
  unsigned done = 0;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
  } while (!done);
}
// Copies the box at coordinates (c0, c1, c2, c3) (innermost first) of `map` to shared address `dst`,
// completing `bytes` on barrier `bar`; parts of the box outside the tensor arrive as zeros.
__device__ __forceinline__ void load_4d(unsigned dst, const CUtensorMap& map, unsigned bar, int c0, int c1, int c2,
                                        int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<std::uint64_t>(&map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
// A producer/consumer ring: barrier `once` (one arrival, for tiles loaded once) and per stage a
// "full" barrier (`producer_arrivals`) and an "empty" one (`consumer_arrivals`), 8 bytes apart each;
// initialised by one thread, made visible to the copy engine (the caller then syncs the block).
__device__ __forceinline__ void init_ring(unsigned once, unsigned full, unsigned empty, int stages,
                                          unsigned producer_arrivals, unsigned consumer_arrivals) {
  barrier_init(once, 1);
  for (int s = 0; s < stages; ++s) {
    barrier_init(full + 8 * s, producer_arrivals);
    barrier_init(empty + 8 * s, consumer_arrivals);
  }
  fence_barrier_init();
}

// Tile t's slot of such a ring (kStages slots, tile t in slot t % kStages): where its copies arrive, the
// producer's wait for the consumers to have released the tile kStages before it, the consumers' wait for its bytes,
// and their release of it. Each use of a slot flips its barriers' phase: tile t is the (t / kStages)-th.
template <int kStages>
struct Ring {
  unsigned full, empty;  // the first stage's barriers (init_ring's)

  __device__ __forceinline__ unsigned full_of(int t) const { return full + 8u * unsigned(t % kStages); }
  __device__ __forceinline__ void wait_empty(int t) const {
    if (t >= kStages) wait(empty + 8u * unsigned(t % kStages), unsigned(t / kStages - 1) & 1u);
  }
  __device__ __forceinline__ void wait_full(int t) const { wait(full_of(t), unsigned(t / kStages) & 1u); }
  __device__ __forceinline__ void release(int t) const { arrive(empty + 8u * unsigned(t % kStages)); }
};

// Named barriers 1..15 among `threads` threads: sync waits for all of them, arrive only counts itself.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Two consumer warpgroups taking turns on the tensor cores (FlashAttention-3's ping-pong), on named barriers 1 and 2:
// warpgroup `group` (0 or 1) waits on barrier 1 + group for its turn and gives the turn away by arriving on the
// other's. Warpgroup 0 goes first when warpgroup 1 starts by giving its turn away.
template <int kGroups>
struct WarpgroupTurns {
  static_assert(kGroups == 2, "turns between two consumer warpgroups");
  int group;

  __device__ __forceinline__ void mine() const { named_sync(1 + group, 128 * kGroups); }
  __device__ __forceinline__ void theirs() const { named_arrive(2 - group, 128 * kGroups); }
};
#endif  // FLASHTQ_WGMMA

}  // namespace flashtq::cuda::tma

// Dense forward on Hopper (sm_90a), f16/bf16, head_dim 64, 128, 256: warpgroup tensor cores (wgmma),
// tiles fetched by the tensor memory accelerator (TMA), and two warpgroups taking turns on the tensor
// cores (FlashAttention-3's "ping-pong"): while one runs its softmax the other's products run.
// A block owns 128 query rows: warpgroups 0 and 1 hold 64 each; warpgroup 2 is the producer, whose
// one thread streams K/V tiles of 128 keys (64 at head_dim 256) into a ring of three shared-memory
// stages (two at 256), with mbarriers "full" and "empty" per stage. Tiles sit in wgmma's
// 128-byte-swizzled layout, which TMA writes.
// Each warpgroup runs the chain S_0; (O += P_0 V_0, S_1); (O += P_1 V_1, S_2); ...; (O += P_n V_n) as one
// product group per turn: S = Q K^T reads both operands from shared memory; O += P V takes P from
// registers (S's accumulators after the softmax) and V from shared memory as an N-major operand.
// The softmax and every feature of docs/spec.md §1 are shared with the other forwards (dense_softmax.cuh).
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/visibility.hpp"
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/dense_softmax.cuh"
#include "cuda/kernels.hpp"
#include "cuda/launch.hpp"
#include "cuda/row_blocks.cuh"
#include "cuda/tensor_map.hpp"
#include "cuda/tma.cuh"
#include "cuda/wgmma.cuh"

namespace flashtq::cuda {
namespace {

constexpr RowOrder kRowOrder = tiles::kWgmmaForward.order;  // row_blocks.cuh

constexpr int kGroupRows = 64, kGroups = 2, kRows = kGroups * kGroupRows;
static_assert(kRows == tiles::kWgmmaForward.rows);
constexpr int kThreads = 128 * (kGroups + 1);  // the consumer warpgroups, then the producer warpgroup
// Keys per K/V tile and tiles in flight: 128 and 3 up to head_dim 128; at 256, 64 and 2 (O's 128
// accumulator registers, and shared memory).
template <int D>
constexpr int kKeysFor = D <= 128 ? 128 : 64;
template <int D>
constexpr int kStagesFor = D <= 128 ? 3 : 2;

// Shared memory: Q, the K stages, the V stages (each 1024-byte aligned), then the barriers; plus
// 1024 bytes to align the start.
template <int D>
constexpr unsigned shared_bytes() {
  return wgmma::swizzled_tile_bytes<D>(kRows) + 2 * kStagesFor<D> * wgmma::swizzled_tile_bytes<D>(kKeysFor<D>) +
         8 * (1 + 2 * kStagesFor<D>)+wgmma::kSwizzleAtomBytes;
}

struct Maps {
  CUtensorMap q, k, v;
};

template <typename T, int D>
__global__ void __launch_bounds__(kThreads, 1) forward_wgmma_kernel(DenseProblem p, const __grid_constant__ Maps maps,
                                                                    TensorView ov, float* lse, unsigned* unfinished) {
#ifdef FLASHTQ_WGMMA
  constexpr int kKeys = kKeysFor<D>, kStages = kStagesFor<D>;
  constexpr int NT = kKeys / 8, DT = D / 8, kBlocks = D / 64;  // n-tiles of S and of O; column blocks
  constexpr unsigned kQBytes = wgmma::swizzled_tile_bytes<D>(kRows), kKvBytes = wgmma::swizzled_tile_bytes<D>(kKeys);
  // Registers per thread once the producer gives its own back: a scheduler's file (512 per lane) holds
  // one producer warp at 24 and two consumer warps at 240.
  constexpr int kProducerRegisters = 24, kConsumerRegisters = 240;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const unsigned q_tile = wgmma::swizzle_aligned(smem_raw);
  const unsigned k_tiles = q_tile + kQBytes, v_tiles = k_tiles + kStages * kKvBytes;
  const unsigned q_full = v_tiles + kStages * kKvBytes, full = q_full + 8, empty = full + 8 * kStages;  // barriers
  const int tid = threadIdx.x, group = tid / 128;
  const RowBlock block = this_row_block(p, kRows, kRowOrder);
  const std::int64_t b = block.b, h = block.h, hk = block.hk, i0 = block.i0;
  const core::KeyRange range = core::key_range(p, i0, min(i0 + kRows, p.Sq));
  const std::int64_t first = range.begin / kKeys * kKeys;
  const int tiles = first < range.end ? int((range.end - first + kKeys - 1) / kKeys) : 0;
  const tma::Ring<kStages> ring{full, empty};
  if (tid == 0) tma::init_ring(q_full, full, empty, kStages, 1, 128 * kGroups);
  __syncthreads();

  if (group == kGroups) {  // the producer warpgroup: one thread issues every copy
    wgmma::shrink_registers<kProducerRegisters>();
    if (tid % 128 != 0 || tiles == 0) return;
    tma::arrive_expect_bytes(q_full, kQBytes);
    for (int c = 0; c < kBlocks; ++c) {
      tma::load_4d(q_tile + c * (kQBytes / kBlocks), maps.q, q_full, 64 * c, int(h), int(i0), int(b));
    }
    for (int t = 0; t < tiles; ++t) {
      const int s = t % kStages;
      ring.wait_empty(t);  // both warpgroups are done with it
      const unsigned bar = ring.full_of(t);
      tma::arrive_expect_bytes(bar, 2 * kKvBytes);
      const int j0 = int(first) + t * kKeys;
      for (int c = 0; c < kBlocks; ++c) {
        tma::load_4d(k_tiles + s * kKvBytes + c * (kKvBytes / kBlocks), maps.k, bar, 64 * c, int(hk), j0, int(b));
        tma::load_4d(v_tiles + s * kKvBytes + c * (kKvBytes / kBlocks), maps.v, bar, 64 * c, int(hk), j0, int(b));
      }
    }
    return;
  }

  wgmma::grow_registers<kConsumerRegisters>();
  const int warp = (tid / 32) % 4, lane = tid % 32, g = lane / 4, tig = lane % 4;
  // Warp w of warpgroup q holds rows 64 q + 16 w + g and + 8 of the block (one 16-row atom).
  auto row_of = [&](int, int half) { return i0 + kGroupRows * group + 16 * warp + g + 8 * half; };
  float o[1][DT][4] = {};
  float m[1][2] = {{-INFINITY, -INFINITY}}, l[1][2] = {};
  const auto tile = mma_layout(p, b, h, tig, row_of);
  // Q and K as K-major operands, V as an N-major one (wgmma.cuh).
  const std::uint64_t q_desc = wgmma::k_major(q_tile, group * kGroupRows);
  auto scores = [&](float(&s)[1][NT][4], int stage) {  // S = Q K^T, issued
    const std::uint64_t k_desc = wgmma::k_major(k_tiles + stage * kKvBytes, 0);
    wgmma::mma_ss_rows<T, kKeys, D>(reinterpret_cast<float(&)[NT * 4]>(s[0]), q_desc, kQBytes / kBlocks, k_desc,
                                    kKvBytes / kBlocks);
  };
  auto accumulate = [&](const std::uint32_t(&pa)[kKeys / 16][4], int stage) {  // O += P V, issued
    const std::uint64_t v_desc = wgmma::n_major(v_tiles + stage * kKvBytes, kKvBytes / kBlocks);
    wgmma::mma_rs_rows<T, D, kKeys>(reinterpret_cast<float(&)[DT * 4]>(o[0]), pa, v_desc);
  };
  const tma::WarpgroupTurns<kGroups> turns{group};  // turns on the tensor cores
  float s[1][NT][4];
  std::uint32_t pa[kKeys / 16][4];
  // Softmax of tile t (in s), then P packed as the A fragments of O += P V (keys 16 kk .. 16 kk + 15).
  auto softmax = [&](int t) {
    const std::int64_t j0 = first + std::int64_t(t) * kKeys;
    const bool interior = j0 >= range.begin && j0 + kKeys <= p.Sk &&
                          core::tile_fully_visible(p, i0, min(i0 + kRows, p.Sq), j0, j0 + kKeys);
    softmax_tile(tile, j0, interior, s, m, l, o);
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
#pragma unroll
      for (int x = 0; x < 4; ++x)
        pa[kk][x] = pack2<T>(s[0][2 * kk + x / 2][2 * (x % 2)], s[0][2 * kk + x / 2][2 * (x % 2) + 1]);
    }
  };
  if (tiles > 0) {
    if (group == 1) turns.theirs();  // warpgroup 0 goes first
    tma::wait(q_full, 0);
    ring.wait_full(0);
    turns.mine();
    wgmma::fence();
    scores(s, 0);
    wgmma::commit();
    turns.theirs();
    wgmma::wait<0>();
    softmax(0);
    // One turn per tile: O += P_t V_t and S_{t+1} = Q K_{t+1}^T (the last turn only the former; no
    // branch between products, which would make the compiler serialise them).
    for (int t = 0; t + 1 < tiles; ++t) {
      const int stage = t % kStages, next = (t + 1) % kStages;
      ring.wait_full(t + 1);
      turns.mine();
      wgmma::fence();
      accumulate(pa, stage);
      scores(s, next);
      wgmma::commit();
      turns.theirs();
      wgmma::wait<0>();
      ring.release(t);
      softmax(t + 1);
    }
    turns.mine();
    wgmma::fence();
    accumulate(pa, (tiles - 1) % kStages);
    wgmma::commit();
    if (group == 0) turns.theirs();  // balanced: warpgroup 1 gave one turn away at the start
    wgmma::wait<0>();
  }
  store_rows<T>(tile, ov, lse, o, m, l, unfinished);
#endif
}

template <typename T, int D>
void launch_dim(const ForwardCall& c, const Maps& maps, dim3 grid, cudaStream_t stream) {
  constexpr int smem = int(shared_bytes<D>());
  allow_shared_bytes<forward_wgmma_kernel<T, D>>(smem);
  forward_wgmma_kernel<T, D><<<grid, kThreads, smem, stream>>>(c.p, maps, c.out, c.lse, unfinished_rows_flag());
}

template <typename T>
void launch_for(const ForwardCall& c, const Maps& maps) {
  const dim3 grid = row_block_grid(c.p, kRows, kRowOrder);
  auto stream = static_cast<cudaStream_t>(c.stream);
  switch (c.p.D) {
    case 64: launch_dim<T, 64>(c, maps, grid, stream); break;
    case 128: launch_dim<T, 128>(c, maps, grid, stream); break;
    default: launch_dim<T, 256>(c, maps, grid, stream); break;
  }
  FLASHTQ_CUDA_CHECK_LAUNCH("dense forward (wgmma)");
}

}  // namespace

void launch_dense_forward_wgmma(const ForwardCall& c) {
  const unsigned keys = c.p.D <= 128 ? kKeysFor<128> : kKeysFor<256>;
  const auto q = row_tile_map(c.q, kRows), k = row_tile_map(c.k, keys), v = row_tile_map(c.v, keys);
  if (!q || !k || !v) throw Error("backend", "cuda: no TMA map for views choose_dense_forward gave the wgmma kernel");
  const Maps maps{*q, *k, *v};
  if (c.p.dtype == DType::f16) {
    launch_for<__half>(c, maps);
  } else {
    launch_for<__nv_bfloat16>(c, maps);
  }
}

}  // namespace flashtq::cuda

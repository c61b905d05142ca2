// Dense forward on Hopper's warpgroup tensor cores (wgmma, sm_90a), f16/bf16, head_dim 64 and 128.
// A block of two warpgroups owns 128 query rows (64 each). Q, K and V tiles sit in shared memory in
// wgmma's 128-byte-swizzled layout; K/V tiles of 128 keys are double-buffered by cp.async. S = Q K^T
// reads both operands from shared memory (no register fragments for Q or K); O += P V takes P from
// registers (S's accumulators, converted in place) and V from shared memory as an N-major operand.
// The softmax and every feature of SPEC §1 are the mma.sync kernel's (dense_softmax.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/visibility.hpp"
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/dense_softmax.cuh"
#include "cuda/kernels.hpp"
#include "cuda/wgmma.cuh"

namespace flashtq::cuda {
namespace {

constexpr int kGroupRows = 64, kGroups = 2, kRows = kGroups * kGroupRows, kThreads = 128 * kGroups;
constexpr int kKeys = 128;                 // keys per K/V tile
constexpr unsigned kAtomRowBytes = 128;    // a swizzle atom's row: 64 elements of 16 bits
constexpr unsigned kAtomBytes = 8 * kAtomRowBytes;

// A tile of `rows` rows by D elements is stored as D / 64 column blocks of rows x 128 bytes.
template <int D>
constexpr unsigned tile_bytes(int rows) {
  return unsigned(D / 64) * unsigned(rows) * kAtomRowBytes;
}

// Copies rows [row0, row0 + rows) of one head of `t` into the swizzled tile at shared address `tile`
// (1024-byte aligned) with cp.async: the 16-byte chunk c of row r goes to column block c / 8, at
// r * 128 + ((c % 8) ^ (r % 8)) * 16 — wgmma's 128-byte swizzle. Rows at or past `limit` are zero-filled.
template <typename T, int D>
__device__ __forceinline__ void stage_swizzled(unsigned tile, const TensorView& t, std::int64_t b, std::int64_t h,
                                               std::int64_t row0, int rows, std::int64_t limit, int tid) {
  constexpr int per_row = D / 8, pass_rows = kThreads / per_row;
  static_assert(pass_rows % 8 == 0, "each thread keeps one chunk column, so its swizzle is fixed");
  const int r0 = tid / per_row, c = tid % per_row;
  const std::int64_t step = pass_rows * t.strides[1];
  const T* src = static_cast<const T*>(t.data) + row_offset(t, b, row0 + r0, h) + c * 8;
  const unsigned dst0 = tile + unsigned(c / 8) * unsigned(rows) * kAtomRowBytes + (unsigned((c % 8) ^ (r0 % 8)) << 4);
  for (int r = r0; r < rows; r += pass_rows, src += step) {
    const bool inside = row0 + r < limit;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst0 + unsigned(r) * kAtomRowBytes),
                 "l"(inside ? src : static_cast<const T*>(t.data)), "r"(inside ? 16 : 0));
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads, 1) forward_wgmma_kernel(DenseProblem p, TensorView qv, TensorView kv,
                                                                    TensorView vv, TensorView ov, float* lse) {
#ifdef FLASHTQ_WGMMA
  constexpr int NT = kKeys / 8, DT = D / 8;  // n-tiles of S and of O
  constexpr unsigned kQBytes = tile_bytes<D>(kRows), kKvBytes = tile_bytes<D>(kKeys);
  // Shared memory: Q, then two stages of K, then two of V; the launch adds 1024 bytes to align them.
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const unsigned q_tile = (static_cast<unsigned>(__cvta_generic_to_shared(smem_raw)) + kAtomBytes - 1) & ~(kAtomBytes - 1);
  const unsigned k_tiles = q_tile + kQBytes, v_tiles = k_tiles + 2 * kKvBytes;
  const int tid = threadIdx.x, group = tid / 128, warp = (tid / 32) % 4, lane = tid % 32, g = lane / 4, tig = lane % 4;
  const std::int64_t bh = blockIdx.y, b = bh / p.H, h = bh % p.H, hk = h / p.group();
  // The last row blocks first: under a causal mask they see the most keys.
  const std::int64_t i0 = std::int64_t(gridDim.x - 1 - blockIdx.x) * kRows;
  // Warp w of warpgroup q holds rows 64 q + 16 w + g and + 8 of the block (one 16-row atom).
  auto row_of = [&](int, int half) { return i0 + kGroupRows * group + 16 * warp + g + 8 * half; };
  float o[1][DT][4] = {};
  float m[1][2] = {{-INFINITY, -INFINITY}}, l[1][2] = {};
  const core::KeyRange range = core::key_range(p, i0, min(i0 + kRows, p.Sq));
  const ScoreTile<decltype(row_of)> tile{p, b, h, tig, row_of, p.scale * kLog2e,
                                         p.dropout_p > 0.0f ? 1.0f / (1.0f - p.dropout_p) : 1.0f};
  // Q and K are K-major (k-step kk: column block kk / 4, 32 bytes per step within it; 8-row groups
  // 1024 bytes apart); V is N-major (k-step kk: 16 key rows further; its column blocks one tile apart).
  const std::uint64_t q_desc = wgmma::descriptor_sw128(q_tile + unsigned(group * kGroupRows) * kAtomRowBytes, 16, kAtomBytes);
  auto issue = [&](std::int64_t j0, int stage) {
    stage_swizzled<T, D>(k_tiles + stage * kKvBytes, kv, b, hk, j0, kKeys, p.Sk, tid);
    stage_swizzled<T, D>(v_tiles + stage * kKvBytes, vv, b, hk, j0, kKeys, p.Sk, tid);
    cp_async_commit();
  };
  stage_swizzled<T, D>(q_tile, qv, b, h, i0, kRows, p.Sq, tid);  // committed with the first K/V tile
  const std::int64_t first = range.begin / kKeys * kKeys;
  if (first < range.end) {
    issue(first, 0);
  } else {
    cp_async_commit();
  }
  int stage = 0;
  for (std::int64_t j0 = first; j0 < range.end; j0 += kKeys, stage ^= 1) {
    if (j0 + kKeys < range.end) {
      issue(j0 + kKeys, stage ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    wgmma::fence_shared_for_async();  // this thread's copies, visible to the tensor cores' reads
    __syncthreads();                  // ... of every thread
    const std::uint64_t k_desc = wgmma::descriptor_sw128(k_tiles + stage * kKvBytes, 16, kAtomBytes);
    const std::uint64_t v_desc = wgmma::descriptor_sw128(v_tiles + stage * kKvBytes, kKvBytes / (D / 64), kAtomBytes);
    float s[1][NT][4];
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const unsigned step = unsigned(kk % 4) * 32;  // within the column block
      wgmma::mma_ss<T, kKeys>(reinterpret_cast<float(&)[NT * 4]>(s[0]),
                              wgmma::add_bytes(q_desc, unsigned(kk / 4) * kQBytes / (D / 64) + step),
                              wgmma::add_bytes(k_desc, unsigned(kk / 4) * kKvBytes / (D / 64) + step), kk > 0);
    }
    wgmma::commit();
    wgmma::wait<0>();
    const bool interior = j0 >= range.begin && j0 + kKeys <= p.Sk &&
                          core::tile_fully_visible(p, i0, min(i0 + kRows, p.Sq), j0, j0 + kKeys);
    softmax_tile(tile, j0, interior, s, m, l, o);
    // O += P V, 16 keys a step: P's accumulators for keys 16 kk .. 16 kk + 15 are the A fragment. All
    // of P is packed before the first product (registers a wgmma reads must be written before the fence).
    std::uint32_t pa[kKeys / 16][4];
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
#pragma unroll
      for (int x = 0; x < 4; ++x) pa[kk][x] = pack2<T>(s[0][2 * kk + x / 2][2 * (x % 2)], s[0][2 * kk + x / 2][2 * (x % 2) + 1]);
    }
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      wgmma::mma_rs_n_major<T, D>(reinterpret_cast<float(&)[DT * 4]>(o[0]), pa[kk],
                                  wgmma::add_bytes(v_desc, unsigned(kk) * 16 * kAtomRowBytes));
    }
    wgmma::commit();
    wgmma::wait<0>();
    __syncthreads();  // every warpgroup is done with this stage before it is refilled
  }
  store_rows<T>(tile, ov, lse, o, m, l);
#endif
}

template <typename T, int D>
void launch_dim(const ForwardCall& c, dim3 grid, cudaStream_t stream) {
  constexpr int smem = int(tile_bytes<D>(kRows) + 4 * tile_bytes<D>(kKeys) + kAtomBytes);
  static const bool configured = [] {
    FLASHTQ_CUDA_CHECK(cudaFuncSetAttribute(forward_wgmma_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)configured;
  forward_wgmma_kernel<T, D><<<grid, kThreads, smem, stream>>>(c.p, c.q, c.k, c.v, c.out, c.lse);
}

template <typename T>
bool launch_for(const ForwardCall& c) {
  const dim3 grid(unsigned((c.p.Sq + kRows - 1) / kRows), unsigned(c.p.B * c.p.H));
  auto stream = static_cast<cudaStream_t>(c.stream);
  switch (c.p.D) {
    case 64: launch_dim<T, 64>(c, grid, stream); break;
    case 128: launch_dim<T, 128>(c, grid, stream); break;
    default: return false;
  }
  FLASHTQ_CUDA_CHECK_LAUNCH("dense forward (wgmma)");
  return true;
}

// wgmma exists on sm_90 only (this file's sm_90a code); other GPUs take the mma.sync kernel.
bool device_is_hopper() {
  int device = 0, major = 0, minor = 0;
  FLASHTQ_CUDA_CHECK(cudaGetDevice(&device));
  FLASHTQ_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  FLASHTQ_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major == 9 && minor == 0;
}

}  // namespace

bool launch_dense_forward_wgmma(const ForwardCall& c) {
  if (c.p.D != 64 && c.p.D != 128) return false;
  if (!rows_aligned16(c.q) || !rows_aligned16(c.k) || !rows_aligned16(c.v)) return false;
  if (c.p.B * c.p.H > 65535 || !device_is_hopper()) return false;
  if (c.p.dtype == DType::f16) return launch_for<__half>(c);
  if (c.p.dtype == DType::bf16) return launch_for<__nv_bfloat16>(c);
  return false;
}

}  // namespace flashtq::cuda

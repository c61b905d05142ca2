// Dense forward on tensor cores (f16/bf16, head_dim 32/64/96/128), FlashAttention-2 style: a block of
// 8 warps owns 128 query rows (16 per warp, Q held as mma fragments); K and V tiles of 64 keys go
// through shared memory, double-buffered with cp.async so the next tile loads during this one's math.
// S = Q K^T and O += P V run on mma.sync m16n8k16 with f32 accumulators, P staying in registers
// between the two (its C fragments are the next product's A fragments); the softmax runs on exp2.
// Every feature of SPEC §1 (strides, GQA, causal offset, window, mask, dropout, LSE); tiles no row
// of the block can see are skipped, and per-element checks run only on boundary tiles. K's and V's
// B fragments come from their row-major tiles through ldmatrix (.trans for V), four 8x8 matrices a time.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/hash3.hpp"
#include "core/visibility.hpp"
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"

namespace flashtq::cuda {
namespace {

constexpr int kRows = 128, kKeys = 64, kThreads = 256;  // 8 warps x 16 rows share each K/V tile

template <typename T>
__device__ __forceinline__ void mma(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1);
template <>
__device__ __forceinline__ void mma<__half>(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma<__nv_bfloat16>(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                                   std::uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <typename T>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ std::uint32_t pack2<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}
template <>
__device__ __forceinline__ std::uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}

__device__ __forceinline__ std::uint32_t load_pair(const void* p) { return *static_cast<const std::uint32_t*>(p); }


template <typename T, int D>
__global__ void __launch_bounds__(kThreads) forward_mma_kernel(DenseProblem p, TensorView qv, TensorView kv, TensorView vv,
                                                               TensorView ov, float* lse) {
  // Two stages of K and V tiles (rows padded by 8 elements so rows fall 16 bytes apart in the banks):
  // the copy engine fills one stage (cp.async) while the warps compute on the other.
  extern __shared__ __align__(16) unsigned char smem_raw[];
  using Tile = T[kKeys][D + 8];
  Tile* k_stage = reinterpret_cast<Tile*>(smem_raw);
  Tile* v_stage = k_stage + 2;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, tig = lane % 4;
  const std::int64_t bh = blockIdx.y, b = bh / p.H, h = bh % p.H, hk = h / p.group();
  const std::int64_t i0 = std::int64_t(blockIdx.x) * kRows;
  const std::int64_t r0 = i0 + warp * 16 + g, r1 = r0 + 8;  // this lane's two rows
  constexpr int KS = D / 16;                               // k-steps of S = Q K^T
  // Q fragments (rows beyond Sq are zero).
  std::uint32_t qa[KS][4];
  {
    const T* q0 = static_cast<const T*>(qv.data) + row_offset(qv, b, r0 < p.Sq ? r0 : 0, h);
    const T* q1 = static_cast<const T*>(qv.data) + row_offset(qv, b, r1 < p.Sq ? r1 : 0, h);
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      const int d0 = 16 * ks + 2 * tig;
      qa[ks][0] = r0 < p.Sq ? load_pair(q0 + d0) : 0u;
      qa[ks][1] = r1 < p.Sq ? load_pair(q1 + d0) : 0u;
      qa[ks][2] = r0 < p.Sq ? load_pair(q0 + d0 + 8) : 0u;
      qa[ks][3] = r1 < p.Sq ? load_pair(q1 + d0 + 8) : 0u;
    }
  }
  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const core::KeyRange range = core::key_range(p, i0, min(i0 + kRows, p.Sq));
  const float keep_scale = p.dropout_p > 0.0f ? 1.0f / (1.0f - p.dropout_p) : 1.0f;
  const float scale_log2 = p.scale * 1.4426950408889634f;  // the softmax runs on exp2
  // Issues the asynchronous copy of the tile at j0 into `stage` (rows past Sk are zero-filled).
  auto issue = [&](std::int64_t j0, int stage) {
    for (int e = tid; e < kKeys * D / 8; e += kThreads) {
      const int key = e / (D / 8), d0 = (e % (D / 8)) * 8;
      const bool inside = j0 + key < p.Sk;
      const std::int64_t row = inside ? j0 + key : 0;
      const T* ksrc = static_cast<const T*>(kv.data) + row_offset(kv, b, row, hk) + d0;
      const T* vsrc = static_cast<const T*>(vv.data) + row_offset(vv, b, row, hk) + d0;
      const unsigned kdst = static_cast<unsigned>(__cvta_generic_to_shared(&k_stage[stage][key][d0]));
      const unsigned vdst = static_cast<unsigned>(__cvta_generic_to_shared(&v_stage[stage][key][d0]));
      const int bytes = inside ? 16 : 0;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(kdst), "l"(ksrc), "r"(bytes));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(vdst), "l"(vsrc), "r"(bytes));
    }
    asm volatile("cp.async.commit_group;\n" ::);
  };
  const std::int64_t first = range.begin / kKeys * kKeys;
  if (first < range.end) issue(first, 0);
  int stage = 0;
  for (std::int64_t j0 = first; j0 < range.end; j0 += kKeys, stage ^= 1) {
    if (j0 + kKeys < range.end) {
      issue(j0 + kKeys, stage ^ 1);
      asm volatile("cp.async.wait_group 1;\n" ::);
    } else {
      asm volatile("cp.async.wait_group 0;\n" ::);
    }
    __syncthreads();  // this stage's tile is visible to every warp
    const Tile& k_tile = k_stage[stage];
    const Tile& v_tile = v_stage[stage];
    // S = Q K^T for this warp's 16 rows x 64 keys (8 n-tiles). K's B fragments for two k-steps come
    // from one ldmatrix .x4: lanes 8 m .. 8 m + 7 address key rows of matrix m (dims 8 m .. 8 m + 7
    // of the pair), and lane (g, tig) receives keys g, dims 2 tig, 2 tig + 1 of each.
    float s[8][4] = {};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int ks = 0; ks < KS; ks += 2) {
        std::uint32_t b[4];
        const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(&k_tile[nt * 8 + lane % 8][16 * ks + 8 * (lane / 8)]));
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3]) : "r"(addr));
        mma<T>(s[nt], qa[ks], b[0], b[1]);
        mma<T>(s[nt], qa[ks + 1], b[2], b[3]);
      }
    }
    // Scale, visibility, mask; then the online softmax of rows r0 (c0, c1) and r1 (c2, c3).
    const bool interior = j0 >= range.begin && j0 + kKeys <= p.Sk &&
                          core::tile_fully_visible(p, i0, min(i0 + kRows, p.Sq), j0, j0 + kKeys);
    float tile_max[2] = {-INFINITY, -INFINITY};
    if (interior && p.mask == nullptr) {  // the common case: one multiply per score
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[nt][e] *= scale_log2;
          tile_max[e / 2] = fmaxf(tile_max[e / 2], s[nt][e]);
        }
      }
    } else {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const std::int64_t i = e < 2 ? r0 : r1, j = j0 + nt * 8 + 2 * tig + (e & 1);
          float v = s[nt][e] * p.scale;
          if (!interior && (i >= p.Sq || !core::key_visible(p, i, j))) v = -INFINITY;
          if (p.mask != nullptr && v != -INFINITY) {
            v += p.mask[b * p.mask_strides[0] + h * p.mask_strides[1] + i * p.mask_strides[2] + j * p.mask_strides[3]];
            if (v <= -1e30f) v = -INFINITY;
          }
          v *= 1.4426950408889634f;  // log2(e): the softmax below runs on exp2
          s[nt][e] = v;
          tile_max[e / 2] = fmaxf(tile_max[e / 2], v);
        }
      }
    }
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xFFFFFFFFu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xFFFFFFFFu, tile_max[r], 2));
      const float m_new = fmaxf(m[r], tile_max[r]);
      corr[r] = m_new == -INFINITY ? 1.0f : exp2_approx(m[r] - m_new);
      m[r] = m_new;
      l[r] *= corr[r];
    }
    if (__any_sync(0xFFFFFFFFu, corr[0] != 1.0f || corr[1] != 1.0f)) {  // the running maxima settle early
#pragma unroll
      for (int nt = 0; nt < D / 8; ++nt) {
        o[nt][0] *= corr[0], o[nt][1] *= corr[0], o[nt][2] *= corr[1], o[nt][3] *= corr[1];
      }
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float mr = m[e / 2];
        const float pr = s[nt][e] == -INFINITY ? 0.0f : exp2_approx(s[nt][e] - mr);
        l[e / 2] += pr;
        float w = pr;
        if (p.dropout_p > 0.0f && pr != 0.0f) {
          const std::int64_t i = e < 2 ? r0 : r1, j = j0 + nt * 8 + 2 * tig + (e & 1);
          w = core::dropout_keep(p.dropout_p, p.seed, std::uint32_t(b * p.H + h), std::uint32_t(i), std::uint32_t(j)) ? pr * keep_scale : 0.0f;
        }
        s[nt][e] = w;
      }
    }
    // O += P V: P's C fragments become A fragments (keys 16 kk .. 16 kk + 15).
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const std::uint32_t pa[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                                   pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int nt = 0; nt < D / 8; nt += 2) {
        // B fragments of V for two n-tiles straight from its row-major tile: ldmatrix .x4 .trans hands
        // lane (g, tig) the keys 2 tig, 2 tig + 1 (and + 8) of dim g; lanes 8 m .. 8 m + 7 address the
        // key rows of matrix m (keys + 8 for odd m, the second n-tile for m >= 2).
        std::uint32_t b[4];
        const unsigned addr = static_cast<unsigned>(
            __cvta_generic_to_shared(&v_tile[16 * kk + lane % 8 + 8 * ((lane / 8) & 1)][(nt + lane / 16) * 8]));
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3]) : "r"(addr));
        mma<T>(o[nt], pa, b[0], b[1]);
        mma<T>(o[nt + 1], pa, b[2], b[3]);
      }
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }
  // Normalise and store rows r0, r1; LSE.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xFFFFFFFFu, l[r], 1);
    l[r] += __shfl_xor_sync(0xFFFFFFFFu, l[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const std::int64_t i = r == 0 ? r0 : r1;
    if (i >= p.Sq) continue;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    T* out = static_cast<T*>(ov.data) + row_offset(ov, b, i, h);
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      const int d0 = nt * 8 + 2 * tig;
      out[d0] = from_float<T>(o[nt][2 * r] * inv);
      out[d0 + 1] = from_float<T>(o[nt][2 * r + 1] * inv);
    }
    if (lse != nullptr && tig == 0) {  // m is in log2 units
      lse[(b * p.H + h) * p.Sq + i] = l[r] > 0.0f ? m[r] * 0.6931471805599453f + logf(l[r]) : -INFINITY;
    }
  }
}

bool aligned16(const TensorView& t) {
  return reinterpret_cast<std::uintptr_t>(t.data) % 16 == 0 && t.strides[0] % 8 == 0 && t.strides[1] % 8 == 0 &&
         t.strides[2] % 8 == 0;
}

template <typename T, int D>
void launch_dim(const ForwardCall& c, dim3 grid, cudaStream_t stream) {
  constexpr int smem = 4 * kKeys * (D + 8) * int(sizeof(T));  // K and V, two stages each
  static const bool configured = [] {
    FLASHTQ_CUDA_CHECK(cudaFuncSetAttribute(forward_mma_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)configured;
  forward_mma_kernel<T, D><<<grid, kThreads, smem, stream>>>(c.p, c.q, c.k, c.v, c.out, c.lse);
}

template <typename T>
bool launch_for(const ForwardCall& c) {
  const dim3 grid(unsigned((c.p.Sq + kRows - 1) / kRows), unsigned(c.p.B * c.p.H));
  auto stream = static_cast<cudaStream_t>(c.stream);
  switch (c.p.D) {
    case 32: launch_dim<T, 32>(c, grid, stream); break;
    case 64: launch_dim<T, 64>(c, grid, stream); break;
    case 96: launch_dim<T, 96>(c, grid, stream); break;
    case 128: launch_dim<T, 128>(c, grid, stream); break;
    default: return false;
  }
  FLASHTQ_CUDA_CHECK_LAUNCH("dense forward (tensor cores)");
  return true;
}

}  // namespace

bool launch_dense_forward_mma(const ForwardCall& c) {
  if (!aligned16(c.q) || !aligned16(c.k) || !aligned16(c.v)) return false;
  if (c.p.B * c.p.H > 65535) return false;  // grid y; the warp-per-row kernel takes these
  if (c.p.dtype == DType::f16) return launch_for<__half>(c);
  if (c.p.dtype == DType::bf16) return launch_for<__nv_bfloat16>(c);
  return false;
}

}  // namespace flashtq::cuda

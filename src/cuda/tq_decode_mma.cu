// Tensor-core decode over the packed TurboQuant cache (head_dim 128, keys 2+1 bits, values 2 bits).
//
// A symmetric 2-bit codebook [-c1, -c0, c0, c1] is linear in the code's bits taken as signs: with
// L, H = +-1 for the low and high bit, c[idx] = (c1 - c0)/2 L + (c0 + c1)/2 H; the QJL sum is
// sum_d q_jl[d] (+-1) too. So a key's score and the value sum are products of +-1 matrices with real
// matrices, which the tensor cores compute exactly when the bits are fed as f16 +-2^-14 straight
// from the packed words (two instructions per register) and the real side is split into f16 hi + lo
// parts (about 22 significant bits). The +-1 form has no constant term to cancel. Per 16-token tile of a warp:
//   scores^T [16 tokens x (4 heads x hi/lo)] = signs [16 x 384] . q [384 x 8]   (24 mma.m16n8k16)
//   values   [128 dims x (4 heads x hi/lo)] += signs [128 x 32] . w [32 x 8]    (16 mma.m16n8k16)
// with an online softmax per head in between. Each block covers kMmaSplitTokens tokens of one
// (sequence, kv head, group of 4 query heads); its 4 warps combine in shared memory and write one
// partial for the merge kernel (LSE merge and the single inverse rotation).
#include <cuda_fp16.h>

#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/tq_attend.cuh"

namespace flashtq::cuda {
namespace {

constexpr int kD = 128;
constexpr int kWarps = 4;
constexpr int kWarpTokens = kMmaSplitTokens / kWarps;

__device__ __forceinline__ void mma16816(float (&d)[4], std::uint32_t a0, std::uint32_t a1, std::uint32_t a2,
                                         std::uint32_t a3, std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Bits p and p + 16 of a word as an f16 pair of +-2^-14 (set bit: +), given the word inverted and
// `magnitude` = 0x04000400 in a register: one shift and one LOP3 (with both constants immediate the
// compiler needs two LOP3s, since LOP3 takes a single immediate).
__device__ __forceinline__ std::uint32_t bit_pair(std::uint32_t inverted, int p, std::uint32_t magnitude) {
  std::uint32_t r;
  asm("lop3.b32 %0, %1, 0x80008000, %2, 0xEA;" : "=r"(r) : "r"(inverted << (15 - p)), "r"(magnitude));
  return r;
}

// The f16 hi part (part 0) or lo remainder (part 1) of x.
__device__ __forceinline__ float split_part(float x, int part) {
  const float hi = __half2float(__float2half_rn(x));
  return part ? x - hi : hi;
}

__device__ __forceinline__ std::uint32_t pack(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&h);
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, 4));
  x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, 8));
  return fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, 16));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xFFFFFFFFu, x, 4);
  x += __shfl_xor_sync(0xFFFFFFFFu, x, 8);
  return x + __shfl_xor_sync(0xFFFFFFFFu, x, 16);
}

__global__ void __launch_bounds__(32 * kWarps) mma_decode_kernel(AttendParams a) {
  __shared__ float q_rot[4][kD], q_jl[4][kD];
  __shared__ float q_scale[4], jl_scale[4];
  __shared__ float w_tile[kWarps][16][4];
  __shared__ float part_m[kWarps][4], part_l[kWarps][4];
  __shared__ float part_acc[kWarps][4][kD];
  __shared__ uint2 b_frag[24][32];

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int row = lane / 4, tig = lane % 4;  // mma fragment coordinates
  const int split = blockIdx.x;
  const std::int64_t kvh = blockIdx.y / a.n_tiles, j = a.first_row + blockIdx.z;  // row b * n_queries + j of the batch
  const std::uint32_t* keys = keys_of(a, j);
  const std::uint32_t* values = values_of(a, j);
  const std::int64_t h0 = kvh * (a.H / a.l.n_kv_heads) + (blockIdx.y % a.n_tiles) * 4;
  const std::int64_t seq = seq_len_of(a, j);
  const std::int64_t t_begin = std::int64_t(split) * kMmaSplitTokens;
  float* ws = a.ws + ((j * a.H + h0) * a.n_splits + split) * (kD + 2);
  const std::int64_t ws_head = std::int64_t(a.n_splits) * (kD + 2);
  if (t_begin >= seq) {
    if (tid < 4) {
      ws[tid * ws_head] = -INFINITY;
      ws[tid * ws_head + 1] = 0.0f;
    }
    return;
  }
  const float kc0 = a.key_centroids[2], kc1 = a.key_centroids[3];
  const float vc0 = a.value_centroids[2], vc1 = a.value_centroids[3];
  const std::int64_t region = a.q_cap * a.H * kD;
  for (int i = tid; i < 4 * kD; i += 32 * kWarps) {
    const std::int64_t at = (j * a.H + h0 + i / kD) * kD + i % kD;
    q_rot[i / kD][i % kD] = a.scratch[at];
    q_jl[i / kD][i % kD] = a.scratch[region + at];
  }
  __syncthreads();
  {  // warp w: the per-head constants of head w (power-of-two scales keep the f16 parts normal)
    float mx = 0.0f, mj = 0.0f;
    for (int d = lane; d < kD; d += 32) {
      mx = fmaxf(mx, fabsf(q_rot[warp][d]));
      mj = fmaxf(mj, fabsf(q_jl[warp][d]));
    }
    mx = warp_max(mx) * (kc0 + kc1);
    mj = warp_max(mj);
    if (lane == 0) {
      int e;
      frexpf(mx, &e);
      q_scale[warp] = ldexpf(1.0f, 15 - e);
      frexpf(mj, &e);
      jl_scale[warp] = ldexpf(1.0f, 15 - e);
    }
  }
  __syncthreads();

  // B fragments of the scores, built once per block into shared memory (every warp uses the same):
  // column n = lane / 4 is (head n / 2, part n % 2). Kept out of registers for occupancy.
  if (warp == 0) {
    const int head = row >> 1, part = row & 1;
    const float qs = q_scale[head], js = jl_scale[head];
#pragma unroll
    for (int s = 0; s < 16; ++s) {
      const int d0 = 16 * (2 * tig + s / 8) + s % 8;  // lane's words 2 tig, 2 tig + 1; elements s%8, s%8 + 8
      const float x0 = q_rot[head][d0] * qs, x1 = q_rot[head][d0 + 8] * qs;
      const float lo = 0.5f * (kc1 - kc0), hi = 0.5f * (kc0 + kc1);
      b_frag[s][lane] = make_uint2(pack(split_part(x0 * lo, part), split_part(x1 * lo, part)),   // low bits
                                   pack(split_part(x0 * hi, part), split_part(x1 * hi, part)));  // high bits
    }
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      const int d0 = 32 * tig + s;  // lane's jl word tig: bits s, s+16 and s+8, s+24
      b_frag[16 + s][lane] = make_uint2(pack(split_part(q_jl[head][d0] * js, part), split_part(q_jl[head][d0 + 16] * js, part)),
                                        pack(split_part(q_jl[head][d0 + 8] * js, part), split_part(q_jl[head][d0 + 24] * js, part)));
    }
  }
  __syncthreads();
  const float unscale_polar = 16384.0f / q_scale[tig], unscale_jl = 16384.0f / jl_scale[tig];

  const TqLayout& l = a.l;
  const std::int64_t slot0 = kvh * l.capacity;
  const std::int64_t w_begin = t_begin + warp * kWarpTokens;
  const std::int64_t w_end = min(w_begin + kWarpTokens, seq);
  float m = -INFINITY, lsum = 0.0f;
  // 2^-14 as an f16 pair, kept in a register (the zero term is opaque to the compiler, so it cannot
  // fold the constant back into an immediate).
  const std::uint32_t mag = 0x04000400u | (std::uint32_t(a.l.key_bits) >> 8);
  float acc[8][4] = {};
  // The words one tile needs, loaded a tile ahead so that memory latency hides behind the math.
  struct TileWords {
    std::uint32_t pa0, pa1, pb0, pb1;  // polar words 2 tig, 2 tig + 1 of tokens row, row + 8 (inverted)
    std::uint32_t ja, jb;              // QJL word tig of the same tokens (inverted)
    std::uint32_t na, nb, vna, vnb;    // key and value norm words
    std::uint32_t va[2], vb[2];        // value word `row` of tokens 8 ks + tig, 8 ks + tig + 4 (inverted)
  };
  // Word indices fit in 32 bits (the validator caps a cache below 2^32 words).
  const std::uint32_t jl_off = std::uint32_t(l.key_jl_offset()), k_norm_off = std::uint32_t(l.key_norm_offset());
  const std::uint32_t v_norm_off = std::uint32_t(l.value_norm_offset());
  const std::uint32_t slot_base = std::uint32_t(slot0), last = std::uint32_t(w_end - 1);
  auto load_tile = [&](std::int64_t t0_64) {
    const std::uint32_t t0 = std::uint32_t(t0_64);
    TileWords w;
    const std::uint32_t sa = slot_base + min(t0 + row, last), sb = slot_base + min(t0 + row + 8, last);
    w.pa0 = ~keys[sa * 8 + 2 * tig];
    w.pa1 = ~keys[sa * 8 + 2 * tig + 1];
    w.pb0 = ~keys[sb * 8 + 2 * tig];
    w.pb1 = ~keys[sb * 8 + 2 * tig + 1];
    w.ja = ~keys[jl_off + sa * 4 + tig];
    w.jb = ~keys[jl_off + sb * 4 + tig];
    w.na = keys[k_norm_off + sa];
    w.nb = keys[k_norm_off + sb];
    w.vna = values[v_norm_off + sa];
    w.vnb = values[v_norm_off + sb];
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      w.va[ks] = ~values[(slot_base + min(t0 + 8 * ks + tig, last)) * 8 + row];
      w.vb[ks] = ~values[(slot_base + min(t0 + 8 * ks + tig + 4, last)) * 8 + row];
    }
    return w;
  };
  // The weights w = p * |v| feed the tensor cores as f16 hi + lo parts: scale them by a power of two
  // so that the largest is near 2^14 and the lo parts stay normal (tiny value norms would otherwise
  // leave them subnormal, with too few bits).
  float v_max = 0.0f;
  for (std::int64_t t = w_begin + lane; t < w_end; t += 32) v_max = fmaxf(v_max, fabsf(f16_low(values[v_norm_off + slot_base + std::uint32_t(t)])));
  v_max = warp_max(v_max) * (vc0 + vc1);
  int w_exp;
  frexpf(v_max, &w_exp);
  const float w_scale = v_max > 0.0f ? ldexpf(1.0f, 14 - w_exp) : 1.0f;
  TileWords next = load_tile(w_begin < w_end ? w_begin : 0);
  for (std::int64_t t0 = w_begin; t0 < w_end; t0 += 16) {
    const TileWords cur = next;
    if (t0 + 16 < w_end) next = load_tile(t0 + 16);
    // ---- scores of tokens t0 + row (fragment rows 0..7) and t0 + row + 8, head tig ----
    // Two accumulators per product halve the dependent chain of mma instructions.
    float P[2][4] = {}, J[2][4] = {};
#pragma unroll
    for (int s = 0; s < 16; ++s) {
      const std::uint32_t wa = s < 8 ? cur.pa0 : cur.pa1, wb = s < 8 ? cur.pb0 : cur.pb1;
      const int e = 2 * (s % 8);
      const uint2 bf = b_frag[s][lane];
      mma16816(P[s % 2], bit_pair(wa, e, mag), bit_pair(wb, e, mag), bit_pair(wa, e + 1, mag), bit_pair(wb, e + 1, mag), bf.x, bf.y);
    }
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      const uint2 bf = b_frag[16 + s][lane];
      mma16816(J[s % 2], bit_pair(cur.ja, s, mag), bit_pair(cur.jb, s, mag), bit_pair(cur.ja, s + 8, mag), bit_pair(cur.jb, s + 8, mag), bf.x, bf.y);
    }
    const float qjl = a.qjl_scale;
    const float polar_a = P[0][0] + P[0][1] + P[1][0] + P[1][1], polar_b = P[0][2] + P[0][3] + P[1][2] + P[1][3];
    const float jl_a = J[0][0] + J[0][1] + J[1][0] + J[1][1], jl_b = J[0][2] + J[0][3] + J[1][2] + J[1][3];
    float score_a = a.scale * f16_low(cur.na) * (polar_a * unscale_polar + f16_low(cur.na >> 16) * qjl * jl_a * unscale_jl);
    float score_b = a.scale * f16_low(cur.nb) * (polar_b * unscale_polar + f16_low(cur.nb >> 16) * qjl * jl_b * unscale_jl);
    if (t0 + row >= w_end) score_a = -INFINITY;
    if (t0 + row + 8 >= w_end) score_b = -INFINITY;
    // ---- online softmax of head tig ----
    const float m_new = fmaxf(m, quad_max(fmaxf(score_a, score_b)));
    const float corr = expf(m - m_new);
    const float p_a = expf(score_a - m_new), p_b = expf(score_b - m_new);
    m = m_new;
    lsum = lsum * corr + p_a + p_b;
    const float w_a = p_a * f16_low(cur.vna), w_b = p_b * f16_low(cur.vnb);
    if (corr != 1.0f) {  // the running maximum settles early: most tiles skip the rescale
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[i][c] *= corr;
    }
    w_tile[warp][row][tig] = w_a;
    w_tile[warp][row + 8][tig] = w_b;
    __syncwarp();
    // ---- values: dims 16 row + {2i, 2i+1} of tokens t0 + 8 ks + {tig, tig + 4} ----
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      const std::uint32_t va = cur.va[ks], vb = cur.vb[ks];
      const std::uint32_t lo_half = (va & 0xFFFFu) | (vb << 16), hi_half = (va >> 16) | (vb & 0xFFFF0000u);
      const int head = row >> 1, part = row & 1;
      const float x0 = w_tile[warp][8 * ks + tig][head] * w_scale, x1 = w_tile[warp][8 * ks + tig + 4][head] * w_scale;
      const float lo = 0.5f * (vc1 - vc0), hi = 0.5f * (vc0 + vc1);
      const std::uint32_t b0 = pack(split_part(x0 * lo, part), split_part(x1 * lo, part));
      const std::uint32_t b1 = pack(split_part(x0 * hi, part), split_part(x1 * hi, part));
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const std::uint32_t src = i < 4 ? lo_half : hi_half;
        const int q = 4 * (i % 4);
        mma16816(acc[i], bit_pair(src, q, mag), bit_pair(src, q + 2, mag), bit_pair(src, q + 1, mag), bit_pair(src, q + 3, mag), b0, b1);
      }
    }
    __syncwarp();
  }
  lsum = quad_sum(lsum);
  if (row == 0) {
    part_m[warp][tig] = m;
    part_l[warp][tig] = lsum;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    part_acc[warp][tig][16 * row + 2 * i] = 16384.0f / w_scale * (acc[i][0] + acc[i][1]);
    part_acc[warp][tig][16 * row + 2 * i + 1] = 16384.0f / w_scale * (acc[i][2] + acc[i][3]);
  }
  __syncthreads();
  // Combine the 4 warps: thread tid owns dim tid of every head.
  for (int h = 0; h < 4; ++h) {
    float M = -INFINITY;
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, part_m[w][h]);
    float L = 0.0f, x = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      if (part_l[w][h] == 0.0f) continue;
      const float f = expf(part_m[w][h] - M);
      L = fmaf(part_l[w][h], f, L);
      x = fmaf(part_acc[w][h][tid], f, x);
    }
    float* out = ws + h * ws_head;
    out[2 + tid] = x;
    if (tid == 0) {
      out[0] = M;
      out[1] = L;
    }
  }
}

}  // namespace

bool mma_decode_supported(const TqAttendArgs& c) {
  return c.layout.head_dim == kD && c.layout.key_bits == 2 && c.layout.value_bits == 2 &&
         (c.n_heads / c.layout.n_kv_heads) % 4 == 0;
}

bool mma_decode_supported(const AttendParams& a) {
  return a.l.head_dim == kD && a.l.key_bits == 2 && a.l.value_bits == 2 && (a.H / a.l.n_kv_heads) % 4 == 0;
}

void launch_mma_decode(const AttendParams& a, dim3 grid, cudaStream_t stream) {
  mma_decode_kernel<<<grid, 32 * kWarps, 0, stream>>>(a);
}

}  // namespace flashtq::cuda

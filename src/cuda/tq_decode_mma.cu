// Tensor-core decode over the packed TurboQuant cache (head_dim 128, keys 2+1 bits, values 2 bits), in two
// variants: the exact one (TqAttendKernel::decode_mma, described here) and a bf16-class one
// (decode_mma_bf16, kBf16, described after it).
//
// Keys (integer tensor cores). A 2-bit code's centroid is affine in its two bits: for the symmetric
// codebook [-c1, -c0, c0, c1], c[lo + 2 hi] = -c1 + (c1 - c0) lo + (c0 + c1) hi with lo, hi in {0, 1};
// the QJL sum is sum_d q_jl[d] (2 b_d - 1). So a key's score is an integer product of its stored bits
// with fixed-point queries plus per-head constants. The queries become 31-bit fixed point per head,
// split into four signed 8-bit limbs (rows of the A operand: limb x head); the bits go in as the B
// operand of mma.m16n8k32.s8.u8 straight from the packed word with ONE AND per register: thread tig
// keeps bits tig + 8i (scaled 2^tig in their byte) and tig + 4 + 8i (scaled 2^(tig + 4)), and the
// query element of that k is pre-divided by the same power of two. Integer accumulation is exact; the
// only rounding is the queries' fixed point (about 2^-24 of the head's largest element).
//   scores [4 limbs x 4 heads][8 tokens] = q_fix [16 x 32] . bits [32 x 8], one k-step per cache word
//
// Values (bf16 tensor cores): the bits fed as bf16 +-1 (two instructions per register) against the
// weights split into bf16 hi + lo parts (bf16's exponent range needs no scaling of the weights):
//   values [128 dims x (4 heads x hi/lo)] += signs [128 x 32] . w [32 x 8]    (16 mma.m16n8k16)
// with an online softmax per head in between (in base 2). Each block covers a.split_tokens tokens of
// one (sequence, kv head, group of 4 query heads); its 4 warps combine in shared memory and write one
// partial for the merge kernel (LSE merge and the single inverse rotation). The queries' fixed-point
// A fragments depend only on (query row, head group): the prepare kernel (tq_key_fragments.cu) builds
// them once per decode step instead of once per block.
//
// The bf16-class variant (SPEC §3's TurboQuant bound allows 16-bit operands) turns the key product around:
// the bits are the A operand of mma.m16n8k32.u8.s8 (rows: the tile's 16 tokens), the queries the B operand
// in 15-bit fixed point, two limbs per head (columns: head x limb). One mma per cache word covers the whole
// tile (12 per tile, not 24), each thread ends up with head tig's scores of tokens row and row + 8 with no
// shuffle between limbs, and its softmax state is the head its value accumulators hold. A k-step takes two cache
// words, both in their lower nibbles or both in their upper ones (one AND per register either way), the upper
// nibbles' products in accumulators of their own, divided by 16 at the end: so no query element is pre-divided
// by more than 2^3 and loses more than 3 of its bits. Its values go to integer tensor cores as well (bf16_values:
// each value bit a u8 operand, one AND per register after a byte gather; the weights in 15-bit fixed point per
// tile and head), 8 mma per tile instead of 16 and a quarter of the instructions that made the bf16 signs.
#include <cuda_fp16.h>

#include "cuda/common.cuh"
#include "cuda/mma.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/launch.hpp"
#include "cuda/tq_attend.cuh"
#include "cuda/tq_key_fragments.cuh"

namespace flashtq::cuda {
namespace {

// The packed words stream through once: their copies ask L2 for whole 128-byte lines (docs/benchmarks.md).
constexpr bool kWholeLines = true;

constexpr int kWarps = 4;

// D[16x8] += A[16x32] (s8, row-major) . B[32x8] (u8, column-major), exact in 32-bit integers.
__device__ __forceinline__ void imma16832(int (&d)[4], const uint4& a, std::uint32_t b0, std::uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
               : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}
// The same with the operands' types swapped: A (u8) the cache's bits, B (s8) the queries or weights.
__device__ __forceinline__ void imma16832_bits_a(int (&d)[4], const uint4& a, const uint2& b) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
               : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b.x), "r"(b.y));
}
// D = A . B from zero (no accumulator registers to clear first).
__device__ __forceinline__ void imma16832_bits_a_from_zero(int (&d)[4], const uint4& a, const uint2& b) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b.x), "r"(b.y), "r"(0));
}

// A value in 15-bit fixed point as two balanced signed 8-bit digits (bytes 0 and 1).
__device__ __forceinline__ std::uint32_t two_digits(float x) {
  return (std::uint32_t(__float2int_rn(x)) + 0x8080u) ^ 0x8080u;
}

// Bits p and p + 16 of a word as a bf16 pair of +-1 (set bit: +), given the word inverted and
// `magnitude` = 0x3F803F80 in a register: one shift and one LOP3 (with both constants immediate the
// compiler needs two LOP3s, since LOP3 takes a single immediate).
__device__ __forceinline__ std::uint32_t bit_pair(std::uint32_t inverted, int p, std::uint32_t magnitude) {
  std::uint32_t r;
  asm("lop3.b32 %0, %1, 0x80008000, %2, 0xEA;" : "=r"(r) : "r"(inverted << (15 - p)), "r"(magnitude));
  return r;
}

// The bf16 hi part (part 0) or lo remainder (part 1) of x: hi + lo carries 16 significant bits.
__device__ __forceinline__ float split_part(float x, int part) {
  const float hi = __bfloat162float(__float2bfloat16_rn(x));
  return part ? x - hi : hi;
}

// One 16-token tile of the cache, staged in shared memory.
struct TileStage {
  uint4 key[16][3];  // token i: code words 0-3, 4-7, QJL words 0-3
  std::uint32_t value[16][8];
  std::uint32_t key_norm[16], value_norm[16];
};

// kCapped: scores go through the softcap (a.softcap > 0), a template argument to keep the common loop free of it;
// kPaged: the caches are a pool read through a page table (a.l.paged()), likewise; kBf16: the bf16-class
// key product (TqAttendKernel::decode_mma_bf16).
template <bool kCapped, bool kPaged, bool kBf16>
__global__ void __launch_bounds__(32 * kWarps, 4) mma_decode_kernel(AttendParams a) {
  using Fragments = KeyFragmentsFor<kBf16 ? 2 : 4>;
  __shared__ Fragments frag;
  __shared__ float w_tile[kWarps][16][4];
  __shared__ float w_scale[kWarps][4];  // bf16-class values: the tile's fixed-point scale per head
  __shared__ float part_m[kWarps][4], part_l[kWarps][4];
  __shared__ float part_acc[kWarps][4][kD];
  __shared__ TileStage stages[kWarps][2];

  allow_next_grid();  // the merge kernel's blocks wait for this grid to finish
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int row = lane / 4, tig = lane % 4;  // mma fragment coordinates
  const int split = blockIdx.x;
  const std::int64_t kvh = blockIdx.y / a.n_tiles, j = a.first_row + blockIdx.z;  // row b * n_queries + j of the batch
  const std::uint32_t* keys = keys_of(a, j);
  const std::uint32_t* values = values_of(a, j);
  const TqSequence sq = sequence_of(a, j);
  const std::int64_t h0 = kvh * (a.H / a.l.n_kv_heads) + (blockIdx.y % a.n_tiles) * 4;
  // Token positions fit in 32 bits (the validator caps a cache below 2^32 words).
  const int seq = int(seq_len_of(a, j));
  const int t_begin = split * a.split_tokens;
  float* ws = a.ws + ((j * a.H + h0) * a.n_splits + split) * partial_stride(kD);
  const std::int64_t ws_head = std::int64_t(a.n_splits) * partial_stride(kD);
  if (t_begin >= seq) {
    if (tid < 4) {
      ws[tid * ws_head] = -INFINITY;
      ws[tid * ws_head + 1] = 0.0f;
    }
    return;
  }
  const float vc0 = a.value_centroids[2], vc1 = a.value_centroids[3];
  // bf16-class values: the lo plane's coefficient, half the hi plane's (its bit sits one place higher), the larger.
  const float value_lo_coef = vc1 - vc0, value_hi_coef_half = 0.5f * (vc0 + vc1);
  const float value_coef_max = fmaxf(fabsf(value_lo_coef), fabsf(value_hi_coef_half));

  const TqLayout& l = a.l;
  const std::int64_t slot0 = kvh * l.capacity;
  const int warp_tokens = a.split_tokens / kWarps;
  const int w_begin = t_begin + warp * warp_tokens;
  const int w_end = min(w_begin + warp_tokens, seq);
  // The head whose scores this thread holds (after the limb combination, in the exact variant).
  const int head = kBf16 ? tig : row & 3;
  float m = -INFINITY, lsum = 0.0f;
  // +-1 as a bf16 pair, kept in a register (the zero term is opaque to the compiler, so it cannot
  // fold the constant back into an immediate).
  const std::uint32_t mag = 0x3F803F80u | (std::uint32_t(a.l.key_bits) >> 8);
  const std::uint32_t keep_lo = 0x01010101u << tig, keep_hi = 0x10101010u << tig;  // this thread's bits of a word
  float acc[8][4] = {};  // exact variant; the bf16-class one keeps vacc (and wsum) instead
  float vacc[8][2] = {}, wsum = 0.0f;
  // The words of one tile that a thread uses.
  struct TileWords {
    uint4 code[2][2];                  // code words 0-3, 4-7 of tokens row (n-tile 0) and row + 8 (n-tile 1)
    uint4 jl[2];                       // their QJL words
    std::uint32_t kn[2][2], vn[2][2];  // key and value norm words of tokens 8 nt + 2 tig + x (bf16: 8 nt + row)
    std::uint32_t va[2], vb[2];        // value word `row` of tokens 8 ks + tig, 8 ks + tig + 4 (exact: inverted)
  };
  const std::uint32_t jl_off = std::uint32_t(l.key_jl_offset()), k_norm_off = std::uint32_t(l.key_norm_offset());
  const std::uint32_t v_norm_off = std::uint32_t(l.value_norm_offset());
  const std::uint32_t slot_base = std::uint32_t(slot0), last = std::uint32_t(w_end - 1);
  // Each warp stages its tiles' words in shared memory with asynchronous copies, one tile ahead:
  // no registers hold the next tile. 16-byte copies where sequence b's caches start on a 16-byte
  // boundary (a layout whose words per sequence are not a multiple of 4 leaves odd sequences
  // misaligned: 4-byte copies there).
  const bool k_aligned = (reinterpret_cast<std::uintptr_t>(keys) & 15u) == 0;
  const bool v_aligned = (reinterpret_cast<std::uintptr_t>(values) & 15u) == 0;
  auto copy16 = [](void* dst, const std::uint32_t* src, bool aligned) {
    if (aligned) {
      cp_async16<kWholeLines>(dst, src);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) cp_async4(static_cast<std::uint32_t*>(dst) + i, src + i);
    }
  };
  // Full tiles with 16-byte aligned caches copy from fixed per-lane sources that advance by one tile
  // of words each time; other tiles (the partial last one, misaligned caches) take the general path.
  const std::uint32_t first = slot_base + std::uint32_t(w_begin);
  const int ka = lane / 3, pa = lane % 3, kb = (lane + 32) / 3, pb = (lane + 32) % 3;  // key chunks lane, lane + 32
  const std::uint32_t* key_src_a = pa < 2 ? keys + (first + ka) * 8 + 4 * pa : keys + jl_off + (first + ka) * 4;
  const std::uint32_t* key_src_b = pb < 2 ? keys + (first + kb) * 8 + 4 * pb : keys + jl_off + (first + kb) * 4;
  const std::uint32_t* value_src = values + (first + lane / 2) * 8 + 4 * (lane % 2);
  const std::uint32_t* norm_src =
      lane < 16 ? keys + k_norm_off + first + lane : values + v_norm_off + first + lane - 16;
  const std::uint32_t key_step_a = pa < 2 ? 128 : 64, key_step_b = pb < 2 ? 128 : 64;  // words per 16 tokens
  // A pool's tile (16 timesteps, within one page) is 16 consecutive slots of the page's: its distance from
  // where the warp's timesteps would be in a contiguous image, in tokens.
  PageWalk walk{sq, w_end};
  auto fill = [&](int t0, TileStage& st) {
    const std::int64_t moved = kPaged ? walk.moved_at(t0) : 0;  // in tokens, either way
    if (t0 + 16 <= w_end && k_aligned && v_aligned) {
      const std::uint32_t tile = std::uint32_t(t0 - w_begin) / 16;
      cp_async16<kWholeLines>(&st.key[ka][pa], key_src_a + tile * key_step_a + moved * std::int64_t(key_step_a / 16));
      if (lane < 16)
        cp_async16<kWholeLines>(&st.key[kb][pb], key_src_b + tile * key_step_b + moved * std::int64_t(key_step_b / 16));
      cp_async16<kWholeLines>(&st.value[lane / 2][4 * (lane % 2)], value_src + tile * 128 + moved * 8);
      cp_async4(lane < 16 ? &st.key_norm[lane] : &st.value_norm[lane - 16], norm_src + tile * 16 + moved);
      cp_async_commit();
      return;
    }
    auto slot_of = [&](int i) {
      return slot_base + std::uint32_t(min(std::uint32_t(t0 + i), last) + moved);
    };  // the partial last tile repeats `last`
    for (int c = lane; c < 48; c += 32) {
      const int i = c / 3, part = c % 3;
      const std::uint32_t slot = slot_of(i);
      copy16(&st.key[i][part], part < 2 ? keys + slot * 8 + 4 * part : keys + jl_off + slot * 4, k_aligned);
    }
    copy16(&st.value[lane / 2][4 * (lane % 2)], values + slot_of(lane / 2) * 8 + 4 * (lane % 2), v_aligned);
    if (lane < 16) {
      cp_async4(&st.key_norm[lane], keys + k_norm_off + slot_of(lane));
    } else {
      cp_async4(&st.value_norm[lane - 16], values + v_norm_off + slot_of(lane - 16));
    }
    cp_async_commit();
  };
  auto read_stage = [&](const TileStage& st) {
    TileWords w;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      w.code[nt][0] = st.key[8 * nt + row][0];
      w.code[nt][1] = st.key[8 * nt + row][1];
      w.jl[nt] = st.key[8 * nt + row][2];
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const int token = kBf16 ? 8 * nt + row : 8 * nt + 2 * tig + x;
        w.kn[nt][x] = st.key_norm[token];
        w.vn[nt][x] = st.value_norm[token];
      }
    }
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      w.va[ks] = kBf16 ? st.value[8 * ks + tig][row] : ~st.value[8 * ks + tig][row];
      w.vb[ks] = kBf16 ? st.value[8 * ks + tig + 4][row] : ~st.value[8 * ks + tig + 4][row];
    }
    return w;
  };
  // Limb rows: this thread's C rows are limbs row / 4 and 2 + row / 4; the partner lane (lane ^ 16)
  // holds the other two.
  const float limb_weight = row < 4 ? 1.0f : 256.0f;
  const float score_scale = a.scale * kLog2e;                               // base-2 scores
  float k_unscale = 0.0f, k_offset = 0.0f, j_unscale = 0.0f, j_sum = 0.0f;  // read once the fragments have landed
  // The bf16-class key product and softmax of one tile (kBf16): the weights of head tig's tokens row and
  // row + 8 into w_tile; returns the correction of the thread's value accumulators (head tig's).
  auto bf16_keys_softmax = [&](const TileWords& cur, int t0) {
    // ---- integer key products: tokens t0 + row + 8 half are the rows, (head, limb) the columns ----
    // k-step m: words 2 (m / 2) and 2 (m / 2) + 1 of a key, lower nibbles (m even) or upper ones (m odd).
    int P[2][4] = {}, J[2][4] = {};  // [nibble]
    auto word_of = [&](int nt, int w) {
      const uint4 q4 = w < 8 ? cur.code[nt][w / 4] : cur.jl[nt];
      return w % 4 == 0 ? q4.x : w % 4 == 1 ? q4.y : w % 4 == 2 ? q4.z : q4.w;
    };
#pragma unroll
    for (int step = 0; step < kKeySteps; ++step) {
      const uint2 bf = reinterpret_cast<const KeyFragmentsBf16&>(frag).b[step][lane];
      const int w = 2 * (step / 2);
      const std::uint32_t keep = step % 2 ? keep_hi : keep_lo;
      const uint4 bits =
          make_uint4(word_of(0, w) & keep, word_of(1, w) & keep, word_of(0, w + 1) & keep, word_of(1, w + 1) & keep);
      imma16832_bits_a(step < 8 ? P[step % 2] : J[step % 2], bits, bf);
    }
    // ---- base-2 scores of head tig, tokens t0 + row + 8 half ----
    const float qjl = a.qjl_scale;
    float score[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      // An upper nibble's products are 16 times its elements' (each a multiple of 16: the shift is exact).
      auto limbs = [&](const int(&x)[2][4]) {
        return float(x[0][2 * half] + (x[1][2 * half] >> 4)) +
               256.0f * float(x[0][2 * half + 1] + (x[1][2 * half + 1] >> 4));
      };
      const float p = limbs(P), q = limbs(J);
      const float polar = fmaf(p, k_unscale, k_offset), jl = fmaf(q, j_unscale, -j_sum);
      const std::uint32_t nw = cur.kn[half][0];
      const float s = score_scale * f16_low(nw) * fmaf(f16_low(nw >> 16) * qjl, jl, polar);
      score[half] = t0 + row + 8 * half >= w_end ? -INFINITY : kCapped ? capped_score(s, a.softcap * kLog2e) : s;
    }
    // ---- online softmax of head tig over the tile: its 16 tokens are on the 8 lanes of this tig ----
    const float m_new = fmaxf(m, column_max(fmaxf(score[0], score[1])));
    const float corr = exp2_approx(m - m_new);
    lsum *= corr;
    wsum *= corr;
    m = m_new;
    float wmax = 0.0f;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float p = exp2_approx(score[half] - m_new);
      const float w = p * f16_low(cur.vn[half][0]);
      lsum += p;
      wsum += w;
      wmax = fmaxf(wmax, fabsf(w));
      w_tile[warp][row + 8 * half][tig] = w;
    }
    // The tile's fixed point for head tig's weights: the largest weight times the larger value coefficient just
    // under 2^14 (a power of two; bounded so that it and its inverse stay normal floats).
    wmax = column_max(wmax);
    const int e = max(-100, min(100, ((__float_as_int(wmax * value_coef_max) >> 23) & 0xFF) - 126));
    if (row == 0) w_scale[warp][tig] = __int_as_float((127 + 14 - e) << 23);
    return corr;
  };
  // The bf16-class values of one tile, on integer tensor cores: out[dim][head] += sum_k bits[dim][k] . w[k][head]
  // with k = (plane, token): the A operand (u8) holds for each of its dims the bit of one plane of 4 tokens
  // (tokens tig + 4 i of the tile, gathered a byte per token by PRMT, then one AND per register: the bit stays in
  // place, 2^(its position)); the B operand (s8) the weights in 15-bit fixed point per tile and head (w_scale),
  // two limbs, columns (head, limb). A code's centroid is -c1 + (c1 - c0) lo + (c0 + c1) hi: the bit products
  // carry the two coefficients (the hi plane's halved, its bit sitting one place higher), the constant -c1 sum(w)
  // is added at the end. Row g of m-tile i is dim 16 g + 2 i, its plane-0 bit at 4 (i % 2) of byte i / 2; row
  // g + 8 is dim 16 g + 2 i + 1, two places higher: vacc[i][r] is in units of 2^(4 (i % 2) + 2 r).
  auto bf16_values = [&](const TileWords& cur) {
    const std::uint32_t w0 = cur.va[0], w1 = cur.vb[0], w2 = cur.va[1], w3 = cur.vb[1];  // tokens tig + 4 i
    const std::uint32_t r[4] = {byte_of_each(w0, w1, w2, w3, 0), byte_of_each(w0, w1, w2, w3, 1),
                                byte_of_each(w0, w1, w2, w3, 2), byte_of_each(w0, w1, w2, w3, 3)};
    const int bhead = row >> 1, limb = row & 1;  // this thread's B column
    const float scale = w_scale[warp][bhead], unscale = 1.0f / w_scale[warp][tig];
    std::uint32_t lo_digits[4], hi_digits[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float w = w_tile[warp][tig + 4 * i][bhead] * scale;
      lo_digits[i] = two_digits(w * value_lo_coef);
      hi_digits[i] = two_digits(w * value_hi_coef_half);
    }
    const uint2 b = make_uint2(byte_of_each(lo_digits[0], lo_digits[1], lo_digits[2], lo_digits[3], limb),
                               byte_of_each(hi_digits[0], hi_digits[1], hi_digits[2], hi_digits[3], limb));
    const std::uint32_t one = 0x01010101u;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const std::uint32_t src = r[i / 2];
      const int base = 4 * (i % 2);
      int c[4];
      imma16832_bits_a_from_zero(c,
                                 make_uint4(src & (one << base), src & (one << (base + 2)), src & (one << (base + 1)),
                                            src & (one << (base + 3))),
                                 b);
      vacc[i][0] = fmaf(float(c[0] + 256 * c[1]), unscale, vacc[i][0]);
      vacc[i][1] = fmaf(float(c[2] + 256 * c[3]), unscale, vacc[i][1]);
    }
  };
  // The exact key product and softmax of one tile: the weights of head `head`'s tokens 8 nt + 2 tig + x into
  // w_tile; returns the correction of the thread's value accumulators (head tig's: lane 4 tig's).
  auto exact_keys_softmax = [&](const TileWords& cur, int t0) {
    // ---- integer key products: tokens t0 + 8 nt + row are the columns ----
    // Separate accumulators for even and odd code words shorten the dependent mma chains.
    int P2[2][2][4] = {}, J[2][4] = {};
#pragma unroll
    for (int step = 0; step < kKeySteps; ++step) {
      const uint4 af = reinterpret_cast<const KeyFragments&>(frag).a[step][lane];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const uint4 q4 = step < 8 ? cur.code[nt][step / 4] : cur.jl[nt];
        const std::uint32_t word = (step % 4 == 0) ? q4.x : (step % 4 == 1) ? q4.y : (step % 4 == 2) ? q4.z : q4.w;
        imma16832(step < 8 ? P2[nt][step % 2] : J[nt], af, word & keep_lo, word & keep_hi);
      }
    }
    int P[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) P[nt][c] = P2[nt][0][c] + P2[nt][1][c];
    // ---- base-2 scores of head `head`, tokens t0 + 8 nt + 2 tig + x ----
    const float qjl = a.qjl_scale;
    float score[2][2];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        float p = (float(P[nt][x]) + 65536.0f * float(P[nt][x + 2])) * limb_weight;
        float q = (float(J[nt][x]) + 65536.0f * float(J[nt][x + 2])) * limb_weight;
        p += __shfl_xor_sync(0xFFFFFFFFu, p, 16);
        q += __shfl_xor_sync(0xFFFFFFFFu, q, 16);
        const float polar = fmaf(p, k_unscale, k_offset), jl = fmaf(q, j_unscale, -j_sum);
        const std::uint32_t nw = cur.kn[nt][x];
        const float s = score_scale * f16_low(nw) * fmaf(f16_low(nw >> 16) * qjl, jl, polar);
        score[nt][x] = t0 + 8 * nt + 2 * tig + x >= w_end ? -INFINITY
                       : kCapped                          ? capped_score(s, a.softcap * kLog2e)
                                                          : s;
      }
    }
    // ---- online softmax of head `head` over the tile ----
    const float m_new = fmaxf(m, group_max(fmaxf(fmaxf(score[0][0], score[0][1]), fmaxf(score[1][0], score[1][1]))));
    const float corr = exp2_approx(m - m_new);
    lsum *= corr;
    m = m_new;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const float p = exp2_approx(score[nt][x] - m_new);
        lsum += p;
        if (row < 4) w_tile[warp][8 * nt + 2 * tig + x][head] = p * f16_low(cur.vn[nt][x]);
      }
    }
    return __shfl_sync(0xFFFFFFFFu, corr, 4 * tig);
  };
  auto process_tile = [&](const TileWords& cur, int t0) {
    float corr_v;
    if constexpr (kBf16) {
      corr_v = bf16_keys_softmax(cur, t0);
    } else {
      corr_v = exact_keys_softmax(cur, t0);
    }
    if (corr_v != 1.0f) {  // the running maximum settles early: most tiles skip the rescale
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[i][c] *= corr_v;
#pragma unroll
      for (int i = 0; i < 8; ++i) vacc[i][0] *= corr_v, vacc[i][1] *= corr_v;
    }
    __syncwarp();
    if constexpr (kBf16) {
      bf16_values(cur);
      __syncwarp();
      return;
    }
    // ---- values: dims 16 row + {2i, 2i+1} of tokens t0 + 8 ks + {tig, tig + 4} ----
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      const std::uint32_t va = cur.va[ks], vb = cur.vb[ks];
      const std::uint32_t lo_half = (va & 0xFFFFu) | (vb << 16), hi_half = (va >> 16) | (vb & 0xFFFF0000u);
      const int vhead = row >> 1, part = row & 1;
      const float x0 = w_tile[warp][8 * ks + tig][vhead], x1 = w_tile[warp][8 * ks + tig + 4][vhead];
      const float lo = 0.5f * (vc1 - vc0), hi = 0.5f * (vc0 + vc1);
      const std::uint32_t b0 = bf16_pair(split_part(x0 * lo, part), split_part(x1 * lo, part));
      const std::uint32_t b1 = bf16_pair(split_part(x0 * hi, part), split_part(x1 * hi, part));
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const std::uint32_t src = i < 4 ? lo_half : hi_half;
        const int q = 4 * (i % 4);
        mma_16816<__nv_bfloat16>(acc[i], bit_pair(src, q, mag), bit_pair(src, q + 2, mag), bit_pair(src, q + 1, mag),
                                 bit_pair(src, q + 3, mag), b0, b1);
      }
    }
    __syncwarp();
  };
  // Started early (dependent launch): the first tile of the cache is staged before the prepare kernel
  // has finished; its fragments are read only after it has.
  int buf = 0;
  if (w_begin < w_end) fill(w_begin, stages[warp][0]);
  wait_for_previous_grid();
  {  // this (row, head group)'s key fragments, from the prepare kernel
    const uint4* src = reinterpret_cast<const uint4*>(static_cast<const char*>(a.key_fragments) +
                                                      std::size_t(j * (a.H / 4) + h0 / 4) * kKeyFragmentBytes);
    for (int i = tid; i < int(sizeof(Fragments) / 16); i += 32 * kWarps)
      cp_async16<kWholeLines>(reinterpret_cast<uint4*>(&frag) + i, src + i);
    cp_async_commit();
  }
  cp_async_wait<0>();  // the first tile and the key fragments
  __syncthreads();
  k_unscale = frag.key_unscale[head];
  k_offset = frag.key_offset[head];
  j_unscale = frag.jl_unscale[head];
  j_sum = frag.jl_sum[head];
  for (int t0 = w_begin; t0 < w_end; t0 += 16, buf ^= 1) {
    if (t0 + 16 < w_end) {
      fill(t0 + 16, stages[warp][buf ^ 1]);
    } else {
      cp_async_commit();  // an empty group keeps the count: the wait below is always for this tile
    }
    cp_async_wait<1>();
    __syncwarp();
    process_tile(read_stage(stages[warp][buf]), t0);
    __syncwarp();  // every lane has read this stage before it is refilled
  }
  lsum = kBf16 ? column_sum(lsum) : group_sum(lsum);  // bf16-class: head tig's sum over the 8 lanes of its tokens
  if (kBf16 ? row == 0 : row < 4 && tig == 0) {
    part_m[warp][head] = m;
    part_l[warp][head] = lsum;
  }
  if constexpr (kBf16) {  // back from the rows' units; plus -c1 sum(w) of head tig
    wsum = column_sum(wsum);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float unit = i % 2 ? 1.0f / 16.0f : 1.0f;
      part_acc[warp][tig][16 * row + 2 * i] = fmaf(vacc[i][0], unit, -vc1 * wsum);
      part_acc[warp][tig][16 * row + 2 * i + 1] = fmaf(vacc[i][1], unit * 0.25f, -vc1 * wsum);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      part_acc[warp][tig][16 * row + 2 * i] = acc[i][0] + acc[i][1];
      part_acc[warp][tig][16 * row + 2 * i + 1] = acc[i][2] + acc[i][3];
    }
  }
  __syncthreads();
  // Combine the 4 warps: thread tid owns dim tid of every head. The maxima are base 2; the merge
  // kernel takes natural-log maxima.
  for (int h = 0; h < 4; ++h) {
    float M = -INFINITY;
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, part_m[w][h]);
    float L = 0.0f, x = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      if (part_l[w][h] == 0.0f) continue;
      const float f = exp2_approx(part_m[w][h] - M);
      L = fmaf(part_l[w][h], f, L);
      x = fmaf(part_acc[w][h][tid], f, x);
    }
    float* out = ws + h * ws_head;
    out[kPartialHeader + tid] = x;
    if (tid == 0) {
      out[0] = M * kLn2;
      out[1] = L;
    }
  }
}

}  // namespace

static_assert(kD == tiles::kTqDecodeMmaDim, "kernel_choice.hpp's table names this kernel's head_dim");

namespace {
template <bool kBf16>
void launch_mma_decode_for(const AttendParams& a, dim3 grid, cudaStream_t stream) {
  const char* what = "TurboQuant decode kernel";
  const dim3 block(32 * kWarps);
  if (a.l.paged()) {
    if (a.softcap > 0.0f) return launch_dependent(mma_decode_kernel<true, true, kBf16>, grid, block, stream, what, a);
    return launch_dependent(mma_decode_kernel<false, true, kBf16>, grid, block, stream, what, a);
  }
  if (a.softcap > 0.0f) return launch_dependent(mma_decode_kernel<true, false, kBf16>, grid, block, stream, what, a);
  launch_dependent(mma_decode_kernel<false, false, kBf16>, grid, block, stream, what, a);
}
}  // namespace

void launch_mma_decode(const AttendParams& a, bool bf16, dim3 grid, cudaStream_t stream) {
  if (bf16) return launch_mma_decode_for<true>(a, grid, stream);
  launch_mma_decode_for<false>(a, grid, stream);
}

}  // namespace flashtq::cuda

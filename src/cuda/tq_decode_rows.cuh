// Turning one timestep of the packed TurboQuant cache back into rotated-space rows (the chunked prefill's
// bf16 rows, tq_prefill.cu): what the oracle scores and sums (core/tq_rows.cpp),
// a group of L lanes (a warp or half of one) per timestep, its lane l holding coordinates [l E, l E + E). Keys: the
// exact row where there is one, else per part the norm half times the centroids, plus, with QJL, n γ qjl_scale
// diag(s_jl) H sgn / sqrt(D) (so that <q_rot, k> carries the sketch's term <q_jl, sgn>), plus the block's mean; values
// likewise without the sketch. The cache is read through the read-only path (__ldg): attention never writes it.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/common.cuh"
#include "flashtq/problem.hpp"

namespace flashtq::cuda {

// A layout's codebooks, passed by value to a kernel, which copies them to shared memory.
struct RowCodebooks {
  float key[16], value[16], outlier[16];
};

__device__ __forceinline__ float half_at(std::uint32_t word, int which) {
  return __half2float(__ushort_as_half(std::uint16_t(word >> (16 * which))));
}
__device__ __forceinline__ float bf16_at(std::uint32_t word, int which) {
  return __uint_as_float(which ? word & 0xFFFF0000u : word << 16);
}

// Where a lane's E coordinates sit in a slot's code bits: they lie in one part (parts are powers of two of at
// least 16, starting on multiples of 16), so one window of at most 32 bits holds their codes. Fixed by the
// layout: worked out once per thread, not per timestep.
struct LaneCodes {
  int bit;   // the first code's bit in the slot's stream
  int bits;  // per code
  int part;  // keys with outlier channels: the part (its norm half, part 0's codebook)
};

template <int E>
__device__ __forceinline__ LaneCodes lane_codes(const TqLayout& l, bool keys, int lane) {
  const int i = lane * E;
  if (!keys) return {i * l.value_bits, l.value_bits, 0};
  if (!l.key_outliers) return {i * l.key_bits, l.key_bits, 0};
  const int parts = l.key_parts();
  for (int p = 0; p < parts; ++p) {
    const TqLayout::KeyPart kp = l.key_part(p);
    if (i >= kp.offset && i < kp.offset + kp.size) return {kp.bit_offset + (i - kp.offset) * kp.bits, kp.bits, p};
  }
  return {0, 0, 0};  // not reached: the parts cover [0, D)
}

// Where a timestep's block means start (TqLayout::key_mean, value_mean) with the per-layout parts worked out once,
// in 32 bits: timesteps are below capacity, and a packed image holds fewer than 2^32 words (core/validate.cpp), so
// 64-bit divisions and products per row are not needed. A block is a power of two of timesteps (TqLayout), so a
// timestep's block is a shift, not a division.
struct MeanBlocks {
  std::uint32_t key_offset = 0, value_offset = 0, key_blocks = 0, value_blocks = 0;
  int key_shift = 0, value_shift = 0;
  __device__ explicit MeanBlocks(const TqLayout& l) {
    if (l.key_block)
      key_offset = std::uint32_t(l.key_mean_offset()), key_blocks = std::uint32_t(l.mean_blocks(l.key_block)),
      key_shift = __ffs(l.key_block) - 1;
    if (l.value_block)
      value_offset = std::uint32_t(l.value_mean_offset()), value_blocks = std::uint32_t(l.mean_blocks(l.value_block)),
      value_shift = __ffs(l.value_block) - 1;
  }
  __device__ std::uint32_t key(std::uint32_t h, std::uint32_t t, std::uint32_t half_dim) const {
    return key_offset + (h * key_blocks + (t >> key_shift)) * half_dim;
  }
  __device__ std::uint32_t value(std::uint32_t h, std::uint32_t t, std::uint32_t half_dim) const {
    return value_offset + (h * value_blocks + (t >> value_shift)) * half_dim;
  }
};

// The word counts and offsets a coded row reads (TqLayout's), worked out once per thread and in 32 bits (as above):
// recomputed by the layout's methods they were a chain of 64-bit products in every row.
struct RowWords {
  std::uint32_t capacity, key_code, jl_at, key_norm_at, key_norm, value_code, value_norm_at;
  __device__ explicit RowWords(const TqLayout& l)
      : capacity(std::uint32_t(l.capacity)),
        key_code(std::uint32_t(l.key_code_words())),
        jl_at(std::uint32_t(l.key_jl_offset())),
        key_norm_at(std::uint32_t(l.key_norm_offset())),
        key_norm(std::uint32_t(l.key_norm_words())),
        value_code(std::uint32_t(l.value_code_words())),
        value_norm_at(std::uint32_t(l.value_norm_offset())) {}
};

// The lane's E codes from a slot's code words (`words` of them): one or two loads, then shifts.
template <int E>
__device__ __forceinline__ void read_codes(const std::uint32_t* codes, std::uint32_t words, const LaneCodes& at,
                                           std::uint32_t (&out)[E]) {
  const int w = at.bit / 32, shift = at.bit % 32;
  std::uint64_t window = __ldg(codes + w);
  if (shift + E * at.bits > 32) window |= std::uint64_t(__ldg(codes + (w + 1 < words ? w + 1 : w))) << 32;
  window >>= shift;
  const std::uint32_t mask = (1u << at.bits) - 1u;
#pragma unroll
  for (int e = 0; e < E; ++e) out[e] = std::uint32_t(window >> (e * at.bits)) & mask;
}

// Key coordinates [lane * E, lane * E + E) of a coded timestep (slot, and t: its timestep in the image), in
// q_rot's space; `lanes` is the mask of the row's L lanes.
template <int E, int L>
__device__ __forceinline__ void decode_key(const TqLayout& l, const RowWords& rw, const MeanBlocks& means,
                                           float qjl_scale, const std::uint32_t* jl_signs, const std::uint32_t* keys,
                                           std::uint32_t slot, std::uint32_t kvh, std::uint32_t t, const LaneCodes& at,
                                           const float* cent, int lane, unsigned lanes, float (&k)[E]) {
  constexpr int D = L * E;
  std::uint32_t code[E];
  read_codes<E>(keys + slot * rw.key_code, rw.key_code, at, code);
  const std::uint32_t* norm = keys + (rw.key_norm_at + slot * rw.key_norm);
  const float n = half_at(__ldg(norm + at.part / 2), at.part % 2);  // the part's norm half (the one norm without parts)
#pragma unroll
  for (int e = 0; e < E; ++e) k[e] = n * cent[code[e]];
  if (l.qjl) {  // the sketch's signs brought back to q_rot's space: diag(s_jl) H sgn / sqrt(D)
    const std::uint32_t jl = __ldg(keys + (rw.jl_at + slot * (D / 32) + lane * E / 32)) >> (lane * E % 32);
    float s[E];
#pragma unroll
    for (int e = 0; e < E; ++e) s[e] = ((jl >> e) & 1u) ? 1.0f : -1.0f;
    warp_fwht<float, E, L>(s, lane, lanes);
    const float f = n * half_at(__ldg(norm), 1) * qjl_scale * rsqrtf(float(D));
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int d = lane * E + e;
      const float sign = ((jl_signs[d / 32] >> (d % 32)) & 1u) ? -f : f;
      k[e] = fmaf(sign, s[e], k[e]);
    }
  }
  if (l.key_block) {
    const std::uint32_t* mean = keys + means.key(kvh, t, D / 2);
#pragma unroll
    for (int e = 0; e < E; ++e) k[e] += half_at(__ldg(mean + (lane * E + e) / 2), (lane * E + e) % 2);
  }
}

// Timestep t of one sequence's caches (slot kvh * capacity + sq.timestep(t)), keys and values, for a sequence
// that ends at `end` (its exact recent window): k and v hold the lane's coordinates. `key_at`, `value_at` and
// `key_cent` come from lane_codes (once per thread); kc, vc the codebooks in shared memory; L lanes a row, `lanes`
// their mask.
template <int E, int L>
__device__ __forceinline__ void decode_timestep(const TqLayout& l, const RowWords& rw, const MeanBlocks& means,
                                                float qjl_scale, const std::uint32_t* jl_signs,
                                                const std::uint32_t* keys, const std::uint32_t* values,
                                                const TqSequence& sq, std::int64_t kvh, std::int64_t t,
                                                std::int64_t end, const LaneCodes& key_at, const LaneCodes& value_at,
                                                const float* key_cent, const float* vc, int lane, unsigned lanes,
                                                float (&k)[E], float (&v)[E]) {
  constexpr int D = L * E;
  const std::uint32_t at_t = std::uint32_t(sq.timestep(t)), slot = std::uint32_t(kvh) * rw.capacity + at_t;
  const std::int64_t er = l.exact_row(t, end);
  if (er >= 0) {  // a sink or recent timestep: its exact rotated rows
    const std::int64_t at = l.exact_row_at(sq.exact_set, kvh, er);
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int d = lane * E + e;
      k[e] = bf16_at(__ldg(keys + l.key_exact_offset() + at + d / 2), d % 2);
      v[e] = bf16_at(__ldg(values + l.value_exact_offset() + at + d / 2), d % 2);
    }
    return;
  }
  decode_key<E, L>(l, rw, means, qjl_scale, jl_signs, keys, slot, std::uint32_t(kvh), at_t, key_at, key_cent, lane,
                   lanes, k);
  std::uint32_t code[E];
  read_codes<E>(values + slot * rw.value_code, rw.value_code, value_at, code);
  const float vn = half_at(__ldg(values + (rw.value_norm_at + slot)), 0);
#pragma unroll
  for (int e = 0; e < E; ++e) v[e] = vn * vc[code[e]];
  if (l.value_block) {
    const std::uint32_t* mean = values + means.value(std::uint32_t(kvh), at_t, D / 2);
#pragma unroll
    for (int e = 0; e < E; ++e) v[e] += half_at(__ldg(mean + (lane * E + e) / 2), (lane * E + e) % 2);
  }
}

}  // namespace flashtq::cuda

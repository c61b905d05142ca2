// One TurboQuant row per thread in the oracle's arithmetic (core/tq_rows.cpp): double, every product, sum and
// quotient rounded as the host rounds it (no fused multiply-adds), so codes, norms, exact rows and means match
// the oracle's bits. For the kernels whose rows do not map onto the warp butterflies (outlier parts, block means).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/packing.hpp"
#include "core/tq_outliers.hpp"
#include "cuda/common.cuh"
#include "flashtq/problem.hpp"

namespace flashtq::cuda {

constexpr int kRowMaxDim = 256;

template <typename T>
__device__ double element(const TensorView& x, std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d) {
  return double(to_float(static_cast<const T*>(x.data)[row_offset(x, b, t, h) + d]));
}

__device__ inline double length(const double* x, std::int32_t n) {
  double s = 0;
  for (std::int32_t i = 0; i < n; ++i) s = __dadd_rn(s, __dmul_rn(x[i], x[i]));
  return sqrt(s);
}

// core::rht over coordinates [first, first + n) of the signs: the signs, the butterflies, 1 / sqrt(n).
__device__ inline void part_rht(double* x, std::int32_t n, const std::uint32_t* signs, std::int32_t first) {
  for (std::int32_t d = 0; d < n; ++d)
    if ((signs[(first + d) / 32] >> ((first + d) % 32)) & 1u) x[d] = -x[d];
  for (std::int32_t len = 1; len < n; len <<= 1)
    for (std::int32_t i = 0; i < n; i += 2 * len)
      for (std::int32_t j = i; j < i + len; ++j) {
        const double a = x[j], b = x[j + len];
        x[j] = __dadd_rn(a, b);
        x[j + len] = __dsub_rn(a, b);
      }
  const double inv = 1.0 / sqrt(double(n));
  for (std::int32_t d = 0; d < n; ++d) x[d] = __dmul_rn(x[d], inv);
}

// Part p's codes and stored norm, from unit(k): coordinate k of the part's unit vector (rotated), and n, the part's
// length. Codes of each coordinate times sqrt(size / D) (the codebook is for D coordinates), then the norm the oracle
// stores: n over the decoded vector's length with norm correction, n / sqrt(size / D) without.
template <typename Unit>
__device__ void code_part(const TqCodebook& cb, const TqLayout::KeyPart& kp, std::int32_t D, bool norm_correction,
                          int p, double n, Unit unit, std::uint32_t* codes, std::uint32_t* norms) {
  const double spread = sqrt(double(kp.size) / double(D));
  double decoded2 = 0;
  for (std::int32_t k = 0; k < kp.size; ++k) {
    const double y = __dmul_rn(unit(k), spread);
    int idx = 0;
    for (int b = 0; b < cb.levels - 1; ++b) idx += y >= cb.boundaries[b] ? 1 : 0;
    core::put_bits(codes, kp.bit_offset + std::int64_t(k) * kp.bits, kp.bits, std::uint32_t(idx));
    decoded2 = __dadd_rn(decoded2, __dmul_rn(cb.centroids[idx], cb.centroids[idx]));
  }
  const double stored = norm_correction ? __ddiv_rn(n, sqrt(decoded2)) : __ddiv_rn(n, spread);
  norms[p / 2] |= std::uint32_t(__half_as_ushort(__float2half_rn(float(stored)))) << (16 * (p % 2));
}

__device__ inline double bf16_round(double x) { return double(__bfloat162float(__float2bfloat16_rn(float(x)))); }

// Row (t, h) of x as its exact row holds it (core::encode_row's rotated row times the norm, in bf16): n * RHT(x / n),
// for keys with outlier channels the permuted row with each part rotated. Zeros for a zero row.
template <typename T>
__device__ void exact_row_of(const TqTables& tables, const TensorView& x, std::int64_t t, std::int64_t h, bool keys,
                             const std::uint32_t* cache, double* out) {
  const TqLayout& l = tables.layout;
  const std::int32_t D = std::int32_t(l.head_dim);
  double r[kRowMaxDim];
  for (std::int32_t d = 0; d < D; ++d) r[d] = element<T>(x, 0, t, h, d);
  const double norm = length(r, D);
  for (std::int32_t d = 0; d < D; ++d) out[d] = 0.0;
  if (norm < 1e-12) return;
  if (!(keys && l.key_outliers)) {
    for (std::int32_t d = 0; d < D; ++d) r[d] = __ddiv_rn(r[d], norm);
    part_rht(r, D, tables.polar_sign_bits.data(), 0);
    for (std::int32_t d = 0; d < D; ++d) out[d] = bf16_round(__dmul_rn(norm, r[d]));
    return;
  }
  double part[kRowMaxDim];
  std::int32_t order[kRowMaxDim];
  core::key_channel_order(l, core::key_outlier_mask(l, cache, h), order);
  for (int p = 0; p < l.key_parts(); ++p) {
    const TqLayout::KeyPart kp = l.key_part(p);
    for (std::int32_t i = 0; i < kp.size; ++i) part[i] = r[order[kp.offset + i]];
    const double n = length(part, kp.size);
    if (n < 1e-12) continue;
    for (std::int32_t i = 0; i < kp.size; ++i) part[i] = __ddiv_rn(part[i], n);
    part_rht(part, kp.size, tables.polar_sign_bits.data(), kp.offset);
    const double share = __ddiv_rn(n, norm);
    for (std::int32_t i = 0; i < kp.size; ++i)
      out[kp.offset + i] = bf16_round(__dmul_rn(norm, __dmul_rn(part[i], share)));
  }
}

}  // namespace flashtq::cuda

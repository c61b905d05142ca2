// The oracle's arithmetic in double on the device, straight from the caller's views (docs/spec.md
// §3; core/dense_row.hpp on the host), for the elements the f32 dense kernels cannot finish: a row
// whose score passed f32's range, and an output or dq element that a NaN or infinity of a key the
// row does not see reached through a zero weight of a tensor-core product. dense_repair.cu finds
// them after each call; the generic kernel of dense.cu calls these itself.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/hash3.hpp"
#include "core/softcap.hpp"
#include "core/visibility.hpp"
#include "cuda/common.cuh"
#include "flashtq/problem.hpp"

namespace flashtq::cuda::repair {

template <typename T>
__device__ __forceinline__ double element(const TensorView& t, std::int64_t b, std::int64_t s, std::int64_t h,
                                          std::int64_t d) {
  return double(to_float(static_cast<const T*>(t.data)[row_offset(t, b, s, h) + d]));
}

template <typename T>
__device__ double dot(const TensorView& x, std::int64_t bx, std::int64_t sx, std::int64_t hx, const TensorView& y,
                      std::int64_t by, std::int64_t sy, std::int64_t hy, std::int64_t D) {
  double acc = 0;
  for (std::int64_t d = 0; d < D; ++d) acc += element<T>(x, bx, sx, hx, d) * element<T>(y, by, sy, hy, d);
  return acc;
}

// Where key j of sequence b lies in k and v: row j of batch b, or with pages (the table not null) row j % page_size
// of its page, the entry clamped into the pool as the decode kernel clamps it.
struct KeyAt {
  std::int64_t b, j;
};
__device__ __forceinline__ KeyAt key_at(const PagedTable& pages, std::int64_t b, std::int64_t j) {
  if (pages.page_table == nullptr) return {b, j};
  const std::int64_t page = pages.page_table[b * pages.max_pages + j / pages.page_size];
  return {page < 0 ? 0 : page >= pages.num_pages ? pages.num_pages - 1 : page, j % pages.page_size};
}

// Score of (b, h, i, j) in double, -inf when invisible or masked (a -inf mask entry masks whatever
// the key holds).
template <typename T>
__device__ double score(const DenseProblem& p, const TensorView& q, const TensorView& k, std::int64_t b, std::int64_t h,
                        std::int64_t i, std::int64_t j, const PagedTable& pages = {}) {
  if (!core::key_visible(p, i, j)) return -INFINITY;
  double mask = 0;
  if (p.mask != nullptr) {
    mask =
        double(p.mask[b * p.mask_strides[0] + h * p.mask_strides[1] + i * p.mask_strides[2] + j * p.mask_strides[3]]);
    if (mask == -INFINITY) return -INFINITY;
  }
  const KeyAt at = key_at(pages, b, j);
  const double s = core::softcapped(p, double(p.scale) * dot<T>(q, b, i, h, k, at.b, at.j, h / p.group(), p.D)) + mask;
  return s <= -1e30 ? -INFINITY : s;
}

// The softcap's slope 1 - tanh^2 at (b, h, i, j)'s scaled product (docs/spec.md §1.8), 1 without a cap.
template <typename T>
__device__ double cap_slope(const DenseProblem& p, const TensorView& q, const TensorView& k, std::int64_t b,
                            std::int64_t h, std::int64_t i, std::int64_t j) {
  if (!(p.softcap > 0.0f)) return 1.0;
  return core::softcap_slope(p, double(p.scale) * dot<T>(q, b, i, h, k, b, j, h / p.group(), p.D));
}

// keep / (1 - p) of weight (b, h, i, j), in f32 for the kernels and in double for the repairs.
template <typename Real = double>
__device__ __forceinline__ Real dropout_factor(const DenseProblem& p, std::int64_t b, std::int64_t h, std::int64_t i,
                                               std::int64_t j) {
  if (p.dropout_p <= 0.0f) return Real(1);
  const bool keep = core::dropout_keep(p.dropout_p, p.seed, p.dropout_bh(b, h), std::uint32_t(i), std::uint32_t(j));
  return keep ? Real(1) / (Real(1) - Real(p.dropout_p)) : Real(0);
}

// Row (b, h, i)'s maximum m and sum l = sum exp(s - m), head h's sink logit among them (docs/spec.md
// §1.9); m = -inf when it sees nothing and has no sink.
struct RowStats {
  double m = -INFINITY, l = 0;
  __device__ double lse() const { return m == -INFINITY ? -INFINITY : m + ::log(l); }
};
template <typename T>
__device__ __noinline__ RowStats row_stats(const DenseProblem& p, const TensorView& q, const TensorView& k,
                                           std::int64_t b, std::int64_t h, std::int64_t i,
                                           const PagedTable& pages = {}) {
  const double sink = p.sinks != nullptr ? double(p.sinks[h]) : -INFINITY;
  RowStats r;
  r.m = sink;
  for (std::int64_t j = 0; j < p.Sk; ++j) r.m = fmax(r.m, score<T>(p, q, k, b, h, i, j, pages));
  if (r.m == -INFINITY) return r;
  r.l = ::exp(sink - r.m);
  for (std::int64_t j = 0; j < p.Sk; ++j) r.l += ::exp(score<T>(p, q, k, b, h, i, j, pages) - r.m);
  return r;
}

// Output element (b, i, h, d) of the forward; keys of weight 0 are never read.
template <typename T>
__device__ __noinline__ float output(const DenseProblem& p, const TensorView& q, const TensorView& k,
                                     const TensorView& v, const RowStats& r, std::int64_t b, std::int64_t h,
                                     std::int64_t i, std::int64_t d, const PagedTable& pages = {}) {
  if (r.m == -INFINITY) return 0.0f;
  double o = 0;
  for (std::int64_t j = 0; j < p.Sk; ++j) {
    const double w = ::exp(score<T>(p, q, k, b, h, i, j, pages) - r.m) / r.l * dropout_factor(p, b, h, i, j);
    const KeyAt at = key_at(pages, b, j);
    if (w != 0.0) o += w * element<T>(v, at.b, at.j, h / p.group(), d);
  }
  return float(o);
}

// dq element (b, i, h, d) of the backward: sum_j dS_ij k_j[d], dS = P (dP - D_i) scale with
// P = min(1, exp(s - lse)) (docs/spec.md §3); a zero dS adds nothing.
template <typename T>
__device__ __noinline__ float dq(const BackwardCall& c, std::int64_t b, std::int64_t h, std::int64_t i,
                                 std::int64_t d) {
  const DenseProblem& p = c.p;
  const double lse = c.lse[p.lse_at(b, h, i)];
  if (lse == -INFINITY) return 0.0f;
  const double delta = dot<T>(c.dout, b, i, h, c.out, b, i, h, p.D);
  double acc = 0;
  for (std::int64_t j = 0; j < p.Sk; ++j) {
    const double s = score<T>(p, c.q, c.k, b, h, i, j);
    if (s == -INFINITY) continue;
    double prob = ::exp(s - lse);
    if (prob > 1.0) prob = 1.0;  // (a NaN stays NaN)
    const double z = dropout_factor(p, b, h, i, j);
    const double ds = prob * (dot<T>(c.dout, b, i, h, c.v, b, j, h / p.group(), p.D) * z - delta) * double(p.scale) *
                      cap_slope<T>(p, c.q, c.k, b, h, i, j);
    if (ds != 0.0) acc += ds * element<T>(c.k, b, j, h / p.group(), d);
  }
  return float(acc);
}

}  // namespace flashtq::cuda::repair

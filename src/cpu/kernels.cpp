// Highway kernels, compiled once per SIMD target and dispatched at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/kernels.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/cache_control.h"
#include "hwy/contrib/math/math-inl.h"

#include "core/half.hpp"
#include "cpu/kernels.hpp"

#include <algorithm>
#include <limits>

HWY_BEFORE_NAMESPACE();
namespace flashtq::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// R rows of C, two vectors wide: the register tile (R x 2N accumulators) of the GEMM.
template <size_t R>
HWY_INLINE void tile_2v(const float* A, size_t lda, const float* B, size_t ldb, float* C, size_t ldc, size_t K,
                        bool accumulate) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  hn::Vec<decltype(d)> acc0[R], acc1[R];
  for (size_t r = 0; r < R; ++r) {
    acc0[r] = accumulate ? hn::LoadU(d, C + r * ldc) : hn::Zero(d);
    acc1[r] = accumulate ? hn::LoadU(d, C + r * ldc + N) : hn::Zero(d);
  }
  for (size_t k = 0; k < K; ++k) {
    const auto b0 = hn::LoadU(d, B + k * ldb), b1 = hn::LoadU(d, B + k * ldb + N);
    for (size_t r = 0; r < R; ++r) {
      const auto a = hn::Set(d, A[r * lda + k]);
      acc0[r] = hn::MulAdd(a, b0, acc0[r]);
      acc1[r] = hn::MulAdd(a, b1, acc1[r]);
    }
  }
  for (size_t r = 0; r < R; ++r) {
    hn::StoreU(acc0[r], d, C + r * ldc);
    hn::StoreU(acc1[r], d, C + r * ldc + N);
  }
}

template <size_t R>
HWY_INLINE void rows(const float* A, size_t lda, const float* B, size_t ldb, float* C, size_t ldc, size_t N_cols,
                     size_t K, bool accumulate) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  size_t c = 0;
  for (; c + 2 * N <= N_cols; c += 2 * N) tile_2v<R>(A, lda, B + c, ldb, C + c, ldc, K, accumulate);
  for (; c < N_cols; ++c) {  // columns past the last full tile
    for (size_t r = 0; r < R; ++r) {
      float s = accumulate ? C[r * ldc + c] : 0.0f;
      for (size_t k = 0; k < K; ++k) s += A[r * lda + k] * B[k * ldb + c];
      C[r * ldc + c] = s;
    }
  }
}

void Gemm(const float* A, size_t lda, const float* B, size_t ldb, float* C, size_t ldc, size_t M, size_t N_cols,
          size_t K, bool accumulate) {
  size_t m = 0;
  for (; m + 6 <= M; m += 6) rows<6>(A + m * lda, lda, B, ldb, C + m * ldc, ldc, N_cols, K, accumulate);
  switch (M - m) {
    case 5: rows<5>(A + m * lda, lda, B, ldb, C + m * ldc, ldc, N_cols, K, accumulate); break;
    case 4: rows<4>(A + m * lda, lda, B, ldb, C + m * ldc, ldc, N_cols, K, accumulate); break;
    case 3: rows<3>(A + m * lda, lda, B, ldb, C + m * ldc, ldc, N_cols, K, accumulate); break;
    case 2: rows<2>(A + m * lda, lda, B, ldb, C + m * ldc, ldc, N_cols, K, accumulate); break;
    case 1: rows<1>(A + m * lda, lda, B, ldb, C + m * ldc, ldc, N_cols, K, accumulate); break;
    default: break;
  }
}

// f16 -> f32 for N lanes. Highway's emulated conversion (targets without F16C: SSSE3, scalar) treats
// exponent 31 as a normal number, so infinities and NaNs are rebuilt from the bits here.
template <class D>
HWY_INLINE hn::Vec<D> widen_f16(D d, const hwy::float16_t* p) {
  const hn::Rebind<hwy::float16_t, D> dh;
  const hn::Rebind<uint16_t, D> du16;
  const hn::RebindToUnsigned<D> du;
  const auto widened = hn::PromoteTo(d, hn::LoadU(dh, p));
  const auto bits = hn::PromoteTo(du, hn::LoadU(du16, reinterpret_cast<const uint16_t*>(p)));
  const auto special = hn::Eq(hn::And(bits, hn::Set(du, 0x7C00u)), hn::Set(du, 0x7C00u));
  const auto rebuilt = hn::Or(hn::Or(hn::ShiftLeft<16>(hn::And(bits, hn::Set(du, 0x8000u))), hn::Set(du, 0x7F800000u)),
                              hn::ShiftLeft<13>(hn::And(bits, hn::Set(du, 0x03FFu))));
  return hn::IfThenElse(hn::RebindMask(d, special), hn::BitCast(d, rebuilt), widened);
}

template <class D>
HWY_INLINE hn::Vec<D> load_as_f32(D d, const void* base, size_t i, int dtype) {
  if (dtype == 0) return hn::LoadU(d, static_cast<const float*>(base) + i);
  if (dtype == 1) return widen_f16(d, static_cast<const hwy::float16_t*>(base) + i);
  const hn::Rebind<hwy::bfloat16_t, D> db;
  return hn::PromoteTo(d, hn::LoadU(db, static_cast<const hwy::bfloat16_t*>(base) + i));
}

void ScoreRows(const float* Q, size_t ldq, size_t rows, const void* keys, size_t key_stride, int dtype, size_t n,
               size_t dim, float* S, size_t lds) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  constexpr size_t kMaxRows = 8;
  const size_t vec_end = dim / N * N;
  const size_t row_bytes = dim * (dtype == 0 ? 4 : 2);
  for (size_t j = 0; j < n; ++j) {
    const void* k = static_cast<const char*>(keys) + j * key_stride;
    // Key rows of one head sit a whole token apart (every head's row in between): prefetch ahead,
    // since the hardware's stride prefetcher does not keep up with one row per few hundred cycles.
    if (j + 8 < n) {
      const char* ahead = static_cast<const char*>(keys) + (j + 8) * key_stride;
      for (size_t off = 0; off < row_bytes; off += 64) hwy::Prefetch(ahead + off);
    }
    hn::Vec<decltype(d)> acc[kMaxRows];
    for (size_t r = 0; r < kMaxRows; ++r) acc[r] = hn::Zero(d);
    for (size_t i = 0; i < vec_end; i += N) {
      const auto kv = load_as_f32(d, k, i, dtype);
      for (size_t r = 0; r < kMaxRows; ++r) {
        if (r < rows) acc[r] = hn::MulAdd(hn::LoadU(d, Q + r * ldq + i), kv, acc[r]);
      }
    }
    for (size_t r = 0; r < rows; ++r) {
      float s = hn::GetLane(hn::SumOfLanes(d, acc[r]));
      for (size_t i = vec_end; i < dim; ++i) {  // a head_dim that is not a multiple of the lanes
        float kf;
        if (dtype == 0)
          kf = static_cast<const float*>(k)[i];
        else if (dtype == 1)
          kf = core::f16_to_f32(static_cast<const uint16_t*>(k)[i]);
        else
          kf = core::bf16_to_f32(static_cast<const uint16_t*>(k)[i]);
        s += Q[r * ldq + i] * kf;
      }
      S[r * lds + j] = s;
    }
  }
}

float ExpShiftSum(float* x, size_t n, float shift) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto s = hn::Set(d, shift);
  auto sum = hn::Zero(d);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto e = hn::Exp(d, hn::Sub(hn::LoadU(d, x + i), s));
    hn::StoreU(e, d, x + i);
    sum = hn::Add(sum, e);
  }
  float total = hn::GetLane(hn::SumOfLanes(d, sum));
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - shift);
    total += x[i];
  }
  return total;
}

float MaxOf(const float* x, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  auto m = hn::Set(d, -std::numeric_limits<float>::infinity());
  size_t i = 0;
  for (; i + N <= n; i += N) m = hn::Max(m, hn::LoadU(d, x + i));
  // The lanes reduced here rather than by MaxOfLanes: Highway 1.0's EMU128 MaxOfLanes starts from the lowest finite
  // float, so lanes that are all -inf (a block of masked scores) came back as -3.4e38.
  float lanes[64];  // at least Lanes(d) for every target's float vectors
  hn::StoreU(m, d, lanes);
  float result = -std::numeric_limits<float>::infinity();
  for (size_t l = 0; l < N; ++l) result = std::max(result, lanes[l]);
  for (; i < n; ++i) result = std::max(result, x[i]);
  return result;
}

void Scale(float* x, size_t n, float factor) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto f = hn::Set(d, factor);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(hn::LoadU(d, x + i), f), d, x + i);
  for (; i < n; ++i) x[i] *= factor;
}

void SoftCap(float* x, size_t n, float cap) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  // x / cap, not x * (1 / cap): a subnormal cap has an infinite reciprocal, and 0 * inf is a NaN where the score
  // is 0. Tanh's argument is clamped at +-20 (f32's tanh is +-1 there): Highway's Tanh takes finite values only.
  // A NaN stays a NaN (the clamp would make it a number), so the callers' checks still see it.
  const auto c = hn::Set(d, cap), lo = hn::Set(d, -20.0f), hi = hn::Set(d, 20.0f);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto y = hn::Div(hn::LoadU(d, x + i), c);
    const auto capped = hn::Mul(c, hn::Tanh(d, hn::Min(hn::Max(y, lo), hi)));
    hn::StoreU(hn::IfThenElse(hn::IsNaN(y), y, capped), d, x + i);
  }
  for (; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

// dtype: 0 f32, 1 f16, 2 bf16 (flashtq::DType's order).
void LoadRow(const void* src, int dtype, float* dst, size_t n, float factor) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto f = hn::Set(d, factor);
  size_t i = 0;
  if (dtype == 0) {
    const float* s = static_cast<const float*>(src);
    for (; i + N <= n; i += N) hn::StoreU(hn::Mul(hn::LoadU(d, s + i), f), d, dst + i);
    for (; i < n; ++i) dst[i] = s[i] * factor;
  } else if (dtype == 1) {
    const hwy::float16_t* s = static_cast<const hwy::float16_t*>(src);
    for (; i + N <= n; i += N) hn::StoreU(hn::Mul(widen_f16(d, s + i), f), d, dst + i);
    for (; i < n; ++i) dst[i] = core::f16_to_f32(static_cast<const uint16_t*>(src)[i]) * factor;
  } else {
    const hn::Rebind<hwy::bfloat16_t, decltype(d)> db;
    const hwy::bfloat16_t* s = static_cast<const hwy::bfloat16_t*>(src);
    for (; i + N <= n; i += N) hn::StoreU(hn::Mul(hn::PromoteTo(d, hn::LoadU(db, s + i)), f), d, dst + i);
    for (; i < n; ++i) dst[i] = core::bf16_to_f32(static_cast<const uint16_t*>(src)[i]) * factor;
  }
}

double FmaBurst(size_t iterations, float* checksum) {
  const hn::ScalableTag<float> d;
  const auto a = hn::Set(d, 0.999f), b = hn::Set(d, 0.001f);
  // Distinct starting values: identical chains would be merged by the compiler into one.
  auto v0 = hn::Set(d, 1.00f), v1 = hn::Set(d, 1.01f), v2 = hn::Set(d, 1.02f), v3 = hn::Set(d, 1.03f);
  auto v4 = hn::Set(d, 1.04f), v5 = hn::Set(d, 1.05f), v6 = hn::Set(d, 1.06f), v7 = hn::Set(d, 1.07f);
  auto v8 = hn::Set(d, 1.08f), v9 = hn::Set(d, 1.09f), v10 = hn::Set(d, 1.10f), v11 = hn::Set(d, 1.11f);
  for (size_t i = 0; i < iterations; ++i) {
    v0 = hn::MulAdd(v0, a, b), v1 = hn::MulAdd(v1, a, b), v2 = hn::MulAdd(v2, a, b), v3 = hn::MulAdd(v3, a, b);
    v4 = hn::MulAdd(v4, a, b), v5 = hn::MulAdd(v5, a, b), v6 = hn::MulAdd(v6, a, b), v7 = hn::MulAdd(v7, a, b);
    v8 = hn::MulAdd(v8, a, b), v9 = hn::MulAdd(v9, a, b), v10 = hn::MulAdd(v10, a, b), v11 = hn::MulAdd(v11, a, b);
  }
  const auto sum =
      hn::Add(hn::Add(hn::Add(v0, v1), hn::Add(v2, v3)),
              hn::Add(hn::Add(hn::Add(v4, v5), hn::Add(v6, v7)), hn::Add(hn::Add(v8, v9), hn::Add(v10, v11))));
  *checksum = hn::GetLane(hn::SumOfLanes(d, sum));
  return 2.0 * 12.0 * double(hn::Lanes(d)) * double(iterations);
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace flashtq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace flashtq::cpu {

HWY_EXPORT(Gemm);
HWY_EXPORT(ExpShiftSum);
HWY_EXPORT(Scale);
HWY_EXPORT(SoftCap);
HWY_EXPORT(ScoreRows);
HWY_EXPORT(MaxOf);
HWY_EXPORT(TargetName);
HWY_EXPORT(LoadRow);
HWY_EXPORT(FmaBurst);

void gemm(const float* A, std::size_t lda, const float* B, std::size_t ldb, float* C, std::size_t ldc, std::size_t M,
          std::size_t N, std::size_t K, bool accumulate) {
  HWY_DYNAMIC_DISPATCH(Gemm)(A, lda, B, ldb, C, ldc, M, N, K, accumulate);
}
void score_rows(const float* Q, std::size_t ldq, std::size_t rows, const void* keys, std::size_t key_stride, int dtype,
                std::size_t n, std::size_t dim, float* S, std::size_t lds) {
  HWY_DYNAMIC_DISPATCH(ScoreRows)(Q, ldq, rows, keys, key_stride, dtype, n, dim, S, lds);
}
float exp_shift_sum(float* x, std::size_t n, float shift) { return HWY_DYNAMIC_DISPATCH(ExpShiftSum)(x, n, shift); }
void scale(float* x, std::size_t n, float factor) { HWY_DYNAMIC_DISPATCH(Scale)(x, n, factor); }
void softcap(float* x, std::size_t n, float cap) { HWY_DYNAMIC_DISPATCH(SoftCap)(x, n, cap); }
float max_of(const float* x, std::size_t n) { return HWY_DYNAMIC_DISPATCH(MaxOf)(x, n); }
void load_row(const void* src, int dtype, float* dst, std::size_t n, float factor) {
  HWY_DYNAMIC_DISPATCH(LoadRow)(src, dtype, dst, n, factor);
}
double fma_burst(std::size_t iterations, float* checksum) {
  return HWY_DYNAMIC_DISPATCH(FmaBurst)(iterations, checksum);
}
const char* simd_target() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

}  // namespace flashtq::cpu
#endif

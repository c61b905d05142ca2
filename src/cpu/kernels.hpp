// SIMD building blocks of the cpu backend (Highway, dispatched at run time to the best target:
// AVX2 here, AVX-512 or NEON where the machine has them).
#pragma once

#include <cstddef>

namespace flashtq::cpu {

// C[M x N] (+)= A[M x K] . B[K x N]; row-major with the given leading dimensions.
void gemm(const float* A, std::size_t lda, const float* B, std::size_t ldb, float* C, std::size_t ldc, std::size_t M,
          std::size_t N, std::size_t K, bool accumulate);

// Scores of a few query rows against n key rows of `dtype` (row r of Q, key j at keys + j * key_stride
// bytes): S[r * lds + j] = <Q[r], k_j>, converting each key once while it is in registers; the
// converted keys are not kept.
void score_rows(const float* Q, std::size_t ldq, std::size_t rows, const void* keys, std::size_t key_stride, int dtype,
                std::size_t n, std::size_t dim, float* S, std::size_t lds);

// x[i] = exp(x[i] - shift) for i < n; returns the sum of the results. exp of -inf is 0.
float exp_shift_sum(float* x, std::size_t n, float shift);

// max_i x[i] (-inf for n = 0).
float max_of(const float* x, std::size_t n);

// x[i] *= factor.
void scale(float* x, std::size_t n, float factor);

// x[i] = cap * tanh(x[i] / cap) (docs/spec.md §1.8's softcap), cap > 0.
void softcap(float* x, std::size_t n, float cap);

// dst[i] = float(src[i]) * factor for a row of `dtype` elements (f16/bf16 widened exactly).
void load_row(const void* src, int dtype, float* dst, std::size_t n, float factor);

// Calibration: `iterations` rounds of 12 independent vector FMAs; returns the flops done (the
// caller times it) and writes a checksum so the work is not optimised away.
double fma_burst(std::size_t iterations, float* checksum);

// Name of the SIMD target chosen at run time (for reports).
const char* simd_target();

}  // namespace flashtq::cpu

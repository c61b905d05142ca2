// The Ampere-class tensor-core product every mma.sync kernel uses, written once: D[16x8] += A[16x16] . B[16x8]
// in f32, A row-major and B column-major, f16 or bf16 operands (PTX ISA, "Matrix fragments for mma.m16n8k16").
// Thread (row = lane / 4, col = lane % 4) holds A rows row and row + 8 at k = 2 col, 2 col + 1, 2 col + 8,
// 2 col + 9 (registers a0: row, k 2 col..; a1: row + 8, k 2 col..; a2: row, k 2 col + 8..; a3: row + 8, k 2 col + 8..),
// B's column row at k = 2 col, 2 col + 1 (b0) and 2 col + 8, 2 col + 9 (b1), and D's rows row, row + 8 at columns
// 2 col, 2 col + 1 (d0, d1: row; d2, d3: row + 8).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace flashtq::cuda {

template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], std::uint32_t a0, std::uint32_t a1, std::uint32_t a2,
                                          std::uint32_t a3, std::uint32_t b0, std::uint32_t b1);
template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], std::uint32_t a0, std::uint32_t a1, std::uint32_t a2,
                                                  std::uint32_t a3, std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], std::uint32_t a0, std::uint32_t a1,
                                                         std::uint32_t a2, std::uint32_t a3, std::uint32_t b0,
                                                         std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two floats as a bf16 pair, round to nearest even: lo in the low half (the lower k or column).
__device__ __forceinline__ std::uint32_t bf16_pair(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&h);
}

// Four 8x8 matrices of 16-bit elements from shared memory: lanes 8 m .. 8 m + 7 give the addresses of matrix m's
// rows, and lane (row, col) receives row `row`, elements 2 col, 2 col + 1 of matrix m in r[m] (with .trans, of its
// transpose): the A or B fragments of mma_16816.
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], unsigned address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], unsigned address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// The transpose of an 8x8 matrix of 16-bit elements held as in a D fragment's half (lane (row, col) holds row
// `row`, columns 2 col, 2 col + 1): afterwards the lane holds row `row` of the transpose, columns 2 col, 2 col + 1.
__device__ __forceinline__ std::uint32_t movmatrix_trans(std::uint32_t x) {
  std::uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// Byte `index` of each of four words, packed (word i's in byte i): two PRMTs pick it from pairs of words, a third
// joins the halves. The integer tensor-core operands gather limbs and value bits this way.
__device__ __forceinline__ std::uint32_t byte_of_each(std::uint32_t w0, std::uint32_t w1, std::uint32_t w2,
                                                      std::uint32_t w3, int index) {
  const std::uint32_t sel = std::uint32_t(index) | std::uint32_t(index + 4) << 4;
  return __byte_perm(__byte_perm(w0, w1, sel), __byte_perm(w2, w3, sel), 0x5410u);
}

// Max and sum over the 4 threads of a group (lanes 4g .. 4g + 3: one row of an mma result).
__device__ __forceinline__ float group_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, 2));
}
__device__ __forceinline__ float group_sum(float x) {
  x += __shfl_xor_sync(0xFFFFFFFFu, x, 1);
  return x + __shfl_xor_sync(0xFFFFFFFFu, x, 2);
}
// Max and sum over the 8 threads of a column group (lanes tig, tig + 4, ..., tig + 28: one column of an mma
// result, its rows g and g + 8 on each).
__device__ __forceinline__ float column_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, 4));
  x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, 8));
  return fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, 16));
}
__device__ __forceinline__ float column_sum(float x) {
  x += __shfl_xor_sync(0xFFFFFFFFu, x, 4);
  x += __shfl_xor_sync(0xFFFFFFFFu, x, 8);
  return x + __shfl_xor_sync(0xFFFFFFFFu, x, 16);
}

}  // namespace flashtq::cuda

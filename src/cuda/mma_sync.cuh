// Warp-level tensor-core primitives of sm_80 and later (mma.sync, ldmatrix), written once. Fragment layout of
// m16n8k16 (lane = 4 g + t): A regs (row g, k 2t..2t+1), (row g + 8, same), (row g, k 2t + 8..), (row g + 8,
// same); B regs (k 2t..2t+1, col g), (k 2t + 8.., col g); C (row g, cols 2t, 2t + 1), (row g + 8, same).
#pragma once

#include <cstdint>

namespace flashtq::cuda {

// D[16x8] += A[16x16] B[16x8], bf16 operands, f32 accumulators.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                               std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices from shared memory: lanes 8 m .. 8 m + 7 give the row addresses of matrix m
// (16-byte aligned), r[m] is lane (g, t)'s part of it: row g, columns 2t, 2t + 1 (.trans: column g, rows 2t, 2t + 1).
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}
// Two matrices: lanes 0-15 give the addresses (the others' are ignored but must be valid shared addresses).
__device__ __forceinline__ void ldmatrix_x2(std::uint32_t (&r)[2], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(shared_address(row)));
}
__device__ __forceinline__ void ldmatrix_x2_trans(std::uint32_t (&r)[2], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(shared_address(row)));
}

}  // namespace flashtq::cuda

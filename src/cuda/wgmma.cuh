// Hopper's warpgroup matrix multiply (wgmma.mma_async, sm_90a): shared-memory matrix descriptors and
// the f32-accumulating m64nNk16 products the dense kernels use, for f16 and bf16, N = 64 and 128 (and
// N = 256 for the register-A product: O += P V at head_dim 256).
// A warpgroup (4 consecutive warps) issues them together; the accumulator of m64nN holds, in warp w
// of the group, rows 16 w + g and 16 w + g + 8 (g = lane / 4) at columns 8 j + 2 (lane % 4) + {0, 1}
// in registers 4 j + {0, 1} and 4 j + {2, 3}: mma.sync's m16n8 C layout, one per warp.
// Only compiled into sm_90a code: callers guard with FLASHTQ_WGMMA.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FLASHTQ_WGMMA 1
#endif

namespace flashtq::cuda::wgmma {

// Descriptor of a matrix in shared memory with 128-byte swizzle (its 1024-byte pattern aligned to
// 1024 bytes): start address, leading- and stride-dimension byte offsets (PTX ISA, "Matrix Descriptor
// Format"). Offsets within the pattern may be added to the address field later (add_bytes).
__device__ __forceinline__ std::uint64_t descriptor_sw128(unsigned address, unsigned leading_bytes,
                                                          unsigned stride_bytes) {
  return std::uint64_t((address & 0x3FFFFu) >> 4) | (std::uint64_t(leading_bytes >> 4) << 16) |
         (std::uint64_t(stride_bytes >> 4) << 32) | (std::uint64_t(1) << 62);
}
__device__ __forceinline__ std::uint64_t add_bytes(std::uint64_t descriptor, unsigned bytes) {
  return descriptor + (bytes >> 4);
}

// The dense kernels' 128-byte-swizzled tiles: a tile of `rows` rows by D 16-bit elements is D / 64
// column blocks of rows x 128 bytes (one TMA box each); the swizzle pattern repeats every 8 rows.
constexpr unsigned kSwizzleRowBytes = 128, kSwizzleAtomBytes = 8 * kSwizzleRowBytes;
template <int D>
constexpr unsigned swizzled_tile_bytes(int rows) {
  return unsigned(D / 64) * unsigned(rows) * kSwizzleRowBytes;
}
// Such a tile as a K-major operand from row `row` on (k-step kk then lies 32 (kk % 4) bytes into
// column block kk / 4), and as an N-major operand whose column blocks lie `block_bytes` apart (k-step
// kk then lies 16 kk rows further).
__device__ __forceinline__ std::uint64_t k_major(unsigned tile, int row) {
  return descriptor_sw128(tile + unsigned(row) * kSwizzleRowBytes, 16, kSwizzleAtomBytes);
}
__device__ __forceinline__ std::uint64_t n_major(unsigned tile, unsigned block_bytes) {
  return descriptor_sw128(tile, block_bytes, kSwizzleAtomBytes);
}

// The first 1024-byte-aligned shared address at or after `smem` (the 128-byte swizzle pattern
// repeats every 1024 bytes; launches add 1024 bytes of dynamic shared memory for this).
__device__ __forceinline__ unsigned swizzle_aligned(const void* smem) {
  return (static_cast<unsigned>(__cvta_generic_to_shared(smem)) + 1023u) & ~1023u;
}

#ifdef FLASHTQ_WGMMA
// Orders this thread's register writes before the warpgroup's next wgmma reads them.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most `pending` committed groups of this warpgroup are still running.
template <int pending>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(pending) : "memory");
}
// Generic-proxy writes to shared memory (st.shared, cp.async) visible to wgmma's async proxy.
__device__ __forceinline__ void fence_shared_for_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// A warpgroup's per-thread register budget (setmaxnreg; all its warps execute it): a producer
// warpgroup gives registers back so that the compute warpgroups can take more.
template <int registers>
__device__ __forceinline__ void shrink_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(registers));
}
template <int registers>
__device__ __forceinline__ void grow_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(registers));
}

// D (+)= A B with A (64 x 16) and B (16 x N) both K-major in shared memory; D = A B when !accumulate.
template <typename T, int N>
__device__ __forceinline__ void mma_ss(float (&d)[N / 2], std::uint64_t a, std::uint64_t b, bool accumulate);
// D += A B with A in registers (four packed pairs, mma.sync's A fragment per warp) and B N-major
// (the rows of a row-major 16 x N tile contiguous) in shared memory.
template <typename T, int N>
__device__ __forceinline__ void mma_rs_n_major(float (&d)[N / 2], const std::uint32_t (&a)[4], std::uint64_t b);

// The specialisations differ only in N, the element type's PTX name and the operand numbers, and inline assembly
// takes neither loops nor computed strings: so the accumulators' "+f" bindings (d[0, N / 2)), their register
// lists and the two forms of the instruction are spelled once here, as macros, and stamped out per (T, N).
#define FLASHTQ_WGMMA_D4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define FLASHTQ_WGMMA_D16(i) \
  FLASHTQ_WGMMA_D4(i), FLASHTQ_WGMMA_D4(i + 4), FLASHTQ_WGMMA_D4(i + 8), FLASHTQ_WGMMA_D4(i + 12)
#define FLASHTQ_WGMMA_D32 FLASHTQ_WGMMA_D16(0), FLASHTQ_WGMMA_D16(16)
#define FLASHTQ_WGMMA_D64 FLASHTQ_WGMMA_D32, FLASHTQ_WGMMA_D16(32), FLASHTQ_WGMMA_D16(48)
#define FLASHTQ_WGMMA_D128 \
  FLASHTQ_WGMMA_D64, FLASHTQ_WGMMA_D16(64), FLASHTQ_WGMMA_D16(80), FLASHTQ_WGMMA_D16(96), FLASHTQ_WGMMA_D16(112)
#define FLASHTQ_WGMMA_R32                                                                                           \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31"
#define FLASHTQ_WGMMA_R64                                                                        \
  FLASHTQ_WGMMA_R32                                                                              \
  ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, " \
  "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define FLASHTQ_WGMMA_R128                                                                            \
  FLASHTQ_WGMMA_R64                                                                                   \
  ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, " \
  "%83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, " \
  "%102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, "  \
  "%118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

// mma_ss<T, N>: accumulators %0 .. %(R - 1) (R = N / 2), descriptors %R and %(R + 1), the accumulate flag %(R + 2).
#define FLASHTQ_WGMMA_SS(T, TYPE, N, REGS, DLIST, A, B, FLAG)                                                         \
  template <>                                                                                                         \
  __device__ __forceinline__ void mma_ss<T, N>(float(&d)[N / 2], std::uint64_t a, std::uint64_t b, bool accumulate) { \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #FLAG                                                           \
                 ", 0;\n"                                                                                             \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " " REGS "}, %" #A ", %" #B          \
                 ", p, 1, 1, 0, 0;\n}\n"                                                                              \
                 : DLIST                                                                                              \
                 : "l"(a), "l"(b), "r"(int(accumulate)));                                                             \
  }
// mma_rs_n_major<T, N>: accumulators, A's four registers %R .. %(R + 3), B's descriptor %(R + 4), scale-d %(R + 5).
#define FLASHTQ_WGMMA_RS(T, TYPE, N, REGS, DLIST, A0, A1, A2, A3, B, FLAG)                                      \
  template <>                                                                                                   \
  __device__ __forceinline__ void mma_rs_n_major<T, N>(float(&d)[N / 2], const std::uint32_t(&a)[4],            \
                                                       std::uint64_t b) {                                       \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #FLAG                                                     \
                 ", 0;\n"                                                                                       \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " " REGS "}, {%" #A0 ", %" #A1 \
                 ", %" #A2 ", %" #A3 "}, %" #B ", p, 1, 1, 1;\n}\n"                                             \
                 : DLIST                                                                                        \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));                                 \
  }
#define FLASHTQ_WGMMA_FOR_TYPE(T, TYPE)                                                        \
  FLASHTQ_WGMMA_SS(T, TYPE, 64, FLASHTQ_WGMMA_R32, FLASHTQ_WGMMA_D32, 32, 33, 34)              \
  FLASHTQ_WGMMA_RS(T, TYPE, 64, FLASHTQ_WGMMA_R32, FLASHTQ_WGMMA_D32, 32, 33, 34, 35, 36, 37)  \
  FLASHTQ_WGMMA_SS(T, TYPE, 128, FLASHTQ_WGMMA_R64, FLASHTQ_WGMMA_D64, 64, 65, 66)             \
  FLASHTQ_WGMMA_RS(T, TYPE, 128, FLASHTQ_WGMMA_R64, FLASHTQ_WGMMA_D64, 64, 65, 66, 67, 68, 69) \
  FLASHTQ_WGMMA_RS(T, TYPE, 256, FLASHTQ_WGMMA_R128, FLASHTQ_WGMMA_D128, 128, 129, 130, 131, 132, 133)

FLASHTQ_WGMMA_FOR_TYPE(__half, "f16")
FLASHTQ_WGMMA_FOR_TYPE(__nv_bfloat16, "bf16")

#undef FLASHTQ_WGMMA_FOR_TYPE
#undef FLASHTQ_WGMMA_RS
#undef FLASHTQ_WGMMA_SS
#undef FLASHTQ_WGMMA_R128
#undef FLASHTQ_WGMMA_R64
#undef FLASHTQ_WGMMA_R32
#undef FLASHTQ_WGMMA_D128
#undef FLASHTQ_WGMMA_D64
#undef FLASHTQ_WGMMA_D32
#undef FLASHTQ_WGMMA_D16
#undef FLASHTQ_WGMMA_D4

// D (+)= A B^T over a head dim of K elements: A (64 rows) and B (N rows) both K-major in 128-byte-
// swizzled tiles of K / 64 column blocks, `a_block` and `b_block` bytes apart; K / 16 k-steps of 32
// bytes within a block. D = A B^T (the first step does not accumulate).
template <typename T, int N, int K>
__device__ __forceinline__ void mma_ss_rows(float (&d)[N / 2], std::uint64_t a, unsigned a_block, std::uint64_t b,
                                            unsigned b_block) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    const unsigned step = unsigned(kk % 4) * 32;
    mma_ss<T, N>(d, add_bytes(a, unsigned(kk / 4) * a_block + step), add_bytes(b, unsigned(kk / 4) * b_block + step),
                 kk > 0);
  }
}

// D += A B over K rows of B: A's fragments in registers (one per 16-row k-step), B N-major in a
// 128-byte-swizzled tile (k-step kk is 16 rows of 128 bytes further).
template <typename T, int N, int K>
__device__ __forceinline__ void mma_rs_rows(float (&d)[N / 2], const std::uint32_t (&a)[K / 16][4], std::uint64_t b) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
    mma_rs_n_major<T, N>(d, a[kk], add_bytes(b, unsigned(kk) * 16 * kSwizzleRowBytes));
}
#endif  // FLASHTQ_WGMMA

}  // namespace flashtq::cuda::wgmma

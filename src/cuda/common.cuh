// Device helpers shared by the CUDA kernels: element access, warp reductions, the warp RHT.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "flashtq/tensor.hpp"

namespace flashtq::cuda {

// f(a value of the element type) for a view's dtype: kernels are templates over the element type.
template <typename F>
void by_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); break;
    case DType::f16: f(__half{}); break;
    case DType::bf16: f(__nv_bfloat16{}); break;
  }
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Two floats rounded to a packed pair of T (the low half first), as mma operands take them.
template <typename T>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ std::uint32_t pack2<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}
template <>
__device__ __forceinline__ std::uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}

// Element offset of row (b, s, h) of a [B, S, H, D] view.
__device__ __forceinline__ std::int64_t row_offset(const TensorView& t, std::int64_t b, std::int64_t s,
                                                   std::int64_t h) {
  return b * t.strides[0] + s * t.strides[1] + h * t.strides[2];
}

template <typename T>
__device__ __forceinline__ T warp_sum(T x) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) x += __shfl_xor_sync(0xFFFFFFFFu, x, m);
  return x;
}

template <typename T>
__device__ __forceinline__ T warp_max(T x) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) x = fmax(x, __shfl_xor_sync(0xFFFFFFFFu, x, m));
  return x;
}

__device__ __forceinline__ double sign_of(const std::uint32_t* bits, int d) {
  return ((bits[d / 32] >> (d % 32)) & 1u) ? -1.0 : 1.0;
}

// The butterflies of a Walsh-Hadamard transform whose pairs lie within one lane's E values (strides below E).
template <typename T, int E>
__device__ __forceinline__ void lane_fwht(T (&x)[E]) {
#pragma unroll
  for (int len = 1; len < E; len <<= 1) {
#pragma unroll
    for (int e = 0; e < E; ++e) {
      if (!(e & len)) {
        const T a = x[e], b = x[e + len];
        x[e] = a + b;
        x[e + len] = a - b;
      }
    }
  }
}

// The Walsh-Hadamard butterflies over a warp (or over each aligned group of kLanes lanes, `lanes` their mask),
// lane holding coordinates [lane * E, lane * E + E) of its group's row: within the lane first, then across lanes,
// in core::fwht's order.
template <typename T, int E, int kLanes = 32>
__device__ __forceinline__ void warp_fwht(T (&x)[E], int lane, unsigned lanes = 0xFFFFFFFFu) {
  lane_fwht<T, E>(x);
#pragma unroll
  for (int m = 1; m < kLanes; m <<= 1) {
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const T other = __shfl_xor_sync(lanes, x[e], m);
      x[e] = (lane & m) ? other - x[e] : x[e] + other;
    }
  }
}

// RHT_s over a warp, in double, lane holding dims [lane*E, lane*E + E): the same butterflies in the
// same order as core::rht, so the result is bit-identical to the host's.
template <int E>
__device__ __forceinline__ void warp_rht(double (&x)[E], const std::uint32_t* signs, int lane) {
#pragma unroll
  for (int e = 0; e < E; ++e) x[e] *= sign_of(signs, lane * E + e);
  warp_fwht<double, E>(x, lane);
  const double inv = 1.0 / sqrt(double(32 * E));
#pragma unroll
  for (int e = 0; e < E; ++e) x[e] *= inv;
}

// The softmaxes run in base 2: scores are multiplied by log2(e), maxima turned back by ln(2).
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// 2^x on the special-function unit (ex2.approx.ftz: relative error about 2^-22, subnormal results
// flushed to zero); the softmaxes run in base 2.
__device__ __forceinline__ float exp2_approx(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// Asynchronous global -> shared copies (sm_80+): 16 bytes (both addresses 16-byte aligned) or 4; the shared side
// as a pointer or as a 32-bit shared-window address (shared_address()).
__device__ __forceinline__ unsigned shared_address(const void* smem) {
  return static_cast<unsigned>(__cvta_generic_to_shared(smem));
}
// kWholeLine: on a miss L2 fetches the whole 128-byte line from DRAM (.L2::128B), for kernels that stream rows whose
// other chunks their neighbouring lanes ask for at the same moment.
template <bool kWholeLine = false>
__device__ __forceinline__ void cp_async16(unsigned dst, const void* global) {
  if constexpr (kWholeLine) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(dst), "l"(global));
  } else {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(global));
  }
}
// As cp_async16, but the 16 bytes are zero-filled instead of read when !fill (global must still be a valid
// address).
template <bool kWholeLine = false>
__device__ __forceinline__ void cp_async16_zfill(unsigned dst, const void* global, bool fill) {
  if constexpr (kWholeLine) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(global),
                 "r"(fill ? 16 : 0));
  } else {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(global), "r"(fill ? 16 : 0));
  }
}
__device__ __forceinline__ void cp_async4(unsigned dst, const void* global) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(global));
}
template <bool kWholeLine = false>
__device__ __forceinline__ void cp_async16(void* smem, const void* global) {
  cp_async16<kWholeLine>(shared_address(smem), global);
}
__device__ __forceinline__ void cp_async4(void* smem, const void* global) { cp_async4(shared_address(smem), global); }
// A 32-bit load from a shared-window address (volatile: never moved above a cp.async wait).
__device__ __forceinline__ std::uint32_t lds32(unsigned address) {
  std::uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(address));
  return v;
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most `pending` of this thread's committed groups are still in flight.
template <int pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending));
}

// Programmatic dependent launch (sm_90+; no-ops on older targets and for kernels launched without
// the attribute). A kernel launched with launch_dependent() may start while the kernel before it in
// the stream is still running: it must call wait_for_previous_grid() before it reads what that kernel
// wrote or writes what it may still read. allow_next_grid() lets the next kernel start launching.
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

}  // namespace flashtq::cuda

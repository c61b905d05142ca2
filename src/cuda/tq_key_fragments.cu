// The prepare kernel of the tensor-core TurboQuant decode: turns each (query row, group of 4 heads)
// of the rotated-query scratch into the query operand of the integer key product. The queries become
// fixed point per head (an exponent per head, the largest element just under 2^30 with four limbs, 2^14
// with two), split into balanced signed 8-bit limbs. Element k of a k-step meets the cache word's bit
// 8 (k % 4) + 4 (k / 16) + (k % 16) / 4, which the decode kernel feeds scaled by 2^sigma (the bit left in
// place in its byte), so each query element is pre-divided by 2^sigma here, sigma = 4 (k / 16) + (k % 16) / 4.
// The bf16-class decode's k-step m instead pairs the cache words 2 (m / 2) (k < 16) and 2 (m / 2) + 1 (k >= 16),
// both in their lower nibbles (m even) or upper ones (m odd): element k meets bit 8 (k % 4) + 4 (m % 2) +
// (k % 16) / 4 and is pre-divided by 2^((k % 16) / 4) only (the kernel divides an upper nibble's products by 16),
// so that no element of its 15-bit fixed point loses more than 3 bits.
//   exact (4 limbs): the A operand of mma.m16n8k32.s8.u8, rows (limb, head); KeyFragments.
//   bf16-class (2 limbs): the B operand of mma.m16n8k32.u8.s8, columns (head, limb); KeyFragmentsBf16.
// A 2-bit code's centroid is -c1 + (c1 - c0) lo + (c0 + c1) hi, so the code words' elements carry those
// coefficients and the constant -c1 sum(q) goes to key_offset; the QJL words' elements are q_jl, with
// sum(q_jl) in jl_sum.
#include "cuda/common.cuh"
#include "cuda/launch.hpp"
#include "cuda/mma.cuh"
#include "cuda/tq_key_fragments.cuh"

namespace flashtq::cuda {
namespace {

// One block per (query row, group of 4 heads); many threads, as it sits on the decode step's critical path.
constexpr int kPrepareThreads = 512;

template <int kLimbs>
__global__ void __launch_bounds__(kPrepareThreads) prepare_key_fragments(AttendParams a) {
  __shared__ float q_rot[4][kD], q_jl[4][kD];
  __shared__ int fix_exp[4], jl_exp[4];
  __shared__ __align__(16) std::uint32_t digits[kKeySteps][4][32];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  wait_for_previous_grid();  // the rotated queries
  allow_next_grid();
  const std::int64_t groups = a.H / 4, j = blockIdx.x / groups, h0 = (blockIdx.x % groups) * 4;
  auto& out = *reinterpret_cast<KeyFragmentsFor<kLimbs>*>(static_cast<char*>(a.key_fragments) +
                                                          std::size_t(blockIdx.x) * kKeyFragmentBytes);
  constexpr int kTop = kLimbs == 4 ? 30 : 14;  // the largest element's fixed point stays below 2^kTop
  const float kc0 = a.key_centroids[2], kc1 = a.key_centroids[3];
  const float lo_coef = kc1 - kc0, hi_coef = kc0 + kc1;  // centroid = -c1 + lo_coef lo + hi_coef hi
  for (int i = tid; i < 4 * kD; i += kPrepareThreads) {
    q_rot[i / kD][i % kD] = a.scratch[a.scratch_layout.q_rot(j, h0 + i / kD) + i % kD];
    q_jl[i / kD][i % kD] = a.scratch[a.scratch_layout.q_jl(j, h0 + i / kD) + i % kD];
  }
  __syncthreads();
  if (warp < 4) {  // warp w: the fixed-point exponents and constant terms of head w
    float mx = 0.0f, mj = 0.0f, sx = 0.0f, sj = 0.0f;
    for (int d = lane; d < kD; d += 32) {
      mx = fmaxf(mx, fabsf(q_rot[warp][d]));
      mj = fmaxf(mj, fabsf(q_jl[warp][d]));
      sx += q_rot[warp][d];
      sj += q_jl[warp][d];
    }
    mx = warp_max(mx) * fmaxf(fabsf(lo_coef), fabsf(hi_coef));
    mj = warp_max(mj);
    sx = warp_sum(sx);
    sj = warp_sum(sj);
    if (lane == 0) {
      // Largest element below 2^kTop after scaling; bounded so that 2^-exponent stays a normal float
      // (a head whose queries are that small contributes nothing measurable anyway).
      int e;
      frexpf(mx, &e);
      const int fe = min(100, kTop - e);
      frexpf(mj, &e);
      const int je = min(100, kTop - e);
      fix_exp[warp] = fe;
      jl_exp[warp] = je;
      out.key_unscale[warp] = ldexpf(1.0f, -fe);
      out.key_offset[warp] = -kc1 * sx;
      out.jl_unscale[warp] = ldexpf(2.0f, -je);
      out.jl_sum[warp] = sj;
    }
  }
  __syncthreads();
  // First each element's fixed-point value with its balanced base-256 digits as bytes: with digits d_i
  // in [-128, 127], x + 0x80...80 has bytes d_i + 128, so the digit bytes are that ^ 0x80.
  constexpr std::uint32_t kBias = kLimbs == 4 ? 0x80808080u : 0x8080u;
  for (int e = tid; e < kKeySteps * 4 * 32; e += kPrepareThreads) {
    const int step = e / 128, head = (e / 32) % 4, k = e % 32;
    // The cache word and bit that element k of this k-step meets.
    const int word = kLimbs == 4 ? step : 2 * (step / 2) + k / 16;
    const int bit = 8 * (k % 4) + 4 * (kLimbs == 4 ? k / 16 : step % 2) + (k % 16) / 4;
    const int sigma = kLimbs == 4 ? bit % 8 : (k % 16) / 4;
    const float x = word < 8 ? q_rot[head][16 * word + bit / 2] * ((bit & 1) ? hi_coef : lo_coef)
                             : q_jl[head][32 * (word - 8) + bit];
    const int exponent = (step < 8 ? fix_exp[head] : jl_exp[head]) - sigma;  // in [-105, 100]: a normal float
    const int fixed = __float2int_rn(x * __int_as_float((127 + exponent) << 23));
    digits[step][head][k] = (std::uint32_t(fixed) + kBias) ^ kBias;
  }
  __syncthreads();
  // Byte `limb` of the digits of elements k0 .. k0 + 3 of a head, as one register.
  auto limb_bytes = [&](int step, int head, int k0, int limb) {
    const uint4 d = *reinterpret_cast<const uint4*>(&digits[step][head][k0]);
    return byte_of_each(d.x, d.y, d.z, d.w, limb);
  };
  if constexpr (kLimbs == 4) {
    // A, register i of lane (g, t): row g + 8 (i & 1) (limb row / 4 of head row % 4), k = 16 (i >> 1) + 4 t + byte.
    for (int e = tid; e < kKeySteps * 32 * 4; e += kPrepareThreads) {
      const int step = e / 128, ln = (e / 4) % 32, i = e % 4;
      const int r = ln / 4 + 8 * (i & 1), k0 = 16 * (i >> 1) + 4 * (ln % 4);
      reinterpret_cast<std::uint32_t*>(&out.a[step][ln])[i] = limb_bytes(step, r % 4, k0, r / 4);
    }
  } else {
    // B, register i of lane (g, t): column g (limb g % 2 of head g / 2), k = 16 i + 4 t + byte.
    for (int e = tid; e < kKeySteps * 32 * 2; e += kPrepareThreads) {
      const int step = e / 64, ln = (e / 2) % 32, i = e % 2, g = ln / 4;
      reinterpret_cast<std::uint32_t*>(&out.b[step][ln])[i] = limb_bytes(step, g / 2, 16 * i + 4 * (ln % 4), g % 2);
    }
  }
}

}  // namespace

void launch_mma_prepare(const AttendParams& a, bool bf16, cudaStream_t stream) {
  const dim3 grid(unsigned(a.batch * a.n_queries * (a.H / 4)));
  const char* what = "TurboQuant query fragment kernel";
  if (bf16) return launch_dependent(prepare_key_fragments<2>, grid, dim3(kPrepareThreads), stream, what, a);
  launch_dependent(prepare_key_fragments<4>, grid, dim3(kPrepareThreads), stream, what, a);
}

}  // namespace flashtq::cuda

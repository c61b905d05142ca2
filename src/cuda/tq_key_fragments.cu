// The prepare kernel of the tensor-core TurboQuant decode: turns each (query row, group of 4 heads)
// of the rotated-query scratch into the A fragments of the integer key product. The queries become
// 31-bit fixed point per head (an exponent per head, so the largest element sits just under 2^30),
// split into four balanced signed 8-bit limbs: the rows of the A operand of mma.m16n8k32.s8.u8 are
// (limb, head). Element k of a k-step meets the cache word's bit 8 (k % 4) + 4 (k / 16) + (k % 16) / 4,
// which the decode kernel feeds scaled by 2^sigma (sigma = 4 (k / 16) + (k % 16) / 4, the bit left in
// place in its byte), so each query element is pre-divided by 2^sigma here. A 2-bit code's centroid is
// -c1 + (c1 - c0) lo + (c0 + c1) hi, so the code words' elements carry those coefficients and the
// constant -c1 sum(q) goes to key_offset; the QJL words' elements are q_jl, with sum(q_jl) in jl_sum.
#include "cuda/common.cuh"
#include "cuda/launch.hpp"
#include "cuda/tq_key_fragments.cuh"

namespace flashtq::cuda {
namespace {

// One block per (query row, group of 4 heads); many threads, as it sits on the decode step's critical path.
constexpr int kPrepareThreads = 512;

__global__ void __launch_bounds__(kPrepareThreads) prepare_key_fragments(AttendParams a) {
  __shared__ float q_rot[4][kD], q_jl[4][kD];
  __shared__ int fix_exp[4], jl_exp[4];
  __shared__ __align__(16) std::uint32_t digits[kKeySteps][4][32];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  wait_for_previous_grid();  // the rotated queries
  allow_next_grid();
  const std::int64_t groups = a.H / 4, j = blockIdx.x / groups, h0 = (blockIdx.x % groups) * 4;
  KeyFragments& out = reinterpret_cast<KeyFragments*>(a.key_fragments)[blockIdx.x];
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
      // Largest element below 2^30 after scaling; bounded so that 2^-exponent stays a normal float
      // (a head whose queries are that small contributes nothing measurable anyway).
      int e;
      frexpf(mx, &e);
      const int fe = min(100, 30 - e);
      frexpf(mj, &e);
      const int je = min(100, 30 - e);
      fix_exp[warp] = fe;
      jl_exp[warp] = je;
      out.key_unscale[warp] = ldexpf(1.0f, -fe);
      out.key_offset[warp] = -kc1 * sx;
      out.jl_unscale[warp] = ldexpf(2.0f, -je);
      out.jl_sum[warp] = sj;
    }
  }
  __syncthreads();
  // Element k of a k-step meets the word bit 8 (k % 4) + 4 (k / 16) + (k % 16) / 4, which B carries
  // scaled by 2^sigma, sigma = 4 (k / 16) + (k % 16) / 4; the query element is pre-divided by 2^sigma.
  // First each element's fixed-point value with its four balanced base-256 digits as bytes: with
  // digits d_i in [-128, 127], x + 0x80808080 has bytes d_i + 128, so the digit bytes are that ^ 0x80.
  for (int e = tid; e < kKeySteps * 4 * 32; e += kPrepareThreads) {
    const int step = e / 128, head = (e / 32) % 4, k = e % 32;
    const int sigma = 4 * (k / 16) + (k % 16) / 4, bit = 8 * (k % 4) + sigma;
    const float x = step < 8 ? q_rot[head][16 * step + bit / 2] * ((bit & 1) ? hi_coef : lo_coef)
                             : q_jl[head][32 * (step - 8) + bit];
    const int exponent = (step < 8 ? fix_exp[head] : jl_exp[head]) - sigma;  // in [-105, 100]: a normal float
    const int fixed = __float2int_rn(x * __int_as_float((127 + exponent) << 23));
    digits[step][head][k] = (std::uint32_t(fixed) + 0x80808080u) ^ 0x80808080u;
  }
  __syncthreads();
  // Register i of lane (g, t): row g + 8 (i & 1) (limb row / 4 of head row % 4), k = 16 (i >> 1) + 4 t + byte.
  for (int e = tid; e < kKeySteps * 32 * 4; e += kPrepareThreads) {
    const int step = e / 128, ln = (e / 4) % 32, i = e % 4;
    const int r = ln / 4 + 8 * (i & 1), limb = r / 4, head = r % 4, k0 = 16 * (i >> 1) + 4 * (ln % 4);
    const uint4 d = *reinterpret_cast<const uint4*>(&digits[step][head][k0]);
    const std::uint32_t sel = std::uint32_t(limb) | std::uint32_t(limb + 4) << 4;  // byte `limb` of each word
    const std::uint32_t lo = __byte_perm(d.x, d.y, sel), hi = __byte_perm(d.z, d.w, sel);
    reinterpret_cast<std::uint32_t*>(&out.a[step][ln])[i] = __byte_perm(lo, hi, 0x5410u);
  }
}

}  // namespace

void launch_mma_prepare(const AttendParams& a, cudaStream_t stream) {
  launch_dependent(prepare_key_fragments, dim3(unsigned(a.batch * a.n_queries * (a.H / 4))), dim3(kPrepareThreads),
                   stream, "TurboQuant query fragment kernel", a);
}

}  // namespace flashtq::cuda

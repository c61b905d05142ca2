// <q_rot, mu_b> of every (row, query head, key block) for the tensor-core decode (tq_decode_tc.cu), which adds
// a block's dot product to the scores of its timesteps.
//
// Four lanes per key block of one (row, kv head), each reading every fourth word of the block's D f16 mean and taking
// the group's queries from shared memory, staged up to kHeads at a time (eight lanes of a warp read each element: a
// broadcast); the four partial sums meet by shuffles. Parameters read in place (__grid_constant__), as the
// decode's are: the warp-per-block kernel before this one held the whole struct in local memory.
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/tq_attend.cuh"

namespace flashtq::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kHeads = 8;  // query heads per pass over the means
constexpr int kLanes = 4;  // lanes per key block, each a quarter of its dims (a thread per block left too few warps)
constexpr int kBlocksPerCta = kThreads / kLanes;

template <int D>
__global__ void __launch_bounds__(kThreads) key_mean_dots_kernel(const __grid_constant__ AttendParams a) {
  __shared__ float q[kHeads][D];
  const std::int64_t kvh = blockIdx.y, j = a.first_row + blockIdx.z;
  const std::int64_t G = a.H / a.l.n_kv_heads, blocks = a.key_mean_blocks;
  const int part = threadIdx.x % kLanes;  // this lane's words of the mean: part, part + 4, ...
  const std::int64_t block = std::int64_t(blockIdx.x) * kBlocksPerCta + threadIdx.x / kLanes;
  const bool live = block < blocks;
  constexpr int kWords = D / 2 / kLanes;  // f16 pairs of the mean per lane
  const std::uint32_t* mean = keys_of(a, j) + a.l.key_mean(kvh, (live ? block : 0) * a.l.key_block) + part;
  float* dots = a.key_mean_dots + (j * blocks + block) * a.H + kvh * G;  // a row's and block's heads side by side
  for (std::int64_t g0 = 0; g0 < G; g0 += kHeads) {
    const int heads = int(min(std::int64_t(kHeads), G - g0));
    __syncthreads();  // the previous pass has read q
    for (int e = threadIdx.x; e < heads * D; e += kThreads)
      q[e / D][e % D] = a.scratch[a.scratch_layout.q_rot(j, kvh * G + g0 + e / D) + e % D];
    __syncthreads();
    float dot[kHeads] = {};
#pragma unroll 4
    for (int w = 0; w < kWords; ++w) {
      const std::uint32_t word = mean[w * kLanes];
      const float lo = f16_low(word), hi = f16_low(word >> 16);
      const int d = 2 * (w * kLanes + part);  // the quad's lanes on neighbouring words: no bank conflicts
#pragma unroll
      for (int g = 0; g < kHeads; ++g) dot[g] = fmaf(q[g][d + 1], hi, fmaf(q[g][d], lo, dot[g]));
    }
#pragma unroll
    for (int g = 0; g < kHeads; ++g)
#pragma unroll
      for (int m = 1; m < kLanes; m *= 2) dot[g] += __shfl_xor_sync(0xFFFFFFFFu, dot[g], m);
    if (live && part == 0) {
#pragma unroll
      for (int g = 0; g < kHeads; ++g)
        if (g < heads) dots[g0 + g] = dot[g];
    }
  }
}

}  // namespace

void launch_key_mean_dots(const AttendParams& a, unsigned rows, cudaStream_t stream) {
  const dim3 grid(unsigned((a.key_mean_blocks + kBlocksPerCta - 1) / kBlocksPerCta), unsigned(a.l.n_kv_heads), rows);
  switch (a.l.head_dim) {
    case 64: key_mean_dots_kernel<64><<<grid, kThreads, 0, stream>>>(a); break;
    case 128: key_mean_dots_kernel<128><<<grid, kThreads, 0, stream>>>(a); break;
    case 256: key_mean_dots_kernel<256><<<grid, kThreads, 0, stream>>>(a); break;
    default: throw Error("backend", "cuda: internal error: no key block means kernel for this head_dim");
  }
  FLASHTQ_CUDA_CHECK_LAUNCH("TurboQuant key block means kernel");
}

}  // namespace flashtq::cuda

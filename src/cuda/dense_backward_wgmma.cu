// Dense backward on Hopper (sm_90a), f16/bf16, head_dim 64 and 128: wgmma products, TMA loads, two
// consumer warpgroups taking turns on the tensor cores and a producer warpgroup, as the forward
// (dense_wgmma.cu). Two kernels, no atomics, so the result is deterministic:
// - dK, dV: a block owns 128 keys of one kv head (64 per warpgroup) and walks every query tile of
//   64 rows that sees them, for every query head of the group (GQA's reduction stays in registers):
//   S^T = K Q^T and dP^T = V dO^T, then P^T and dS^T = P^T (dP^T - Delta) scale elementwise, then
//   dV += P^T dO and dK += dS^T Q with P^T and dS^T as register operands.
// - dQ: a block owns 128 query rows (64 per warpgroup) and walks the key tiles of 64 they see:
//   S = Q K^T and dP = dO V^T, then dQ += dS K.
// P comes from the forward's LSE (P = exp(S scale + mask - LSE)). A first kernel computes each row's
// Delta_i = <dO_i, O_i> and LSE in log2 units once, into the call's workspace (a float2 a row; allocated on
// the stream and freed after the last kernel when the caller gave none large enough): the dK/dV and dQ kernels
// read them there. Dropout decisions come from hash3.
// The kernels live in dense_backward_dkdv.cu and dense_backward_dq.cu; what they share in dense_backward_wgmma.cuh.
#include "cuda/dense_backward_wgmma.cuh"

namespace flashtq::cuda {
namespace {

using namespace backward_wgmma;

// Delta and lse2 of every row: D / 8 threads per row, 16 bytes each.
template <typename T, int D>
__global__ void stash_row_stats_kernel(BackwardCall c) {
  constexpr int kParts = D / 8;
  const DenseProblem& p = c.p;
  const std::int64_t id = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x, row = id / kParts;
  const int part = int(id % kParts);
  const bool valid = row < p.B * p.H * p.Sq;
  const std::int64_t i = row % p.Sq, h = (row / p.Sq) % p.H, b = row / p.Sq / p.H;
  float acc = 0.0f;
  if (valid) {
    const uint4 x =
        *reinterpret_cast<const uint4*>(static_cast<const T*>(c.dout.data) + row_offset(c.dout, b, i, h) + 8 * part);
    const uint4 y =
        *reinterpret_cast<const uint4*>(static_cast<const T*>(c.out.data) + row_offset(c.out, b, i, h) + 8 * part);
    const T* a = reinterpret_cast<const T*>(&x);
    const T* o = reinterpret_cast<const T*>(&y);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc = fmaf(to_float(a[e]), to_float(o[e]), acc);
  }
#pragma unroll
  for (int m = 1; m < kParts; m <<= 1) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, m);
  if (valid && part == 0) {
    const float lse = c.lse[p.lse_at(b, h, i)];
    *stash_of(c, b, i, h) = make_float2(lse == -INFINITY ? INFINITY : lse * kLog2e, acc);
  }
}

template <typename T, int D>
void launch_dim(const BackwardCall& c, const Maps& kv_maps, const Maps& q_maps, cudaStream_t stream) {
  const std::int64_t stash_threads = c.p.B * c.p.H * c.p.Sq * (D / 8);
  stash_row_stats_kernel<T, D><<<unsigned((stash_threads + 255) / 256), 256, 0, stream>>>(c);
  FLASHTQ_CUDA_CHECK_LAUNCH("dense backward row statistics");
  launch_dkdv<T, D>(c, kv_maps, stream);
  launch_dq<T, D>(c, q_maps, stream);
}

std::optional<Maps> maps_for(const BackwardCall& c, unsigned query_rows, unsigned key_rows) {
  const auto q = row_tile_map(c.q, query_rows), dout = row_tile_map(c.dout, query_rows);
  const auto k = row_tile_map(c.k, key_rows), v = row_tile_map(c.v, key_rows);
  if (!q || !k || !v || !dout) return std::nullopt;
  return Maps{*q, *k, *v, *dout};
}

}  // namespace

std::size_t dense_backward_wgmma_workspace(const BackwardCall& c) {
  return std::size_t(c.p.B * c.p.H * c.p.Sq) * sizeof(float2);
}

void launch_dense_backward_wgmma(const BackwardCall& call) {
  const auto kv_maps = maps_for(call, kQueryTile, kKvRows), q_maps = maps_for(call, kQRows, kKeyTile);
  if (!kv_maps || !q_maps)
    throw Error("backend", "cuda: no TMA map for views choose_dense_backward gave the wgmma kernels");
  auto stream = static_cast<cudaStream_t>(call.stream);
  BackwardCall c = call;
  const std::size_t bytes = dense_backward_wgmma_workspace(call);
  // The rows' statistics when the caller's workspace cannot hold them: freed on the stream after the kernels, or
  // when a launch throws.
  struct StreamScratch {
    void* data = nullptr;
    cudaStream_t stream;
    ~StreamScratch() {
      if (data != nullptr) cudaFreeAsync(data, stream);
    }
  } own{nullptr, stream};
  if (call.workspace == nullptr || call.workspace_bytes < bytes) {
    FLASHTQ_CUDA_CHECK(cudaMallocAsync(&own.data, bytes, stream));
    c.workspace = own.data;
    c.workspace_bytes = bytes;
  }
  const bool half = c.p.dtype == DType::f16;
  if (c.p.D == 64) {
    half ? launch_dim<__half, 64>(c, *kv_maps, *q_maps, stream)
         : launch_dim<__nv_bfloat16, 64>(c, *kv_maps, *q_maps, stream);
  } else {
    half ? launch_dim<__half, 128>(c, *kv_maps, *q_maps, stream)
         : launch_dim<__nv_bfloat16, 128>(c, *kv_maps, *q_maps, stream);
  }
}

}  // namespace flashtq::cuda

// dQ of the Hopper dense backward (its design: dense_backward_wgmma.cu).
#include "cuda/dense_backward_wgmma.cuh"

namespace flashtq::cuda::backward_wgmma {
namespace {

template <int D>
constexpr unsigned dq_shared_bytes() {
  return 2 * wgmma::swizzled_tile_bytes<D>(kQRows) + kDqStages * 2 * wgmma::swizzled_tile_bytes<D>(kKeyTile) +
         8 * (1 + 2 * kDqStages) + wgmma::kSwizzleAtomBytes;
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads, 1)
    dq_wgmma_kernel(BackwardCall c, const __grid_constant__ Maps maps, unsigned* unfinished) {
#ifdef FLASHTQ_WGMMA
  constexpr int kBlocks = D / 64, NT = kKeyTile / 8, DT = D / 8;
  constexpr unsigned kRowBytes = wgmma::swizzled_tile_bytes<D>(kQRows),
                     kKeyBytes = wgmma::swizzled_tile_bytes<D>(kKeyTile);
  const DenseProblem& p = c.p;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const unsigned q_tile = wgmma::swizzle_aligned(smem_raw), dout_tile = q_tile + kRowBytes;
  const unsigned stages = dout_tile + kRowBytes;  // stage s: K, V at stages + (2 s + {0, 1}) kKeyBytes
  const unsigned q_full = stages + kDqStages * 2 * kKeyBytes, full = q_full + 8, empty = full + 8 * kDqStages;
  const int tid = threadIdx.x, group = tid / 128;
  const std::int64_t bh = blockIdx.y, b = bh / p.H, h = bh % p.H, hk = h / p.group();
  const std::int64_t i0 = std::int64_t(gridDim.x - 1 - blockIdx.x) * kQRows;  // heaviest (causal) blocks first
  const core::KeyRange range = core::key_range(p, i0, min(i0 + kQRows, p.Sq));
  const std::int64_t first = range.begin / kKeyTile * kKeyTile;
  const int tiles = first < range.end ? int((range.end - first + kKeyTile - 1) / kKeyTile) : 0;
  const tma::Ring<kDqStages> ring{full, empty};
  if (tid == 0) tma::init_ring(q_full, full, empty, kDqStages, 1, 128 * kGroups);
  __syncthreads();

  if (group == kGroups) {  // producer
    wgmma::shrink_registers<kProducerRegisters>();
    if (tid % 128 != 0 || tiles == 0) return;
    tma::arrive_expect_bytes(q_full, 2 * kRowBytes);
    for (int cb = 0; cb < kBlocks; ++cb) {
      const unsigned off = cb * (kRowBytes / kBlocks);
      tma::load_4d(q_tile + off, maps.q, q_full, 64 * cb, int(h), int(i0), int(b));
      tma::load_4d(dout_tile + off, maps.dout, q_full, 64 * cb, int(h), int(i0), int(b));
    }
    for (int t = 0; t < tiles; ++t) {
      const int s = t % kDqStages;
      ring.wait_empty(t);
      const unsigned bar = ring.full_of(t);
      tma::arrive_expect_bytes(bar, 2 * kKeyBytes);
      const int jt = int(first) + t * kKeyTile;
      for (int cb = 0; cb < kBlocks; ++cb) {
        const unsigned off = cb * (kKeyBytes / kBlocks);
        tma::load_4d(stages + 2 * s * kKeyBytes + off, maps.k, bar, 64 * cb, int(hk), jt, int(b));
        tma::load_4d(stages + (2 * s + 1) * kKeyBytes + off, maps.v, bar, 64 * cb, int(hk), jt, int(b));
      }
    }
    return;
  }

  wgmma::grow_registers<kConsumerRegisters>();
  const int warp = (tid / 32) % 4, lane = tid % 32, g = lane / 4, tig = lane % 4;
  const float scale_log2 = p.scale * kLog2e, keep_scale = p.dropout_p > 0.0f ? 1.0f / (1.0f - p.dropout_p) : 1.0f;
  const int r_local = kGroupRows * group + 16 * warp + g;  // this thread's rows: r_local and r_local + 8
  const std::int64_t row0 = i0 + r_local;
  float dq[DT * 4] = {};
  if (tiles > 0) {
    const tma::WarpgroupTurns<kGroups> turns{group};  // turns on the tensor cores
    if (group == 1) turns.theirs();                   // warpgroup 0 goes first
    tma::wait(q_full, 0);
    // Delta and lse2 of the two rows, from the workspace.
    float delta[2], lse2[2];
#pragma unroll
    for (int pair = 0; pair < 2; ++pair) {
      const float2 st = row0 + 8 * pair < p.Sq ? *stash_of(c, b, row0 + 8 * pair, h) : make_float2(INFINITY, 0.0f);
      lse2[pair] = st.x;
      delta[pair] = st.y;
    }
    const std::uint64_t q_desc = wgmma::k_major(q_tile, group * kGroupRows);
    const std::uint64_t do_desc = wgmma::k_major(dout_tile, group * kGroupRows);
    auto k_tile_of = [&](int t) { return stages + 2 * unsigned(t % kDqStages) * kKeyBytes; };  // then V
    float sc[NT * 4], dp[NT * 4];
    std::uint32_t da[kKeyTile / 16][4];
    // S = Q K^T and dP = dO V^T of key tile t (64 rows x 64 keys each), issued.
    auto issue_scores = [&](int t) {
      const std::uint64_t k_desc = wgmma::k_major(k_tile_of(t), 0);
      const std::uint64_t v_desc = wgmma::k_major(k_tile_of(t) + kKeyBytes, 0);
      wgmma::mma_ss_rows<T, kKeyTile, D>(sc, q_desc, kRowBytes / kBlocks, k_desc, kKeyBytes / kBlocks);
      wgmma::mma_ss_rows<T, kKeyTile, D>(dp, do_desc, kRowBytes / kBlocks, v_desc, kKeyBytes / kBlocks);
    };
    // dQ += dS K of key tile t (K N-major: k-step kk is 16 keys further), issued.
    auto issue_gradient = [&](int t) {
      const std::uint64_t k_n = wgmma::n_major(k_tile_of(t), kKeyBytes / kBlocks);
      wgmma::mma_rs_rows<T, D, kKeyTile>(dq, da, k_n);
    };
    // dS of key tile t, packed as A fragments (16 keys per k-step).
    auto elementwise = [&](int t) {
      const std::int64_t jt = first + std::int64_t(t) * kKeyTile;
      const bool checked = !(i0 + kQRows <= p.Sq && jt >= range.begin && jt + kKeyTile <= p.Sk &&
                             core::tile_fully_visible(p, i0, i0 + kQRows, jt, jt + kKeyTile));
      const bool plain = !checked && p.mask == nullptr && p.dropout_p == 0.0f && p.softcap == 0.0f;
      if (plain) {  // two loops, so that the common one stays short and branch-free
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
          for (int pair = 0; pair < 2; ++pair) {
            const int x = 4 * nt + 2 * pair;
            const float p0 = fminf(exp2_approx(sc[x] * scale_log2 - lse2[pair]), 1.0f),
                        p1 = fminf(exp2_approx(sc[x + 1] * scale_log2 - lse2[pair]), 1.0f);
            da[nt / 2][(nt % 2) * 2 + pair] = pack2<T>(p0 * (dp[x] - delta[pair]), p1 * (dp[x + 1] - delta[pair]));
          }
        }
        return;
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int pair = 0; pair < 2; ++pair) {
          const int x = 4 * nt + 2 * pair;
          const std::int64_t i = row0 + 8 * pair, j = jt + nt * 8 + 2 * tig;
          const float d0 =
              score_grads(p, sc[x], dp[x], lse2[pair], delta[pair], b, h, i, j, checked, scale_log2, keep_scale).ds;
          const float d1 = score_grads(p, sc[x + 1], dp[x + 1], lse2[pair], delta[pair], b, h, i, j + 1, checked,
                                       scale_log2, keep_scale)
                               .ds;
          da[nt / 2][(nt % 2) * 2 + pair] = pack2<T>(d0, d1);
        }
      }
    };
    // One turn per key tile: dQ of tile t with the scores of tile t + 1 (faster than two turns per
    // tile, at 64 keys and at 128; docs/benchmarks.md).
    ring.wait_full(0);
    turns.mine();
    wgmma::fence();
    issue_scores(0);
    wgmma::commit();
    turns.theirs();
    wgmma::wait<0>();
    elementwise(0);
    for (int t = 0; t + 1 < tiles; ++t) {
      ring.wait_full(t + 1);
      turns.mine();
      wgmma::fence();
      issue_gradient(t);
      issue_scores(t + 1);
      wgmma::commit();
      turns.theirs();
      wgmma::wait<0>();
      ring.release(t);
      elementwise(t + 1);
    }
    turns.mine();
    wgmma::fence();
    issue_gradient(tiles - 1);
    wgmma::commit();
    if (group == 0) turns.theirs();  // balanced: warpgroup 1 gave one turn away at the start
    wgmma::wait<0>();
  }
  bool bad = false;  // dQ = dS K meets the NaN of a key the row does not see through dS = 0
#pragma unroll
  for (int pair = 0; pair < 2; ++pair) {
    const std::int64_t i = row0 + 8 * pair;
    if (i >= p.Sq) continue;
    T* row = static_cast<T*>(c.dq.data) + row_offset(c.dq, b, i, h);
#pragma unroll
    for (int nt = 0; nt < DT; ++nt) {
      const float x0 = dq[4 * nt + 2 * pair] * p.scale, x1 = dq[4 * nt + 2 * pair + 1] * p.scale;
      bad |= !isfinite(x0) || !isfinite(x1);
      row[nt * 8 + 2 * tig] = from_float<T>(x0);
      row[nt * 8 + 2 * tig + 1] = from_float<T>(x1);
    }
  }
  raise_unfinished(unfinished, bad);
#endif
}

}  // namespace

template <typename T, int D>
void launch_dq(const BackwardCall& c, const Maps& maps, cudaStream_t stream) {
  constexpr int smem = int(dq_shared_bytes<D>());
  allow_shared_bytes<dq_wgmma_kernel<T, D>>(smem);
  const dim3 grid(unsigned((c.p.Sq + kQRows - 1) / kQRows), unsigned(c.p.B * c.p.H));
  dq_wgmma_kernel<T, D><<<grid, kThreads, smem, stream>>>(c, maps, unfinished_rows_flag());
  FLASHTQ_CUDA_CHECK_LAUNCH("dense backward dQ (wgmma)");
}

static_assert(tiles::kWgmmaBackwardDims.size() == 2 && tiles::kWgmmaBackwardDims[0] == 64 &&
                  tiles::kWgmmaBackwardDims[1] == 128,
              "the instantiations below");
template void launch_dq<__half, 64>(const BackwardCall&, const Maps&, cudaStream_t);
template void launch_dq<__half, 128>(const BackwardCall&, const Maps&, cudaStream_t);
template void launch_dq<__nv_bfloat16, 64>(const BackwardCall&, const Maps&, cudaStream_t);
template void launch_dq<__nv_bfloat16, 128>(const BackwardCall&, const Maps&, cudaStream_t);

}  // namespace flashtq::cuda::backward_wgmma

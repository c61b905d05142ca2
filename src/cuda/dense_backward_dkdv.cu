// dK and dV of the Hopper dense backward (its design: dense_backward_wgmma.cu).
#include "cuda/dense_backward_wgmma.cuh"

namespace flashtq::cuda::backward_wgmma {
namespace {

template <int D>
constexpr unsigned dkdv_shared_bytes() {
  return 2 * wgmma::swizzled_tile_bytes<D>(kKvRows) +
         kStages * 2 * wgmma::swizzled_tile_bytes<D>(kQueryTile)  // K, V; (Q, dO) stages
         + kStages * kQueryTile * 8                               // (lse2, delta) per stage
         + 8 * (1 + 2 * kStages) + wgmma::kSwizzleAtomBytes;      // barriers; alignment
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads, 1) dkdv_wgmma_kernel(BackwardCall c, const __grid_constant__ Maps maps) {
#ifdef FLASHTQ_WGMMA
  constexpr int kBlocks = D / 64, NT = kQueryTile / 8, DT = D / 8;
  constexpr unsigned kKvBytes = wgmma::swizzled_tile_bytes<D>(kKvRows),
                     kQBytes = wgmma::swizzled_tile_bytes<D>(kQueryTile);
  const DenseProblem& p = c.p;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const unsigned k_tile = wgmma::swizzle_aligned(smem_raw), v_tile = k_tile + kKvBytes;
  const unsigned stages = v_tile + kKvBytes;              // stage s: Q, dO at stages + (2 s + {0, 1}) kQBytes
  const unsigned stats = stages + kStages * 2 * kQBytes;  // float2 (lse2, delta)[stage][row]
  const unsigned kv_full = stats + kStages * kQueryTile * 8, full = kv_full + 8, empty = full + 8 * kStages;
  const int tid = threadIdx.x, group = tid / 128;
  const std::int64_t bh = blockIdx.y, b = bh / p.Hkv, hk = bh % p.Hkv, G = p.group();
  const std::int64_t j0 = std::int64_t(blockIdx.x) * kKvRows;
  const core::KeyRange rows = core::row_range(p, j0, min(j0 + kKvRows, p.Sk));
  const std::int64_t first = rows.begin / kQueryTile * kQueryTile;
  const int per_head = rows.begin < rows.end ? int((rows.end - first + kQueryTile - 1) / kQueryTile) : 0;
  const int tiles = per_head * int(G);
  auto tile_row = [&](int t) { return first + std::int64_t(t % per_head) * kQueryTile; };
  auto tile_head = [&](int t) { return hk * G + t / per_head; };
  // "full": the producer warp's 32 lanes (stats stored), lane 0 also with the copies' bytes.
  const tma::Ring<kStages> ring{full, empty};
  if (tid == 0) tma::init_ring(kv_full, full, empty, kStages, 32, 128 * kGroups);
  __syncthreads();

  if (group == kGroups) {  // producer: one warp; lane 0 issues the copies, every lane stashes stats
    wgmma::shrink_registers<kProducerRegisters>();
    if (tid >= 128 * kGroups + 32 || tiles == 0) return;
    const int lane = tid % 32;
    if (lane == 0) {
      tma::arrive_expect_bytes(kv_full, 2 * kKvBytes);
      for (int cb = 0; cb < kBlocks; ++cb) {
        tma::load_4d(k_tile + cb * (kKvBytes / kBlocks), maps.k, kv_full, 64 * cb, int(hk), int(j0), int(b));
        tma::load_4d(v_tile + cb * (kKvBytes / kBlocks), maps.v, kv_full, 64 * cb, int(hk), int(j0), int(b));
      }
    }
    for (int t = 0; t < tiles; ++t) {
      const int s = t % kStages;
      ring.wait_empty(t);
      const std::int64_t i0 = tile_row(t), h = tile_head(t);
      for (int r = lane; r < kQueryTile; r += 32) {
        const float2 st = i0 + r < p.Sq ? *stash_of(c, b, i0 + r, h) : make_float2(INFINITY, 0.0f);
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(stats + unsigned(s * kQueryTile + r) * 8), "f"(st.x),
                     "f"(st.y)
                     : "memory");
      }
      const unsigned bar = ring.full_of(t);
      if (lane != 0) {
        tma::arrive(bar);
        continue;
      }
      tma::arrive_expect_bytes(bar, 2 * kQBytes);
      const unsigned dst = stages + 2 * s * kQBytes;
      for (int cb = 0; cb < kBlocks; ++cb) {
        const unsigned off = cb * (kQBytes / kBlocks);
        tma::load_4d(dst + off, maps.q, bar, 64 * cb, int(h), int(i0), int(b));
        tma::load_4d(dst + kQBytes + off, maps.dout, bar, 64 * cb, int(h), int(i0), int(b));
      }
    }
    return;
  }

  wgmma::grow_registers<kConsumerRegisters>();
  const int warp = (tid / 32) % 4, lane = tid % 32, g = lane / 4, tig = lane % 4;
  const float scale_log2 = p.scale * kLog2e, keep_scale = p.dropout_p > 0.0f ? 1.0f / (1.0f - p.dropout_p) : 1.0f;
  // This thread's accumulator rows are keys j0 + 64 group + 16 warp + g (+ 8); columns query rows.
  const std::int64_t key0 = j0 + kGroupRows * group + 16 * warp + g;
  float dk[DT * 4] = {}, dv[DT * 4] = {};
  // K and V rows of this warpgroup as A operands (K-major): k-step kk at column block kk / 4.
  const std::uint64_t k_desc = wgmma::k_major(k_tile, group * kGroupRows);
  const std::uint64_t v_desc = wgmma::k_major(v_tile, group * kGroupRows);
  const tma::WarpgroupTurns<kGroups> turns{group};                                       // turns on the tensor cores
  auto q_tile_of = [&](int t) { return stages + 2 * unsigned(t % kStages) * kQBytes; };  // then dO
  float st[NT * 4], dpt[NT * 4];
  std::uint32_t pa[kQueryTile / 16][4], da[kQueryTile / 16][4];
  // S^T = K Q^T and dP^T = V dO^T of tile t (64 keys x 64 rows each), issued.
  auto issue_scores = [&](int t) {
    const std::uint64_t q_desc = wgmma::k_major(q_tile_of(t), 0);
    const std::uint64_t do_desc = wgmma::k_major(q_tile_of(t) + kQBytes, 0);
    wgmma::mma_ss_rows<T, kQueryTile, D>(st, k_desc, kKvBytes / kBlocks, q_desc, kQBytes / kBlocks);
    wgmma::mma_ss_rows<T, kQueryTile, D>(dpt, v_desc, kKvBytes / kBlocks, do_desc, kQBytes / kBlocks);
  };
  // dV += P^T dO and dK += dS^T Q of tile t (dO and Q N-major: k-step kk is 16 rows further), issued.
  auto issue_gradients = [&](int t) {
    const std::uint64_t q_n = wgmma::n_major(q_tile_of(t), kQBytes / kBlocks);
    const std::uint64_t do_n = wgmma::n_major(q_tile_of(t) + kQBytes, kQBytes / kBlocks);
    wgmma::mma_rs_rows<T, D, kQueryTile>(dv, pa, do_n);
    wgmma::mma_rs_rows<T, D, kQueryTile>(dk, da, q_n);
  };
  // P^T (with dropout) and dS^T of tile t, packed as A fragments (16 query rows per k-step).
  auto elementwise = [&](int t) {
    const std::int64_t i0 = tile_row(t), h = tile_head(t);
    const unsigned tile_stats = stats + unsigned((t % kStages) * kQueryTile) * 8;
    const bool checked = !(i0 + kQueryTile <= p.Sq && j0 + kKvRows <= p.Sk &&
                           core::tile_fully_visible(p, i0, i0 + kQueryTile, j0, j0 + kKvRows));
    // The common case, one exp2 per score.
    const bool plain = !checked && p.mask == nullptr && p.dropout_p == 0.0f && p.softcap == 0.0f;
    // (lse2, delta) of this thread's two columns of n-tile nt: rows 8 nt + 2 tig and + 1.
    auto column_stats = [&](int nt) {
      float4 st4;
      asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                   : "=f"(st4.x), "=f"(st4.y), "=f"(st4.z), "=f"(st4.w)
                   : "r"(tile_stats + unsigned(nt * 8 + 2 * tig) * 8));
      return st4;
    };
    // Accumulator (nt, pair) holds A fragment register (nt % 2) * 2 + pair of k-step nt / 2; pair 0 is
    // row g, pair 1 row g + 8. Two loops, so that the common one stays short and branch-free.
    if (plain) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const float4 cs = column_stats(nt);
#pragma unroll
        for (int pair = 0; pair < 2; ++pair) {
          const int x = 4 * nt + 2 * pair;
          const float p0 = fminf(exp2_approx(st[x] * scale_log2 - cs.x), 1.0f),
                      p1 = fminf(exp2_approx(st[x + 1] * scale_log2 - cs.z), 1.0f);
          pa[nt / 2][(nt % 2) * 2 + pair] = pack2<T>(p0, p1);
          da[nt / 2][(nt % 2) * 2 + pair] = pack2<T>(p0 * (dpt[x] - cs.y), p1 * (dpt[x + 1] - cs.w));
        }
      }
      return;
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const float4 cs = column_stats(nt);
#pragma unroll
      for (int pair = 0; pair < 2; ++pair) {
        const int x = 4 * nt + 2 * pair;
        const std::int64_t i = i0 + nt * 8 + 2 * tig, j = key0 + 8 * pair;
        const ScoreGrads g0 = score_grads(p, st[x], dpt[x], cs.x, cs.y, b, h, i, j, checked, scale_log2, keep_scale);
        const ScoreGrads g1 =
            score_grads(p, st[x + 1], dpt[x + 1], cs.z, cs.w, b, h, i + 1, j, checked, scale_log2, keep_scale);
        pa[nt / 2][(nt % 2) * 2 + pair] = pack2<T>(g0.p_kept, g1.p_kept);
        da[nt / 2][(nt % 2) * 2 + pair] = pack2<T>(g0.ds, g1.ds);
      }
    }
  };
  if (tiles > 0) {
    // Two turns on the tensor cores per tile, scores then gradients. (One turn holding the gradients
    // of tile t with the scores of tile t + 1, as dQ does, needs more than 240 registers here: ptxas
    // then serialises the products.)
    if (group == 1) turns.theirs();  // warpgroup 0 goes first
    tma::wait(kv_full, 0);
    for (int t = 0; t < tiles; ++t) {
      ring.wait_full(t);
      turns.mine();
      wgmma::fence();
      issue_scores(t);
      wgmma::commit();
      turns.theirs();
      wgmma::wait<0>();
      elementwise(t);
      turns.mine();
      wgmma::fence();
      issue_gradients(t);
      wgmma::commit();
      if (t + 1 < tiles || group == 0) turns.theirs();  // balanced: warpgroup 1 gave one turn away at the start
      wgmma::wait<0>();
      ring.release(t);
    }
  }
  // Store: row key0 (+ 8) of dK and dV, columns 8 nt + 2 tig (+ 1).
#pragma unroll
  for (int pair = 0; pair < 2; ++pair) {
    const std::int64_t j = key0 + 8 * pair;
    if (j >= p.Sk) continue;
    T* dk_row = static_cast<T*>(c.dk.data) + row_offset(c.dk, b, j, hk);
    T* dv_row = static_cast<T*>(c.dv.data) + row_offset(c.dv, b, j, hk);
#pragma unroll
    for (int nt = 0; nt < DT; ++nt) {
      const int d0 = nt * 8 + 2 * tig;
      dk_row[d0] = from_float<T>(dk[4 * nt + 2 * pair] * p.scale);
      dk_row[d0 + 1] = from_float<T>(dk[4 * nt + 2 * pair + 1] * p.scale);
      dv_row[d0] = from_float<T>(dv[4 * nt + 2 * pair]);
      dv_row[d0 + 1] = from_float<T>(dv[4 * nt + 2 * pair + 1]);
    }
  }
#endif
}

}  // namespace

template <typename T, int D>
void launch_dkdv(const BackwardCall& c, const Maps& maps, cudaStream_t stream) {
  constexpr int smem = int(dkdv_shared_bytes<D>());
  allow_shared_bytes<dkdv_wgmma_kernel<T, D>>(smem);
  const dim3 grid(unsigned((c.p.Sk + kKvRows - 1) / kKvRows), unsigned(c.p.B * c.p.Hkv));
  dkdv_wgmma_kernel<T, D><<<grid, kThreads, smem, stream>>>(c, maps);
  FLASHTQ_CUDA_CHECK_LAUNCH("dense backward dK dV (wgmma)");
}

static_assert(tiles::kWgmmaBackwardDims.size() == 2 && tiles::kWgmmaBackwardDims[0] == 64 &&
                  tiles::kWgmmaBackwardDims[1] == 128,
              "the instantiations below");
template void launch_dkdv<__half, 64>(const BackwardCall&, const Maps&, cudaStream_t);
template void launch_dkdv<__half, 128>(const BackwardCall&, const Maps&, cudaStream_t);
template void launch_dkdv<__nv_bfloat16, 64>(const BackwardCall&, const Maps&, cudaStream_t);
template void launch_dkdv<__nv_bfloat16, 128>(const BackwardCall&, const Maps&, cudaStream_t);

}  // namespace flashtq::cuda::backward_wgmma

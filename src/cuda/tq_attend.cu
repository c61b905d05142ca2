// Attention over the packed TurboQuant cache on CUDA (decode and chunked prefill): the key
// sequence is split across blocks (flash-decoding); each block scores its tokens straight from
// the packed words for a tile of the GQA group's query heads, accumulates values in rotated
// space, and a merge kernel combines the splits by their LSEs and rotates back once.
#include <cuda_fp16.h>

#include <algorithm>
#include <limits>

#include "core/packing.hpp"
#include "core/tq_outliers.hpp"
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"
#include "cuda/launch.hpp"
#include "cuda/tq_attend.cuh"

namespace flashtq::cuda {
namespace {

constexpr int kThreads = 128;

template <int D, int HT>
__global__ void __launch_bounds__(kThreads) attend_partial(AttendParams a) {
  __shared__ float q_rot[HT][D], q_jl[HT][D], q_sum[HT];
  __shared__ float p[HT][kSplitTokens], v_norm[kSplitTokens];
  __shared__ float kc[16], vc[16], oc[16], row_max[HT], row_sum[HT];
  __shared__ int exact_row[kSplitTokens];  // the exact copy each timestep is read from, or -1 for its codes
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int split = blockIdx.x;
  const std::int64_t kvh = blockIdx.y / a.n_tiles, j = a.first_row + blockIdx.z;  // row b * n_queries + j of the batch
  const std::uint32_t* keys = keys_of(a, j);
  const std::uint32_t* values = values_of(a, j);
  const TqSequence sq = sequence_of(a, j);
  const std::int64_t G = a.H / a.l.n_kv_heads, h0 = kvh * G + (blockIdx.y % a.n_tiles) * HT;
  const std::int64_t t0 = std::int64_t(split) * kSplitTokens;
  const std::int64_t visible = seq_len_of(a, j) - t0, first = first_visible_of(a, j);
  // A split that ends before the window's start is empty (with max_seq below the start, every split
  // is); one that straddles the start masks its early keys.
  const int count = visible <= 0 ? 0 : visible >= kSplitTokens ? kSplitTokens : int(visible);
  const int n = t0 + count <= first ? 0 : count;
  float* ws = a.ws + ((j * a.H + h0) * a.n_splits + split) * partial_stride(D);
  if (n == 0) {  // nothing to see in this split: an empty partial
    if (tid < HT) {
      ws[tid * a.n_splits * partial_stride(D)] = -INFINITY;
      ws[tid * a.n_splits * partial_stride(D) + 1] = 0.0f;
    }
    return;
  }
  for (int i = tid; i < HT * D; i += kThreads) {
    q_rot[i / D][i % D] = a.scratch[a.scratch_layout.q_rot(j, h0 + i / D) + i % D];
    q_jl[i / D][i % D] = a.scratch[a.scratch_layout.q_jl(j, h0 + i / D) + i % D];
  }
  if (tid < HT) q_sum[tid] = a.scratch[a.scratch_layout.sum(j, h0 + tid)];
  if (tid < 16) {
    kc[tid] = a.key_centroids[tid];
    vc[tid] = a.value_centroids[tid];
    oc[tid] = a.outlier_centroids[tid];
  }
  __syncthreads();

  const TqLayout& l = a.l;
  const int kb = l.key_bits, vb = l.value_bits;
  TqLayout::KeyPart parts[core::kMaxKeyParts];  // keys with outlier channels: the parts, once per block
  const int n_parts = l.key_outliers ? l.key_parts() : 0;
  for (int part = 0; part < n_parts; ++part) parts[part] = l.key_part(part);
  const std::int64_t end = sequence_end_of(a, j);
  // Block means (docs/turboquant_layout.md): <q_rot, mu_b> of each key block this split touches, once per head,
  // and later the weight each value block's mean gets. A split starts on a multiple of kSplitTokens, so it
  // touches at most kSplitTokens / 8 blocks.
  constexpr int kMaxBlocks = kSplitTokens / 8;
  __shared__ float key_mean_dot[HT][kMaxBlocks], value_weight[HT][kMaxBlocks];
  const int kg = l.key_block, vg = l.value_block;
  const std::int64_t kb0 = kg ? t0 / kg : 0, vb0 = vg ? t0 / vg : 0;
  const int n_kblocks = kg ? int((t0 + n - 1) / kg - kb0 + 1) : 0;
  const int n_vblocks = vg ? int((t0 + n - 1) / vg - vb0 + 1) : 0;
  for (int i = tid; i < HT * n_kblocks; i += kThreads) {
    const int g = i / n_kblocks, bi = i % n_kblocks;
    const std::uint32_t* mean = keys + l.key_mean(kvh, sq.timestep((kb0 + bi) * kg));
    float dot = 0.0f;
    for (int w = 0; w < D / 2; ++w) {
      const std::uint32_t word = mean[w];
      dot = fmaf(q_rot[g][2 * w + 1], f16_low(word >> 16), fmaf(q_rot[g][2 * w], f16_low(word), dot));
    }
    key_mean_dot[g][bi] = dot;
  }
  if (kg) __syncthreads();
  for (int tt = tid; tt < n; tt += kThreads) {
    const std::int64_t slot = kvh * l.capacity + sq.timestep(t0 + tt);
    const int er = int(l.exact_row(t0 + tt, end));
    exact_row[tt] = er;
    if (er >= 0) {  // a sink or recent timestep: its exact rotated row, bf16 pairs
      const std::uint32_t* k = keys + l.key_exact_offset() + l.exact_row_at(sq.exact_set, kvh, er);
      float dot[HT] = {};
      for (int w = 0; w < D / 2; ++w) {
        const std::uint32_t word = k[w];
        const float lo = __uint_as_float(word << 16), hi = __uint_as_float(word & 0xFFFF0000u);
#pragma unroll
        for (int g = 0; g < HT; ++g) dot[g] = fmaf(q_rot[g][2 * w + 1], hi, fmaf(q_rot[g][2 * w], lo, dot[g]));
      }
#pragma unroll
      for (int g = 0; g < HT; ++g) p[g][tt] = t0 + tt < first ? -INFINITY : a.scale * dot[g];
      v_norm[tt] = 1.0f;
      continue;
    }
    if (l.key_outliers) {  // part by part: each part's norm half times its codes' dot (docs/turboquant_layout.md)
      const std::uint32_t* codes = keys + slot * l.key_code_words();
      const std::uint32_t* norms = keys + l.key_norm_offset() + slot * l.key_norm_words();
      float score[HT] = {};
      for (int part = 0; part < n_parts; ++part) {
        const TqLayout::KeyPart& kp = parts[part];
        const float* cent = part == 0 ? oc : kc;
        float dot[HT] = {};
        for (int i = 0; i < kp.size; ++i) {
          const float c = cent[core::get_bits(codes, kp.bit_offset + std::int64_t(i) * kp.bits, kp.bits)];
#pragma unroll
          for (int g = 0; g < HT; ++g) dot[g] = fmaf(q_rot[g][kp.offset + i], c, dot[g]);
        }
        const float half = f16_low(norms[part / 2] >> (16 * (part % 2)));
#pragma unroll
        for (int g = 0; g < HT; ++g) score[g] = fmaf(half, dot[g], score[g]);
      }
      const int kbi = kg ? int((t0 + tt) / kg - kb0) : 0;
#pragma unroll
      for (int g = 0; g < HT; ++g)
        p[g][tt] = t0 + tt < first ? -INFINITY : a.scale * (score[g] + (kg ? key_mean_dot[g][kbi] : 0.0f));
      v_norm[tt] = f16_low(values[l.value_norm_offset() + slot]);
      continue;
    }
    const std::uint32_t nw = keys[l.key_norm_offset() + slot];
    const float norm = f16_low(nw), gamma = f16_low(nw >> 16);
    const std::uint32_t* codes = keys + slot * (D * kb / 32);
    const std::uint32_t* jl = keys + l.key_jl_offset() + slot * (D / 32);
    float polar[HT] = {}, positive[HT] = {};
    for (int d = 0; d < D; ++d) {
      const float c = kc[core::get_code(codes, d, kb)];
      const bool bit = l.qjl && ((jl[d / 32] >> (d % 32)) & 1u);  // no jl words without QJL
#pragma unroll
      for (int g = 0; g < HT; ++g) {
        polar[g] = fmaf(q_rot[g][d], c, polar[g]);
        if (bit) positive[g] += q_jl[g][d];
      }
    }
    const int kbi = kg ? int((t0 + tt) / kg - kb0) : 0;
#pragma unroll
    for (int g = 0; g < HT; ++g) {
      const float score = norm * (polar[g] + gamma * a.qjl_scale * (2.0f * positive[g] - q_sum[g]));
      p[g][tt] = t0 + tt < first ? -INFINITY : a.scale * (kg ? score + key_mean_dot[g][kbi] : score);
    }
    v_norm[tt] = f16_low(values[l.value_norm_offset() + slot]);
  }
  __syncthreads();
  // Softmax statistics per head (warp g handles heads g, g + 4, ...); p becomes exp(s - max).
  for (int g = warp; g < HT; g += kThreads / 32) {
    if (a.softcap > 0.0f)
      for (int tt = lane; tt < n; tt += 32) p[g][tt] = capped_score(p[g][tt], a.softcap);
    float m = -INFINITY;
    for (int tt = lane; tt < n; tt += 32) m = fmaxf(m, p[g][tt]);
    m = warp_max(m);
    float s = 0.0f;
    for (int tt = lane; tt < n; tt += 32) {
      const float e = expf(p[g][tt] - m);
      p[g][tt] = vg ? e : e * v_norm[tt];  // with value means the norm goes with the codes (below)
      s += e;
    }
    s = warp_sum(s);
    if (lane == 0) {
      row_max[g] = m;
      row_sum[g] = s;
    }
  }
  __syncthreads();
  for (int i = tid; i < HT * n_vblocks; i += kThreads) {  // each value block's weight: its coded timesteps' p
    const int g = i / n_vblocks, bi = i % n_vblocks;
    const std::int64_t from = std::max<std::int64_t>(0, (vb0 + bi) * vg - t0),
                       to = min(std::int64_t(n), (vb0 + bi + 1) * vg - t0);
    float w = 0.0f;
    for (std::int64_t tt = from; tt < to; ++tt)
      if (exact_row[tt] < 0) w += p[g][tt];
    value_weight[g][bi] = w;
  }
  if (vg) __syncthreads();
  // Values, still rotated: thread owns dims tid, tid + 128.
  constexpr int R = (D + kThreads - 1) / kThreads;
  float acc[HT][R] = {};
  const int value_words = D * vb / 32;
  for (int tt = 0; tt < n; ++tt) {
    const std::uint32_t* codes = values + (kvh * l.capacity + sq.timestep(t0 + tt)) * value_words;
    const int er = exact_row[tt];
    const unsigned short* exact = reinterpret_cast<const unsigned short*>(
        values + l.value_exact_offset() + l.exact_row_at(sq.exact_set, kvh, er < 0 ? 0 : er));
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int d = tid + r * kThreads;
      if (d < D) {
        const float c = er >= 0 ? __uint_as_float(std::uint32_t(exact[d]) << 16)
                        : vg    ? v_norm[tt] * vc[core::get_code(codes, d, vb)]
                                : vc[core::get_code(codes, d, vb)];
#pragma unroll
        for (int g = 0; g < HT; ++g) acc[g][r] = fmaf(p[g][tt], c, acc[g][r]);
      }
    }
  }
  for (int bi = 0; bi < n_vblocks; ++bi) {  // the value blocks' means, once each
    const std::uint32_t* mean = values + l.value_mean(kvh, sq.timestep((vb0 + bi) * vg));
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int d = tid + r * kThreads;
      if (d < D) {
        const float mu = f16_low(mean[d / 2] >> (16 * (d % 2)));
#pragma unroll
        for (int g = 0; g < HT; ++g) acc[g][r] = fmaf(value_weight[g][bi], mu, acc[g][r]);
      }
    }
  }
#pragma unroll
  for (int g = 0; g < HT; ++g) {
    float* w = ws + g * a.n_splits * partial_stride(D);
    if (tid == 0) {
      w[0] = row_max[g];
      w[1] = row_sum[g];
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int d = tid + r * kThreads;
      if (d < D) w[kPartialHeader + d] = acc[g][r];
    }
  }
}

// One block per (query row, head): merge the splits by LSE, normalise, rotate back, store. The
// block's maximum comes first, from all its threads at once; then each warp takes every 32nd split,
// its lanes reading the accumulators as float4, so a long context's hundreds of partials cost a few
// memory latencies rather than one per split.
constexpr int kMergeThreads = 1024, kMergeWarps = kMergeThreads / 32;

template <int D>
__global__ void __launch_bounds__(kMergeThreads) attend_merge(AttendParams a) {
  constexpr int kVectors = D / 4, kPerLane = (kVectors + 31) / 32;  // float4s of a partial, per lane
  constexpr int kStride = partial_stride(D);
  __shared__ __align__(16) float x[kMergeWarps][D];
  __shared__ float warp_best[kMergeWarps], warp_sum_l[kMergeWarps], block_max;
  wait_for_previous_grid();  // the partials
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const std::int64_t row = blockIdx.x, z = row / a.H, h = row % a.H;
  const std::int64_t b = z / a.n_queries, j = z % a.n_queries;
  const float* ws = a.ws + row * a.n_splits * kStride;
  // Head h's sink logit (docs/spec.md §1.9): one more partial, with no value.
  const float sink = a.sinks != nullptr ? a.sinks[h] : -INFINITY;
  float best = sink;
  for (int s = tid; s < a.n_splits; s += kMergeThreads) best = fmaxf(best, ws[s * kStride]);
  best = warp_max(best);
  if (lane == 0) warp_best[warp] = best;
  __syncthreads();
  if (warp == 0) {
    const float m = warp_max(warp_best[lane]);
    if (lane == 0) block_max = m;
  }
  __syncthreads();
  const float M = block_max;
  // Lane l owns float4s l, l + 32, ... (dims 4 l .. 4 l + 3, ...) of this warp's splits.
  float l = 0.0f;
  float4 acc[kPerLane];
  for (float4& v : acc) v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (M != -INFINITY) {
#pragma unroll 4
    for (int s = warp; s < a.n_splits; s += kMergeWarps) {
      const float* w = ws + s * kStride;
      if (w[1] == 0.0f) continue;  // an empty split writes only its header: its accumulators are garbage
      const float f = __expf(w[0] - M);
      l = fmaf(w[1], f, l);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int c = lane + 32 * i;
        if (c < kVectors) {
          const float4 v = reinterpret_cast<const float4*>(w + kPartialHeader)[c];
          acc[i].x = fmaf(v.x, f, acc[i].x), acc[i].y = fmaf(v.y, f, acc[i].y);
          acc[i].z = fmaf(v.z, f, acc[i].z), acc[i].w = fmaf(v.w, f, acc[i].w);
        }
      }
    }
  }
  if (lane == 0) warp_sum_l[warp] = l;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    if (lane + 32 * i < kVectors) reinterpret_cast<float4*>(x[warp])[lane + 32 * i] = acc[i];
  }
  __syncthreads();
  if (tid >= D) return;
  const int d = tid;
  float L = sink == -INFINITY ? 0.0f : __expf(sink - M), total = 0.0f;
  for (int i = 0; i < kMergeWarps; ++i) {
    L += warp_sum_l[i];
    total += x[i][d];
  }
  // The first D threads alone from here on: they rotate back with named barriers of D threads (row 0
  // of x is theirs once every thread has read its column above).
  float* y = x[0];
  asm volatile("bar.sync 1, %0;" ::"r"(D));
  y[d] = L > 0.0f ? total / L : 0.0f;  // a row that sees no timestep writes zeros
  for (int len = 1; len < D; len <<= 1) {
    asm volatile("bar.sync 1, %0;" ::"r"(D));
    const float mine = y[d], other = y[d ^ len];
    asm volatile("bar.sync 1, %0;" ::"r"(D));
    y[d] = (d & len) ? other - mine : mine + other;
  }
  const float sign = ((a.polar_signs[d / 32] >> (d % 32)) & 1u) ? -1.0f : 1.0f;
  a.out[b * a.out_batch_stride + j * a.out_row_stride + h * a.out_head_stride + d] =
      y[d] * (1.0f / sqrtf(float(D))) * sign;
}

int head_tile(std::int64_t group) { return group % 4 == 0 ? 4 : group % 2 == 0 ? 2 : 1; }

// Query heads per block: decode_tc takes up to kTcHeads of a group (the last block of a larger group fewer),
// the other kernels a tile that divides the group.
bool is_mma_decode(TqAttendKernel kernel) {
  return kernel == TqAttendKernel::decode_mma || kernel == TqAttendKernel::decode_mma_bf16;
}

int heads_per_block(const TqAttendCall& c, TqAttendKernel kernel) {
  return kernel == TqAttendKernel::decode_tc ? int(std::min<std::int64_t>(kTcHeads, c.group())) : head_tile(c.group());
}

// Timesteps per block. The tensor-core decode kernels pay a fixed cost per block (the query fragments or
// tables, the cross-warp combine, one partial for the merge), so they take longer splits while the grid still
// gives every SM at least 4 blocks. Where that leaves decode_tc at its shortest split (a small batch), the fixed cost
// dominates: it takes instead the split whose blocks, in whole waves of the blocks the GPU holds at once, finish
// first (docs/benchmarks.md: B = 1 at 32k, 0.0705 -> 0.0463 ms; at (8, 32k), (1, 128k) and (32, 8k) the same rule
// was 2-6 % slower than the doubling, so it stays there). The scalar kernel keeps kSplitTokens.
std::int64_t split_tokens_of(const TqAttendCall& c, TqAttendKernel kernel) {
  if (!is_mma_decode(kernel) && kernel != TqAttendKernel::decode_tc) return kSplitTokens;
  static const int sms = multiprocessors();
  const std::int64_t heads = heads_per_block(c, kernel);
  const std::int64_t units =  // blocks per split index
      c.batch * c.n_queries * c.layout().n_kv_heads * ((c.group() + heads - 1) / heads);
  std::int64_t per = kernel == TqAttendKernel::decode_tc ? kTcSplitTokens : kMmaSplitTokens;
  while (per < kMmaMaxSplitTokens && units * ((c.longest_row + 2 * per - 1) / (2 * per)) >= 4 * std::int64_t(sms))
    per *= 2;
  if (kernel != TqAttendKernel::decode_tc || per > kTcSplitTokens) return per;
  const std::int64_t slots = std::int64_t(tc_blocks_per_sm(int(c.layout().head_dim))) * sms;
  std::int64_t best = kTcSplitTokens, best_cost = std::numeric_limits<std::int64_t>::max();
  for (std::int64_t p = kTcSplitTokens; p <= kMmaMaxSplitTokens; p += kTcSplitStep) {
    const std::int64_t waves = (units * ((c.longest_row + p - 1) / p) + slots - 1) / slots;
    const std::int64_t cost = waves * (p + kTcBlockCostTokens);
    if (cost <= best_cost) best = p, best_cost = cost;  // on a tie the longer split: fewer partials to merge
  }
  return best;
}

// decode_tc gives the exact sink and recent timesteps a split of their own, the last.
int n_splits_of(const TqAttendCall& c, TqAttendKernel kernel) {
  const std::int64_t per_split = split_tokens_of(c, kernel);
  const int exact = kernel == TqAttendKernel::decode_tc && c.layout().exact_rows() > 0 ? 1 : 0;
  return int(std::max<std::int64_t>(1, (c.longest_row + per_split - 1) / per_split)) + exact;
}

template <int D>
void launch_for_dim(const AttendParams& all_rows, int ht, std::int64_t n_kv, TqAttendKernel kernel,
                    cudaStream_t stream) {
  const std::int64_t rows = all_rows.batch * all_rows.n_queries;
  const bool bf16 = kernel == TqAttendKernel::decode_mma_bf16;
  if (is_mma_decode(kernel)) {
    launch_mma_prepare(all_rows, bf16, stream);
    FLASHTQ_CUDA_CHECK_LAUNCH("TurboQuant query fragment kernel");
  }
  for (std::int64_t first = 0; first < rows; first += kMaxGridZ) {  // grid z holds at most 65535 rows
    AttendParams a = all_rows;
    a.first_row = first;
    const unsigned z = unsigned(std::min(kMaxGridZ, rows - first));
    switch (kernel) {
      case TqAttendKernel::decode_mma:
      case TqAttendKernel::decode_mma_bf16:
        launch_mma_decode(a, bf16, dim3(unsigned(a.n_splits), unsigned(n_kv * a.n_tiles), z), stream);
        break;
      case TqAttendKernel::decode_tc:
        launch_tc_decode(a, dim3(unsigned(a.n_splits), unsigned(n_kv * a.n_tiles), z), stream);
        break;
      default: {
        const dim3 grid(unsigned(a.n_splits), unsigned(n_kv * a.n_tiles), z);
        switch (ht) {
          case 4: attend_partial<D, 4><<<grid, kThreads, 0, stream>>>(a); break;
          case 2: attend_partial<D, 2><<<grid, kThreads, 0, stream>>>(a); break;
          default: attend_partial<D, 1><<<grid, kThreads, 0, stream>>>(a); break;
        }
      }
    }
    FLASHTQ_CUDA_CHECK_LAUNCH("TurboQuant attend kernel");
  }
  const AttendParams& a = all_rows;
  launch_dependent(attend_merge<D>, dim3(unsigned(a.batch * a.n_queries * a.H)), dim3(kMergeThreads), stream,
                   "TurboQuant merge kernel", a);
}

// The workspace: the splits' partials (max, sum, D accumulators per row, head and split), then, for
// the tensor-core decode, the query fragments of every (row, group of 4 heads), 16-byte aligned.
std::size_t partial_bytes(const TqAttendCall& c, TqAttendKernel kernel) {
  return std::size_t(c.rows() * c.n_heads * n_splits_of(c, kernel) * partial_stride(int(c.layout().head_dim))) *
         sizeof(float);
}

std::size_t fragment_offset(const TqAttendCall& c, TqAttendKernel kernel) {
  return (partial_bytes(c, kernel) + 15) / 16 * 16;
}

}  // namespace

std::size_t tq_attend_workspace(const TqAttendCall& c, TqAttendKernel kernel) {
  if (kernel == TqAttendKernel::prefill_bf16) return tq_prefill_workspace(c);
  if (!is_mma_decode(kernel)) return partial_bytes(c, kernel);
  return fragment_offset(c, kernel) + std::size_t(c.rows() * (c.n_heads / 4)) * kKeyFragmentBytes;
}

void launch_tq_attend(const TqAttendCall& c, TqAttendKernel kernel) {
  if (kernel == TqAttendKernel::prefill_bf16) {
    launch_tq_prefill(c);
    return;
  }
  AttendParams a{};
  a.l = c.layout();
  a.scratch = c.scratch;
  a.scratch_layout = c.scratch_layout;
  a.H = c.n_heads;
  a.n_queries = c.n_queries;
  a.start_pos = c.start_pos;
  a.max_seq = c.max_seq;
  a.scale = c.scale;
  a.qjl_scale = c.qjl_scale;
  a.k = c.k_cache;
  a.v = c.v_cache;
  a.out = static_cast<float*>(c.out.data);
  a.out_batch_stride = c.out.strides[0];
  a.out_row_stride = c.out.strides[1];
  a.batch = c.batch;
  a.starts = c.start_positions;
  a.out_head_stride = c.out.strides[2];
  a.ws = static_cast<float*>(c.workspace);
  a.key_fragments = static_cast<char*>(c.workspace) + fragment_offset(c, kernel);
  a.n_splits = n_splits_of(c, kernel);
  a.split_tokens = int(split_tokens_of(c, kernel));
  a.window = c.window;
  a.pages = c.pages;
  a.reach = c.reach;
  a.softcap = c.softcap;
  a.sinks = c.sinks;
  const int ht = heads_per_block(c, kernel);
  a.n_tiles = int((c.group() + ht - 1) / ht);
  for (int i = 0; i < 16; ++i) {
    a.key_centroids[i] = c.tables.key_centroids[std::size_t(i)];
    a.value_centroids[i] = c.tables.value_centroids[std::size_t(i)];
    a.outlier_centroids[i] = c.tables.outlier_centroids[std::size_t(i)];
  }
  for (int i = 0; i < 8; ++i) a.polar_signs[i] = c.tables.polar_sign_bits[std::size_t(i)];
  auto stream = static_cast<cudaStream_t>(c.stream);
  switch (c.layout().head_dim) {
    case 32: launch_for_dim<32>(a, ht, c.layout().n_kv_heads, kernel, stream); break;
    case 64: launch_for_dim<64>(a, ht, c.layout().n_kv_heads, kernel, stream); break;
    case 128: launch_for_dim<128>(a, ht, c.layout().n_kv_heads, kernel, stream); break;
    case 256: launch_for_dim<256>(a, ht, c.layout().n_kv_heads, kernel, stream); break;
    default: throw Error("head_dim", "no CUDA TurboQuant kernel for this head_dim");
  }
}

}  // namespace flashtq::cuda

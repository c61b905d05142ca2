// Chunked prefill over the packed TurboQuant cache (TqAttendKernel::prefill_bf16, bf16-class: docs/spec.md §3):
// the rotated queries and every timestep the chunk sees are turned into bf16 rows in the workspace once,
// the dense tensor-core forward attends them (causal, offset and window placing row j at start_pos + j),
// and a last kernel rotates each output row back (a timestep's rows: tq_decode_rows.cuh). Per query row the
// cache is then read as bf16 by a tiled kernel instead of decoded from its words by every row, which is what
// made prefill on the decode kernels slow.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "core/validate.hpp"
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"
#include "cuda/launch.hpp"
#include "cuda/tq_decode_rows.cuh"
#include "cuda/tq_dispatch.cuh"

namespace flashtq::cuda {
namespace {

constexpr int kWarps = 8;  // warps per block of the decode and finish kernels
// decode_rows waits on its loads more than it computes: registers bounded for a third block per SM pay more than
// the few bytes it then spills; its grid is a few waves of those blocks, each group of lanes a long run of rows
// (docs/benchmarks.md has the registers, blocks, waves and times measured; the macros build the variants).
#ifndef FLASHTQ_PREFILL_DECODE_BLOCKS
#define FLASHTQ_PREFILL_DECODE_BLOCKS 3
#endif
#ifndef FLASHTQ_PREFILL_DECODE_WAVES
#define FLASHTQ_PREFILL_DECODE_WAVES 4
#endif
constexpr int kDecodeBlocksPerSm = FLASHTQ_PREFILL_DECODE_BLOCKS, kDecodeWaves = FLASHTQ_PREFILL_DECODE_WAVES;

struct DecodeParams {
  TqLayout l;
  const std::uint32_t* k;
  const std::uint32_t* v;
  __nv_bfloat16* k_rows;  // [batch, Sk, n_kv_heads, D]: timestep first + s at s
  __nv_bfloat16* v_rows;
  std::int64_t batch, first, Sk, end;
  TqPageTable pages;  // a pool's (l.paged())
  float qjl_scale;
  RowCodebooks books;
  std::uint32_t jl_signs[8];
};

struct FinishParams {
  const __nv_bfloat16* o;  // [rows, H, D] rotated
  float* out;
  std::int64_t rows, H, n_queries;
  std::int64_t out_batch_stride, out_row_stride, out_head_stride;
  std::uint32_t polar_signs[8];
};

// The lane's E coordinates of a row as bf16, in 16-byte (or, for fewer coordinates, 8- or 4-byte) stores: rows
// start on 256-byte pieces of the 16-byte-aligned workspace, so a lane's E * 2 bytes are aligned to their size.
template <int E>
__device__ __forceinline__ void store_bf16(__nv_bfloat16* row, const float (&x)[E], int lane) {
  if constexpr (E == 1) {
    row[lane] = __float2bfloat16_rn(x[0]);
  } else {
    std::uint32_t words[E / 2];
#pragma unroll
    for (int e = 0; e < E; e += 2) {
      const __nv_bfloat162 pair = __floats2bfloat162_rn(x[e], x[e + 1]);
      words[e / 2] = *reinterpret_cast<const std::uint32_t*>(&pair);
    }
    if constexpr (E == 2) {
      reinterpret_cast<std::uint32_t*>(row)[lane] = words[0];
    } else if constexpr (E == 4) {
      reinterpret_cast<uint2*>(row)[lane] = make_uint2(words[0], words[1]);
    } else {
      auto* out = reinterpret_cast<uint4*>(row + lane * E);
#pragma unroll
      for (int i = 0; i < E / 8; ++i)
        out[i] = make_uint4(words[4 * i], words[4 * i + 1], words[4 * i + 2], words[4 * i + 3]);
    }
  }
}

// Each group of L lanes (half a warp up to D = 128, else a warp: E coordinates a lane, at most 8) takes a run of
// consecutive (sequence, timestep, kv head) rows, split into its indices once and then stepped: each row's key and
// value in bf16 (docs/benchmarks.md has the row orders, turn sizes and lanes a row measured).
template <int W>  // the launcher's width, D / 32
__global__ void __launch_bounds__(32 * kWarps, kDecodeBlocksPerSm) decode_rows(DecodeParams a) {
  constexpr int D = 32 * W, L = W <= 4 ? 16 : 32, E = D / L;
  __shared__ float kc[16], vc[16], oc[16];
  if (threadIdx.x < 16) {
    kc[threadIdx.x] = a.books.key[threadIdx.x];
    vc[threadIdx.x] = a.books.value[threadIdx.x];
    oc[threadIdx.x] = a.books.outlier[threadIdx.x];
  }
  __syncthreads();
  const TqLayout& l = a.l;
  const int lane = threadIdx.x % L;  // within the row's group
  const unsigned lanes = L == 32 ? 0xFFFFFFFFu : 0xFFFFu << (threadIdx.x & 16);
  const LaneCodes key_at = lane_codes<E>(l, true, lane), value_at = lane_codes<E>(l, false, lane);
  const float* key_cent = l.key_outliers && key_at.part == 0 ? oc : kc;
  const std::int64_t Hkv = l.n_kv_heads, rows = a.batch * a.Sk * Hkv;
  const std::int64_t groups = std::int64_t(gridDim.x) * blockDim.x / L, run = (rows + groups - 1) / groups;
  std::int64_t row = ((std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / L) * run;
  const std::int64_t last = row + run < rows ? row + run : rows;
  if (row >= last) return;                                                       // whole groups
  std::int64_t b = row / (a.Sk * Hkv), s = (row / Hkv) % a.Sk, kvh = row % Hkv;  // rows are (b, s, kvh) in order
  const MeanBlocks means(l);
  const RowWords rw(l);
  // Sequence b's images and table row, worked out when b changes and not per row: an image's words per sequence
  // cost two 64-bit divisions (its blocks of means) and a chain of products each time.
  const std::int64_t key_stride = tq_sequence_base(l, 1, true), value_stride = tq_sequence_base(l, 1, false);
  const std::uint32_t *k_seq = a.k + b * key_stride, *v_seq = a.v + b * value_stride;
  TqSequence seq = tq_sequence(l, a.pages, b);
  auto step = [&] {
    if (++kvh == Hkv) {
      kvh = 0;
      if (++s == a.Sk) {
        s = 0, ++b;
        k_seq += key_stride, v_seq += value_stride;
        seq = tq_sequence(l, a.pages, b);
      }
    }
  };
  auto decode = [&](float(&k)[E], float(&v)[E]) {
    decode_timestep<E, L>(l, rw, means, a.qjl_scale, a.jl_signs, k_seq, v_seq, seq, kvh, a.first + s, a.end, key_at,
                          value_at, key_cent, vc, lane, lanes, k, v);
  };
  // Two rows a turn, both decoded before either is stored, so that their loads are in flight together.
  for (; row + 1 < last; row += 2) {
    float k0[E], v0[E], k1[E], v1[E];
    decode(k0, v0);
    step();
    decode(k1, v1);
    step();
    store_bf16<E>(a.k_rows + row * D, k0, lane);
    store_bf16<E>(a.v_rows + row * D, v0, lane);
    store_bf16<E>(a.k_rows + (row + 1) * D, k1, lane);
    store_bf16<E>(a.v_rows + (row + 1) * D, v1, lane);
  }
  if (row < last) {
    float k[E], v[E];
    decode(k, v);
    store_bf16<E>(a.k_rows + row * D, k, lane);
    store_bf16<E>(a.v_rows + row * D, v, lane);
  }
}

// The rotated queries (the scratch's q_rot region, [rows, H, D]) as bf16, two per thread (the scratch is
// only 4-byte aligned).
__global__ void queries_to_bf16(const float* q_rot, __nv_bfloat162* q, std::int64_t pairs) {
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < pairs;
       i += std::int64_t(gridDim.x) * blockDim.x)
    q[i] = __floats2bfloat162_rn(q_rot[2 * i], q_rot[2 * i + 1]);
}

// One warp per (row, head): the dense forward's output rotated back (core::inverse_rht) into out.
template <int E>
__global__ void __launch_bounds__(32 * kWarps) finish_rows(FinishParams f) {
  constexpr int D = 32 * E;
  const int lane = threadIdx.x % 32;
  const std::int64_t r = std::int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;  // row * H + h
  if (r >= f.rows * f.H) return;                                                // whole warps
  const std::int64_t row = r / f.H, h = r % f.H, b = row / f.n_queries, j = row % f.n_queries;
  float x[E];
#pragma unroll
  for (int e = 0; e < E; ++e) x[e] = __bfloat162float(f.o[r * D + lane * E + e]);
  warp_fwht(x, lane);
  float* out = f.out + b * f.out_batch_stride + j * f.out_row_stride + h * f.out_head_stride;
  const float inv = rsqrtf(float(D));
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int d = lane * E + e;
    out[d] = ((f.polar_signs[d / 32] >> (d % 32)) & 1u) ? -x[e] * inv : x[e] * inv;
  }
}

// The workspace, each piece on 256 bytes: queries and output [rows, H, D] bf16, then keys and values
// [batch, Sk, n_kv_heads, D] bf16.
struct Pieces {
  std::size_t q, o, k, v, end;
};
std::size_t round_up(std::size_t x) { return (x + 255) / 256 * 256; }
Pieces pieces_of(const TqAttendCall& c) {
  const DenseProblem p = tq_prefill_problem(c);
  const std::size_t rows = std::size_t(c.rows() * p.H * p.D) * 2, keys = std::size_t(p.B * p.Sk * p.Hkv * p.D) * 2;
  Pieces s{};
  s.q = 0;
  s.o = round_up(rows);
  s.k = s.o + round_up(rows);
  s.v = s.k + round_up(keys);
  s.end = s.v + round_up(keys);
  return s;
}

std::int64_t blocks_for_warps(std::int64_t warps) { return (warps + kWarps - 1) / kWarps; }

}  // namespace

std::size_t tq_prefill_workspace(const TqAttendCall& c) { return pieces_of(c).end; }

void launch_tq_prefill(const TqAttendCall& c) {
  const TqLayout& l = c.layout();
  const DenseProblem p = tq_prefill_problem(c);
  const Pieces at = pieces_of(c);
  char* ws = static_cast<char*>(c.workspace);
  auto stream = static_cast<cudaStream_t>(c.stream);
  auto* q = reinterpret_cast<__nv_bfloat16*>(ws + at.q);
  auto* o = reinterpret_cast<__nv_bfloat16*>(ws + at.o);

  const std::int64_t pairs = c.rows() * p.H * p.D / 2;
  queries_to_bf16<<<unsigned(std::min<std::int64_t>((pairs + 255) / 256, 4096)), 256, 0, stream>>>(
      c.scratch, reinterpret_cast<__nv_bfloat162*>(q), pairs);
  FLASHTQ_CUDA_CHECK_LAUNCH("TurboQuant prefill query kernel");

  DecodeParams d{};
  d.l = l;
  d.k = c.k_cache;
  d.v = c.v_cache;
  d.k_rows = reinterpret_cast<__nv_bfloat16*>(ws + at.k);
  d.v_rows = reinterpret_cast<__nv_bfloat16*>(ws + at.v);
  d.batch = c.batch;
  d.first = tq_prefill_first_key(c);
  d.Sk = p.Sk;
  d.end = c.start_pos + c.n_queries;
  d.qjl_scale = c.qjl_scale;
  d.pages = c.pages;
  for (int i = 0; i < 16; ++i) {
    d.books.key[i] = c.tables.key_centroids[std::size_t(i)];
    d.books.value[i] = c.tables.value_centroids[std::size_t(i)];
    d.books.outlier[i] = c.tables.outlier_centroids[std::size_t(i)];
  }
  for (int i = 0; i < 8; ++i) d.jl_signs[i] = c.tables.jl_sign_bits[std::size_t(i)];
  // A few waves of resident blocks, each group of lanes a long run of rows: a group's set-up (its lanes' code
  // windows, the layout's offsets, its first row's indices) costs as much as several rows, so short runs (the
  // grid had been up to 8192 blocks) paid it too often; four waves rather than one even out the runs' ends.
  static const int sms = multiprocessors();
  const unsigned decode_blocks = unsigned(std::min<std::int64_t>(
      blocks_for_warps(p.B * p.Sk * p.Hkv), std::int64_t(sms) * kDecodeBlocksPerSm * kDecodeWaves));
  by_dtype_and_width(DType::f32, l.head_dim, [&](auto, auto width) {
    decode_rows<decltype(width)::value><<<decode_blocks, 32 * kWarps, 0, stream>>>(d);
  });
  FLASHTQ_CUDA_CHECK_LAUNCH("TurboQuant prefill decode kernel");

  // The dense forward over the workspace's rows; built from a validated TqAttendCall, so the stamp
  // vouches for views this file laid out itself.
  ForwardCall f(core::Validator::stamp());
  f.p = p;
  f.q = TensorView::bshd(q, DType::bf16, p.B, p.Sq, p.H, p.D, Memory::cuda);
  f.k = TensorView::bshd(d.k_rows, DType::bf16, p.B, p.Sk, p.Hkv, p.D, Memory::cuda);
  f.v = TensorView::bshd(d.v_rows, DType::bf16, p.B, p.Sk, p.Hkv, p.D, Memory::cuda);
  f.out = TensorView::bshd(o, DType::bf16, p.B, p.Sq, p.H, p.D, Memory::cuda);
  f.stream = c.stream;
  const DenseForwardKernel kernel = choose_dense_forward(f, current_device_traits());
  if (kernel != DenseForwardKernel::wgmma && kernel != DenseForwardKernel::mma && kernel != DenseForwardKernel::decode)
    throw Error("backend", std::string("cuda: internal: the TurboQuant prefill's dense problem went to ") +
                               kernel_name(kernel) + ", which tq_prefill_serves rules out");
  launch_dense_forward(f, kernel);

  FinishParams fin{};
  fin.o = o;
  fin.out = static_cast<float*>(c.out.data);
  fin.rows = c.rows();
  fin.H = p.H;
  fin.n_queries = c.n_queries;
  fin.out_batch_stride = c.out.strides[0];
  fin.out_row_stride = c.out.strides[1];
  fin.out_head_stride = c.out.strides[2];
  for (int i = 0; i < 8; ++i) fin.polar_signs[i] = c.tables.polar_sign_bits[std::size_t(i)];
  const unsigned finish_blocks = unsigned(blocks_for_warps(c.rows() * p.H));
  by_dtype_and_width(DType::f32, l.head_dim, [&](auto, auto width) {
    finish_rows<decltype(width)::value><<<finish_blocks, 32 * kWarps, 0, stream>>>(fin);
  });
  FLASHTQ_CUDA_CHECK_LAUNCH("TurboQuant prefill finish kernel");
}

}  // namespace flashtq::cuda

// Chunked prefill over the packed TurboQuant cache (TqAttendKernel::prefill_bf16, bf16-class: docs/spec.md §3):
// the rotated queries and every timestep the chunk sees are turned into bf16 rows in the workspace once,
// the dense tensor-core forward attends them (causal, offset and window placing row j at start_pos + j),
// and a last kernel rotates each output row back. In rotated space a timestep is what the oracle scores
// and sums (core/tq_rows.cpp): its exact row where it has one; else per part the norm half times the
// centroids, plus, with QJL, n γ qjl_scale diag(s_jl) H sgn / sqrt(D) (so that <q_rot, k> carries the
// sketch's term <q_jl, sgn>), plus the block's mean; values the norm times the centroids plus their
// block's mean. Per query row the cache is then read as bf16 by a tiled kernel instead of decoded from
// its words by every row, which is what made prefill on the decode kernels slow.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "core/packing.hpp"
#include "core/validate.hpp"
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"
#include "cuda/tq_dispatch.cuh"

namespace flashtq::cuda {
namespace {

constexpr int kWarps = 8;  // rows (one per warp) per block of the decode and finish kernels

struct DecodeParams {
  TqLayout l;
  const std::uint32_t* k;
  const std::uint32_t* v;
  __nv_bfloat16* k_rows;  // [batch, Sk, n_kv_heads, D]: timestep first + s at s
  __nv_bfloat16* v_rows;
  std::int64_t batch, first, Sk, end;
  float qjl_scale;
  float key_centroids[16], value_centroids[16], outlier_centroids[16];
  std::uint32_t jl_signs[8];
};

struct FinishParams {
  const __nv_bfloat16* o;  // [rows, H, D] rotated
  float* out;
  std::int64_t rows, H, n_queries;
  std::int64_t out_batch_stride, out_row_stride, out_head_stride;
  std::uint32_t polar_signs[8];
};

__device__ __forceinline__ float half_at(std::uint32_t word, int which) {
  return __half2float(__ushort_as_half(std::uint16_t(word >> (16 * which))));
}
__device__ __forceinline__ float bf16_at(std::uint32_t word, int which) {
  return __uint_as_float(which ? word & 0xFFFF0000u : word << 16);
}

// The Walsh-Hadamard butterflies over a warp, lane holding coordinates [lane * E, lane * E + E).
template <int E>
__device__ __forceinline__ void warp_fwht(float (&x)[E], int lane) {
#pragma unroll
  for (int len = 1; len < E; len <<= 1) {
#pragma unroll
    for (int e = 0; e < E; ++e) {
      if (!(e & len)) {
        const float a = x[e], b = x[e + len];
        x[e] = a + b;
        x[e + len] = a - b;
      }
    }
  }
#pragma unroll
  for (int m = 1; m < 32; m <<= 1) {
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const float other = __shfl_xor_sync(0xFFFFFFFFu, x[e], m);
      x[e] = (lane & m) ? other - x[e] : x[e] + other;
    }
  }
}

template <int E>
__device__ __forceinline__ void store_bf16(__nv_bfloat16* row, const float (&x)[E], int lane) {
  if constexpr (E == 1) {
    row[lane] = __float2bfloat16_rn(x[0]);
  } else {
    auto* words = reinterpret_cast<__nv_bfloat162*>(row + lane * E);
#pragma unroll
    for (int e = 0; e < E; e += 2) words[e / 2] = __floats2bfloat162_rn(x[e], x[e + 1]);
  }
}

// Where a lane's E coordinates sit in a slot's code bits: they lie in one part (parts are powers of two of at
// least 16, starting on multiples of 16), so one window of at most 32 bits holds their codes. Fixed by the
// layout: worked out once per thread, not per timestep.
struct LaneCodes {
  int bit;   // the first code's bit in the slot's stream
  int bits;  // per code
  int part;  // keys with outlier channels: the part (its norm half, part 0's codebook)
};

template <int E>
__device__ __forceinline__ LaneCodes lane_codes(const TqLayout& l, bool keys, int lane) {
  const int i = lane * E;
  if (!keys) return {i * l.value_bits, l.value_bits, 0};
  if (!l.key_outliers) return {i * l.key_bits, l.key_bits, 0};
  const int parts = l.key_parts();
  for (int p = 0; p < parts; ++p) {
    const TqLayout::KeyPart kp = l.key_part(p);
    if (i >= kp.offset && i < kp.offset + kp.size) return {kp.bit_offset + (i - kp.offset) * kp.bits, kp.bits, p};
  }
  return {0, 0, 0};  // not reached: the parts cover [0, D)
}

// The lane's E codes from a slot's code words (`words` of them): one or two loads, then shifts.
template <int E>
__device__ __forceinline__ void read_codes(const std::uint32_t* codes, std::int64_t words, const LaneCodes& at,
                                           std::uint32_t (&out)[E]) {
  const int w = at.bit / 32, shift = at.bit % 32;
  std::uint64_t window = codes[w];
  if (shift + E * at.bits > 32) window |= std::uint64_t(codes[w + 1 < words ? w + 1 : w]) << 32;
  window >>= shift;
  const std::uint32_t mask = (1u << at.bits) - 1u;
#pragma unroll
  for (int e = 0; e < E; ++e) out[e] = std::uint32_t(window >> (e * at.bits)) & mask;
}

// Key coordinates [lane * E, lane * E + E) of a coded timestep, in q_rot's space.
template <int E>
__device__ __forceinline__ void decode_key(const DecodeParams& a, const std::uint32_t* keys, std::int64_t slot,
                                           std::int64_t kvh, std::int64_t t, const LaneCodes& at, const float* cent,
                                           int lane, float (&k)[E]) {
  constexpr int D = 32 * E;
  const TqLayout& l = a.l;
  std::uint32_t code[E];
  read_codes<E>(keys + slot * l.key_code_words(), l.key_code_words(), at, code);
  const std::uint32_t* norm = keys + l.key_norm_offset() + slot * l.key_norm_words();
  const float n = half_at(norm[at.part / 2], at.part % 2);  // the part's norm half (the one norm without parts)
#pragma unroll
  for (int e = 0; e < E; ++e) k[e] = n * cent[code[e]];
  if (l.qjl) {  // the sketch's signs brought back to q_rot's space: diag(s_jl) H sgn / sqrt(D)
    const std::uint32_t jl = keys[l.key_jl_offset() + slot * (D / 32) + lane * E / 32] >> (lane * E % 32);
    float s[E];
#pragma unroll
    for (int e = 0; e < E; ++e) s[e] = ((jl >> e) & 1u) ? 1.0f : -1.0f;
    warp_fwht(s, lane);
    const float f = n * half_at(norm[0], 1) * a.qjl_scale * rsqrtf(float(D));
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int d = lane * E + e;
      const float sign = ((a.jl_signs[d / 32] >> (d % 32)) & 1u) ? -f : f;
      k[e] = fmaf(sign, s[e], k[e]);
    }
  }
  if (l.key_block) {
    const std::uint32_t* mean = keys + l.key_mean(kvh, t);
#pragma unroll
    for (int e = 0; e < E; ++e) k[e] += half_at(mean[(lane * E + e) / 2], (lane * E + e) % 2);
  }
}

// Warps take (sequence, timestep, kv head) rows in turn: each row's key and value in bf16.
template <int E>
__global__ void __launch_bounds__(32 * kWarps) decode_rows(DecodeParams a) {
  constexpr int D = 32 * E;
  __shared__ float kc[16], vc[16], oc[16];
  if (threadIdx.x < 16) {
    kc[threadIdx.x] = a.key_centroids[threadIdx.x];
    vc[threadIdx.x] = a.value_centroids[threadIdx.x];
    oc[threadIdx.x] = a.outlier_centroids[threadIdx.x];
  }
  __syncthreads();
  const TqLayout& l = a.l;
  const int lane = threadIdx.x % 32;
  const LaneCodes key_at = lane_codes<E>(l, true, lane), value_at = lane_codes<E>(l, false, lane);
  const float* key_cent = l.key_outliers && key_at.part == 0 ? oc : kc;
  const std::int64_t Hkv = l.n_kv_heads, rows = a.batch * a.Sk * Hkv;
  for (std::int64_t row = std::int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; row < rows;
       row += std::int64_t(gridDim.x) * kWarps) {  // (b, s, kvh) in that order; whole warps
    const std::int64_t b = row / (a.Sk * Hkv), t = a.first + (row / Hkv) % a.Sk, kvh = row % Hkv;
    const std::uint32_t* keys = a.k + b * l.key_words();
    const std::uint32_t* values = a.v + b * l.value_words();
    const std::int64_t slot = kvh * l.capacity + t;
    float k[E], v[E];
    const std::int64_t er = l.exact_row(t, a.end);
    if (er >= 0) {  // a sink or recent timestep: its exact rotated rows
      const std::int64_t at = (kvh * l.exact_rows() + er) * (D / 2);
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const int d = lane * E + e;
        k[e] = bf16_at(keys[l.key_exact_offset() + at + d / 2], d % 2);
        v[e] = bf16_at(values[l.value_exact_offset() + at + d / 2], d % 2);
      }
    } else {
      decode_key<E>(a, keys, slot, kvh, t, key_at, key_cent, lane, k);
      std::uint32_t code[E];
      read_codes<E>(values + slot * l.value_code_words(), l.value_code_words(), value_at, code);
      const float vn = half_at(values[l.value_norm_offset() + slot], 0);
#pragma unroll
      for (int e = 0; e < E; ++e) v[e] = vn * vc[code[e]];
      if (l.value_block) {
        const std::uint32_t* mean = values + l.value_mean(kvh, t);
#pragma unroll
        for (int e = 0; e < E; ++e) v[e] += half_at(mean[(lane * E + e) / 2], (lane * E + e) % 2);
      }
    }
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
  for (int i = 0; i < 16; ++i) {
    d.key_centroids[i] = c.tables.key_centroids[std::size_t(i)];
    d.value_centroids[i] = c.tables.value_centroids[std::size_t(i)];
    d.outlier_centroids[i] = c.tables.outlier_centroids[std::size_t(i)];
  }
  for (int i = 0; i < 8; ++i) d.jl_signs[i] = c.tables.jl_sign_bits[std::size_t(i)];
  // Enough blocks to fill the device several times over; each warp then takes rows in turn.
  const unsigned decode_blocks = unsigned(std::min<std::int64_t>(blocks_for_warps(p.B * p.Sk * p.Hkv), 8192));
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
  if (kernel != DenseForwardKernel::wgmma && kernel != DenseForwardKernel::mma)
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

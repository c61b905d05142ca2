// Tensor-core decode over the packed TurboQuant cache for keys without QJL (the presets' layouts):
// TqAttendKernel::decode_tc, bf16-class arithmetic (docs/spec.md §3: decoded keys and values, queries and
// weights rounded to bf16; softmax statistics and sums in f32).
//
// Codes become mma operands through tables in shared memory whose entries are PAIRS of centroids: the
// index bits of two codes give a bf16x2 register in one load. Each table is replicated across the banks
// (32 copies, lane l reading copy l), so a warp's 32 lookups at random entries do not wait on each other.
//
// Per 16 timesteps of one (sequence, kv head), for up to 8 query heads of its GQA group:
//   keys    S^T [16 timesteps x heads] = K [16 timesteps x D] . Q^T [D x heads]   (the keys as the A operand)
//   values  O^T [D x heads] += V^T [D x 16 timesteps] . P^T [16 timesteps x heads]  (dims as rows)
// Nothing is padded but heads past a group of fewer than 8, and Q^T is a fixed B fragment. S^T's lane holds
// timesteps r, r + 8 of heads 2 col, 2 col + 1 (so the softmax statistics of a head meet over 8 lanes); the
// weights become P^T's B fragment by a transpose in registers (movmatrix), and the lane's heads are the heads of
// its O^T accumulators, whose rescaling needs no shuffle. A key's coordinates are taken in groups of 32 (lane col
// owns 8 col .. 8 col + 7 of each: two k-steps from one 32-bit window of codes per row); a group lies inside one
// part of a key with outlier channels (kernel_choice serves outlier counts that are multiples of 32), and a part's
// products are scaled by its norm as the part ends. Values: the lanes of mma row r own dims r D / 8 .. r D / 8 +
// D / 8 - 1 of every timestep, 8 dims (one 32-bit window) at a time.
// Block means: each warp first takes <q, mu> of the key blocks its timesteps touch, on the same tensor cores; a value
// block's mean is added once per warp and block, weighted by the warp's probabilities of that block.
// Exact sink and recent timesteps are a split of their own (the last; a call its blocks make, so its registers do
// not count against the tiles'), in f32 from their bf16 rows. The
// merge kernel (tq_attend.cu) combines every split by LSE and rotates back once.
#include <cuda_bf16.h>

#include <utility>

#include "core/tq_outliers.hpp"
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernel_choice.hpp"
#include "cuda/launch.hpp"
#include "cuda/mma.cuh"
#include "cuda/tq_attend.cuh"

namespace flashtq::cuda {
namespace {

// The packed words stream through once: their copies ask L2 for whole 128-byte lines (docs/benchmarks.md).
constexpr bool kWholeLines = true;

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kTile = 16;         // timesteps per tile
constexpr int kHeads = kTcHeads;  // query heads per block (the mma's 8 columns)

constexpr int kLutCopies = 32;  // of each table entry: one per bank
__host__ __device__ constexpr int lut_words(int bits) { return bits ? (1 << (2 * bits)) * kLutCopies : 0; }
__host__ __device__ constexpr int round4(int x) { return (x + 3) / 4 * 4; }
__host__ __device__ constexpr int larger(int x, int y) { return x > y ? x : y; }

// Shared memory, in words: the tables, then an area that holds each warp's two stages while the tiles run,
// then the warps' results for the combine (or, in the exact split, its queries and weights).
// The parts of a key with 32 KOG outlier channels (TqLayout::key_part): the outliers, then the rest in powers of
// two, largest first. Bit u of the mask: group u of 32 coordinates ends a part.
__host__ __device__ constexpr unsigned part_end_groups(int D, int KOG) {
  if (KOG == 0) return 1u << (D / 32 - 1);
  unsigned ends = 1u << (KOG - 1);
  int at = 32 * KOG;
  for (int rest = D - at; rest > 0;) {
    int size = 1;
    while (2 * size <= rest) size *= 2;
    at += size, rest -= size;
    ends |= 1u << (at / 32 - 1);
  }
  return ends;
}
__host__ __device__ constexpr int part_count(int D, int KOG) {
  int n = 0;
  for (unsigned e = part_end_groups(D, KOG); e; e &= e - 1) ++n;
  return n;
}

// KOG: groups of 32 outlier channels (0 without), so that a key's parts, words and norm words are constants.
template <int D, int KB, int KO, int VB, int KOG>
struct Shape {
  static_assert((KO == 0) == (KOG == 0) && 64 * KOG <= D, "at most D / 2 outlier channels, in groups of 32");
  static constexpr int kKeyWords = (D * KB + 32 * KOG * (KO - KB) + 31) / 32;
  static constexpr int kValueWords = D * VB / 32;
  static constexpr int kParts = part_count(D, KOG);
  static constexpr unsigned kPartEnds = part_end_groups(D, KOG);
  static constexpr int kNormWords = KO ? (kParts + 1) / 2 : 1;
  // A stage: a tile's words, plus the up to 3 words before them where a 16-byte copy starts, plus one word
  // after them that a window may read (never used).
  static constexpr int kKeyStage = round4(kTile * kKeyWords + 5);
  static constexpr int kValueStage = round4(kTile * kValueWords + 5);
  static constexpr int kKeyNormStage = round4(kTile * kNormWords + 5);
  static constexpr int kValueNormStage = round4(kTile + 5);
  static constexpr int kValueMeanStage = D / 2;  // the mean of the value block the tile ends, as f16 pairs
  static constexpr int kStage = kKeyStage + kValueStage + kKeyNormStage + kValueNormStage + kValueMeanStage;
  static constexpr int kLuts = lut_words(KB) + lut_words(KO) + lut_words(VB);
  static constexpr int kCombine = kWarps * kHeads * (D + 2);
  static constexpr int kArea = larger(2 * kWarps * kStage, kCombine);
  static_assert(kArea >= kHeads * D + kHeads * kThreads + kThreads + 3 * kHeads,
                "the exact split's queries and weights");
  static constexpr int kBytes = 4 * (kLuts + kArea);
};

// Where word src lands in a stage (16-byte copies start at src rounded down to 16 bytes).
__device__ __forceinline__ int lead_of(const std::uint32_t* src, bool vector) {
  return vector ? int((reinterpret_cast<std::uintptr_t>(src) >> 2) & 3u) : 0;
}

// Starts copying words [src, src + n) to the stage at shared address `stage`, word `lead` on (lead_of(src,
// vector), which a warp's tiles share: a tile's words start 64 kw bytes after the last's): 16 bytes at a time
// with `vector` (the caches start on 16 bytes, so the words before src that the first copy takes are the caches'
// own), the last words one at a time, so nothing past src + n is read.
__device__ __forceinline__ void stage_words(unsigned stage, const std::uint32_t* src, int n, bool vector, int lead,
                                            int lane) {
  if (!vector) {
    for (int i = lane; i < n; i += 32) cp_async4(stage + 4 * i, src + i);
    return;
  }
  const std::uint32_t* base = src - lead;
  const int total = lead + n, chunks = total >> 2;
  for (int c = lane; c < chunks; c += 32) cp_async16<kWholeLines>(stage + 16 * c, base + 4 * c);
  for (int i = 4 * chunks + lane; i < total; i += 32) cp_async4(stage + 4 * i, base + i);
}

// A stage's four arrays word by word (stage_words): a warp's last, partial tile, or caches not on 16 bytes. Not
// inlined, so that the tile loop does not carry this path's address arithmetic.
__device__ __noinline__ void stage_partial(unsigned st, const std::uint32_t* const (&src)[4], const int (&words)[4],
                                           const int (&at)[4], const int (&lead)[4], bool vector, int lane) {
  for (int i = 0; i < 4; ++i) stage_words(st + 4u * unsigned(at[i]), src[i], words[i], vector, lead[i], lane);
}

// stage_words for a full tile of caches on 16 bytes whose words start on 16 bytes: `chunks` 16-byte copies, from
// `src` (this lane's first: the tile's words plus 4 lane), in a fixed number of predicated copies at constant
// offsets. The general loop's 64-bit address arithmetic per copy cost the kernel a quarter of its instructions.
template <int kStageWords>
__device__ __forceinline__ void stage_tile(unsigned stage, const std::uint32_t* src, int chunks, int lane) {
  constexpr int kCopies = (kStageWords / 4 + 31) / 32;
  const unsigned dst = stage + 16u * unsigned(lane);
#pragma unroll
  for (int k = 0; k < kCopies; ++k)
    if (lane + 32 * k < chunks) cp_async16<kWholeLines>(dst + 512u * unsigned(k), src + 128 * k);
}

// 32 bits of a bit stream from shared word address `word` on, shifted right by `shift`: one load where the lane's
// codes start on a word for every lane (kWordAligned: 8 codes of 4 bits), else two and a funnel shift.
template <bool kWordAligned>
__device__ __forceinline__ std::uint32_t window_at(unsigned word, int shift) {
  if constexpr (kWordAligned) return lds32(word);
  return __funnelshift_r(lds32(word), lds32(word + 4), shift);
}

// A lane's value codes of one timestep: the N words from shared word address `words` on, read once, so that
// each 8-code window of them is cut out in registers (row_window) rather than loaded word by word again.
template <int N>
struct RowWords {
  std::uint32_t w[N];
  __device__ __forceinline__ explicit RowWords(unsigned words) {
#pragma unroll
    for (int i = 0; i < N; ++i) w[i] = lds32(words + 4u * unsigned(i));
  }
};

// The largest bit offset within its word at which lane row r's first value code starts (r D / 8 VB bits into a
// timestep's codes): whether a window kAt bits further may cross into the next word.
__host__ __device__ constexpr int largest_value_lead(int D, int VB) {
  int most = 0;
  for (int r = 0; r < 8; ++r) most = larger(most, (r * (D / 8) * VB) & 31);
  return most;
}

// 32 bits of the row from bit lead + kAt on (lead: the lane's first code's offset in words[0], below 32).
template <int kLargestLead, int kAt, int N>
__device__ __forceinline__ std::uint32_t row_window(const RowWords<N>& row, int lead) {
  constexpr int m = kAt >> 5;
  constexpr bool kMayCross = kLargestLead + (kAt & 31) >= 32;
  const int bit = lead + kAt;
  const bool cross = kMayCross && (bit >> 5) > m;
  const std::uint32_t lo = cross ? row.w[m + 1 < N ? m + 1 : N - 1] : row.w[m];
  const std::uint32_t hi = cross ? row.w[m + 2 < N ? m + 2 : N - 1] : row.w[m + 1 < N ? m + 1 : N - 1];
  return __funnelshift_r(lo, hi, bit & 31);
}

// Bits x where mask is set, y elsewhere (one LOP3).
__device__ __forceinline__ std::uint32_t merge_by_mask(std::uint32_t x, std::uint32_t y, std::uint32_t mask) {
  return (x & mask) | (y & ~mask);
}

// The bits of the even codes 0, 2, 4, 6 and 8 of a window of `bits`-bit codes (8 in the values' merge: the odd
// dims' word takes code 8's place from the odd timestep's window, shifted up by one code).
__host__ __device__ constexpr std::uint32_t even_code_bits(int bits) {
  std::uint32_t m = 0;
  for (int d = 0; d <= 8; d += 2) m |= ((1u << bits) - 1) << (d * bits);
  return m;
}

// The pair-table entry whose index is the 2 B bits of x from bit kAt on, in this lane's copy (`lane_table`: the
// table's base plus 4 bytes per copy before the lane's): the index masked in place, then moved to its entry's offset
// and added in one shift-and-add.
template <int B, int kAt>
__device__ __forceinline__ std::uint32_t pair_at(std::uint32_t x, unsigned lane_table) {
  constexpr int kScale = 7;  // log2(kLutCopies * 4 bytes): an entry's stride
  static_assert((1 << kScale) == 4 * kLutCopies, "an entry's copies: 128 bytes");
  const std::uint32_t index = x & (((1u << (2 * B)) - 1) << kAt);
  if constexpr (kAt > kScale) {
    return lds32((index >> (kAt - kScale)) + lane_table);  // LEA.HI
  } else {
    // A multiply-add (IMAD): written as a shift, the compiler moves the shift before the mask and adds an IADD.
    std::uint32_t at;
    asm("mad.lo.u32 %0, %1, %2, %3;" : "=r"(at) : "r"(index), "n"(1u << (kScale - kAt)), "r"(lane_table));
    return lds32(at);
  }
}

// A pair table: entry i (copies of it side by side) holds centroids[i % 2^bits] in its low half and
// centroids[i / 2^bits] in its high half, as T: the type of the product the table feeds (keys f16, values bf16).
template <typename T>
__device__ void fill_pairs(std::uint32_t* lut, int bits, const float* centroids, int tid) {
  const int mask = (1 << bits) - 1;
  for (int i = tid; i < lut_words(bits); i += kThreads) {
    const int entry = i / kLutCopies;
    lut[i] = pack2<T>(centroids[entry & mask], centroids[entry >> bits]);
  }
}

// The exact sink and recent timesteps a row sees, in f32 (their bf16 rows), as one partial.
template <int D>
__device__ __noinline__ void exact_split(const AttendParams& a, float* area, std::int64_t j, std::int64_t kvh,
                                         std::int64_t h0, int heads, float* ws, std::int64_t ws_head) {
  constexpr int R = (D + kThreads - 1) / kThreads;
  const TqLayout& l = a.l;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  float* q = area;                                            // [kHeads][D]
  float* w = q + kHeads * D;                                  // [kHeads][kThreads]: a chunk's scores, then weights
  int* rows = reinterpret_cast<int*>(w + kHeads * kThreads);  // the chunk's exact rows
  float* run_m = reinterpret_cast<float*>(rows + kThreads);   // per head: running max, sum, last correction
  float* run_l = run_m + kHeads;
  float* corr = run_l + kHeads;
  const std::int64_t seq = seq_len_of(a, j), end = sequence_end_of(a, j), first = first_visible_of(a, j);
  const std::int64_t sink_end = min(std::int64_t(l.sink_tokens), seq);
  const std::int64_t n_sink = max(std::int64_t(0), sink_end - first);
  const std::int64_t recent =
      l.recent_tokens > 0 ? max(max(end - l.recent_tokens, std::int64_t(l.sink_tokens)), first) : seq;
  const std::int64_t n_exact = n_sink + max(std::int64_t(0), seq - recent);
  for (int e = tid; e < heads * D; e += kThreads) q[e] = a.scratch[a.scratch_layout.q_rot(j, h0 + e / D) + e % D];
  if (tid < kHeads) run_m[tid] = -INFINITY, run_l[tid] = 0.0f;
  const std::int64_t set = sequence_of(a, j).exact_set;
  const std::uint32_t* keys = keys_of(a, j) + l.key_exact_offset() + l.exact_row_at(set, kvh, 0);
  const std::uint32_t* values = values_of(a, j) + l.value_exact_offset() + l.exact_row_at(set, kvh, 0);
  float acc[kHeads][R] = {};
  __syncthreads();
  for (std::int64_t c0 = 0; c0 < n_exact; c0 += kThreads) {
    const std::int64_t i = c0 + tid;
    if (i < n_exact) {
      const std::int64_t t = i < n_sink ? first + i : recent + (i - n_sink);
      const int er = int(l.exact_row(t, end));
      rows[tid] = er;
      const std::uint32_t* k = keys + std::int64_t(er) * (D / 2);
      float dot[kHeads] = {};
      for (int x = 0; x < D / 2; ++x) {
        const std::uint32_t word = k[x];
        const float lo = __uint_as_float(word << 16), hi = __uint_as_float(word & 0xFFFF0000u);
#pragma unroll
        for (int g = 0; g < kHeads; ++g)
          if (g < heads) dot[g] = fmaf(q[g * D + 2 * x + 1], hi, fmaf(q[g * D + 2 * x], lo, dot[g]));
      }
#pragma unroll
      for (int g = 0; g < kHeads; ++g) w[g * kThreads + tid] = capped_score(a.scale * dot[g], a.softcap);
    } else {
      for (int g = 0; g < kHeads; ++g) w[g * kThreads + tid] = -INFINITY;
    }
    __syncthreads();
    for (int g = warp; g < heads; g += kWarps) {  // the chunk's softmax step, a warp per head
      float mx = -INFINITY;
      for (int x = lane; x < kThreads; x += 32) mx = fmaxf(mx, w[g * kThreads + x]);
      mx = warp_max(mx);
      const float m_new = fmaxf(run_m[g], mx);
      float s = 0.0f;
      for (int x = lane; x < kThreads; x += 32) {
        const float v = w[g * kThreads + x];
        const float p = v == -INFINITY ? 0.0f : expf(v - m_new);
        w[g * kThreads + x] = p;
        s += p;
      }
      s = warp_sum(s);
      __syncwarp();
      if (lane == 0) {
        const float c = m_new == -INFINITY ? 1.0f : expf(run_m[g] - m_new);
        corr[g] = c;
        run_l[g] = fmaf(run_l[g], c, s);
        run_m[g] = m_new;
      }
    }
    __syncthreads();
    const int n = int(min(std::int64_t(kThreads), n_exact - c0));
#pragma unroll
    for (int e = 0; e < R; ++e) {
      const int d = tid + e * kThreads;
      if (d >= D) continue;
#pragma unroll
      for (int g = 0; g < kHeads; ++g) acc[g][e] *= g < heads ? corr[g] : 1.0f;
#pragma unroll 4
      for (int x = 0; x < n; ++x) {
        const std::uint32_t word = values[std::int64_t(rows[x]) * (D / 2) + d / 2];
        const float v = __uint_as_float(d % 2 ? word & 0xFFFF0000u : word << 16);
#pragma unroll
        for (int g = 0; g < kHeads; ++g)
          if (g < heads) acc[g][e] = fmaf(w[g * kThreads + x], v, acc[g][e]);
      }
    }
    __syncthreads();
  }
  for (int g = 0; g < heads; ++g) {
#pragma unroll
    for (int e = 0; e < R; ++e) {
      const int d = tid + e * kThreads;
      if (d < D) ws[g * ws_head + kPartialHeader + d] = acc[g][e];
    }
    if (tid == 0) {
      ws[g * ws_head] = run_m[g];
      ws[g * ws_head + 1] = run_l[g];
    }
  }
}

// kCapped: scores go through the softcap (a.softcap > 0); a template argument, so that the common call's loop
// has no test of it.
template <int D, int KB, int KO, int VB, int KOG, bool kCapped>
__global__ void __launch_bounds__(kThreads, tc_blocks_per_sm(D))
    decode_tc_kernel(const __grid_constant__ AttendParams a) {
  using S = Shape<D, KB, KO, VB, KOG>;
  constexpr int VW = S::kValueWords;
  extern __shared__ __align__(16) std::uint32_t smem[];
  std::uint32_t* const key_lut = smem;
  std::uint32_t* const outlier_lut = key_lut + lut_words(KB);
  std::uint32_t* const value_lut = outlier_lut + lut_words(KO);
  std::uint32_t* const area = value_lut + lut_words(VB);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, r = lane / 4, col = lane % 4;
  const TqLayout& l = a.l;
  const int G = int(a.H / l.n_kv_heads), tile = int(blockIdx.y % a.n_tiles);
  const std::int64_t kvh = blockIdx.y / a.n_tiles, j = a.first_row + blockIdx.z;
  const int heads = min(kHeads, G - tile * kHeads);
  const std::int64_t h0 = kvh * G + std::int64_t(tile) * kHeads;
  float* const ws = a.ws + ((j * a.H + h0) * a.n_splits + blockIdx.x) * partial_stride(D);
  const std::int64_t ws_head = std::int64_t(a.n_splits) * partial_stride(D);
  if (l.exact_rows() > 0 && int(blockIdx.x) == a.n_splits - 1) {  // not inlined: its registers are its own
    exact_split<D>(a, reinterpret_cast<float*>(area), j, kvh, h0, heads, ws, ws_head);
    return;
  }
  const std::uint32_t* keys = keys_of(a, j);
  const std::uint32_t* values = values_of(a, j);
  const TqSequence sq = sequence_of(a, j);
  const std::int64_t seq = seq_len_of(a, j), end = sequence_end_of(a, j);
  // The coded timesteps this row sees: from the window's start (or the sinks' end) to the recent window.
  // Positions fit in 32 bits (the validator caps a cache below 2^32 words).
  const int lo = int(max(first_visible_of(a, j), std::int64_t(l.sink_tokens)));
  const int hi = int(l.recent_tokens > 0 ? min(seq, end - l.recent_tokens) : seq);
  const int warp_tokens = a.split_tokens / kWarps;
  const int w_begin = max(int(blockIdx.x) * a.split_tokens + warp * warp_tokens, lo & ~(kTile - 1));
  const int w_end = min(int(blockIdx.x) * a.split_tokens + (warp + 1) * warp_tokens, hi);

  constexpr int kw = S::kKeyWords, nw = S::kNormWords;
  const bool vector = (reinterpret_cast<std::uintptr_t>(a.k) | reinterpret_cast<std::uintptr_t>(a.v)) % 16 == 0;
  // This warp's next tile's sources, each 4 words on per lane (the lane's first 16-byte copy), advanced a tile
  // at a time.
  const std::int64_t slot0 = kvh * l.capacity + w_begin;
  const std::uint32_t* k_next = keys + slot0 * kw + 4 * lane;
  const std::uint32_t* v_next = values + slot0 * VW + 4 * lane;
  const std::uint32_t* kn_next = keys + l.key_norm_offset() + slot0 * nw + 4 * lane;
  const std::uint32_t* vn_next = values + l.value_norm_offset() + slot0 + 4 * lane;
  const unsigned stages = shared_address(area) + 4u * unsigned(warp * 2 * S::kStage);
  // Where each array's words land in a stage: the same for every tile of the warp (a tile's words start 64 kw
  // bytes after the last's).
  const int k_lead = lead_of(k_next, vector), v_lead = lead_of(v_next, vector);
  const int kn_lead = lead_of(kn_next, vector), vn_lead = lead_of(vn_next, vector);
  const bool aligned = vector && (k_lead | v_lead | kn_lead | vn_lead) == 0;
  constexpr int kValueAt = S::kKeyStage, kKeyNormAt = kValueAt + S::kValueStage;
  constexpr int kValueNormAt = kKeyNormAt + S::kKeyNormStage, kValueMeanAt = kValueNormAt + S::kValueNormStage;
  // Block lengths are powers of two: blocks by shifts.
  const int kg = l.key_block, key_shift = kg ? __ffs(kg) - 1 : 0;
  const int vg = l.value_block, value_shift = vg ? __ffs(vg) - 1 : 0;
  // A tile that ends a value block (or the warp's part of it) stages that block's mean, 16 bytes a lane where the
  // means start on 16 bytes.
  const std::uint32_t* const value_means =
      vg ? values + l.value_mean_offset() + kvh * l.mean_blocks(vg) * (D / 2) : nullptr;
  const bool means_vector = vector && (reinterpret_cast<std::uintptr_t>(value_means) % 16 == 0);
  // Whether the tile at t0 ends a value block, or the warp's part of one: the staging and the tile loop both ask.
  auto ends_value_block = [&](int t0) { return vg && (((t0 + kTile) & (vg - 1)) == 0 || t0 + kTile >= w_end); };
  PageWalk walk{sq, hi};
  std::int64_t at = 0;             // the staged tile's first timestep in the image
  std::int64_t sources_page = -1;  // a pool's page the sources point into (they advance a tile at a time)
  auto fill = [&](int t0, int buf) {
    const unsigned st = stages + 4u * unsigned(buf * S::kStage);
    const int n = min(kTile, hi - t0);
    at = t0 + walk.moved_at(t0);
    if (l.paged() && walk.page != sources_page) {  // a new page: its 16-timestep tiles are consecutive slots
      sources_page = walk.page;                    // (the leads stay: slots start on 16)
      const std::int64_t slot = kvh * l.capacity + at;
      k_next = keys + slot * kw + 4 * lane, v_next = values + slot * VW + 4 * lane;
      kn_next = keys + l.key_norm_offset() + slot * nw + 4 * lane;
      vn_next = values + l.value_norm_offset() + slot + 4 * lane;
    }
    if (aligned && n == kTile) {  // every tile but a warp's last, partial one, where the caches allow
      stage_tile<S::kKeyStage>(st, k_next, kTile / 4 * kw, lane);
      stage_tile<S::kValueStage>(st + 4 * kValueAt, v_next, kTile / 4 * VW, lane);
      stage_tile<S::kKeyNormStage>(st + 4 * kKeyNormAt, kn_next, kTile / 4 * nw, lane);
      stage_tile<S::kValueNormStage>(st + 4 * kValueNormAt, vn_next, kTile / 4, lane);
    } else {
      stage_partial(st, {k_next - 4 * lane, v_next - 4 * lane, kn_next - 4 * lane, vn_next - 4 * lane},
                    {n * kw, n * VW, n * nw, n}, {0, kValueAt, kKeyNormAt, kValueNormAt},
                    {k_lead, v_lead, kn_lead, vn_lead}, vector, lane);
    }
    if (ends_value_block(t0)) {
      const std::uint32_t* mean = value_means + (at >> value_shift) * (D / 2);
      if (means_vector) {
        if (lane < D / 8) cp_async16<kWholeLines>(st + 4u * unsigned(kValueMeanAt + 4 * lane), mean + 4 * lane);
      } else {
        for (int i = lane; i < D / 2; i += 32) cp_async4(st + 4u * unsigned(kValueMeanAt + i), mean + i);
      }
    }
    cp_async_commit();
    k_next += kTile * kw, v_next += kTile * VW, kn_next += kTile * nw, vn_next += kTile;
  };
  if (w_begin < w_end) fill(w_begin, 0);  // in flight while the tables are built

  fill_pairs<__half>(key_lut, KB, a.key_centroids, tid);
  if (KO) fill_pairs<__half>(outlier_lut, KO, a.outlier_centroids, tid);
  fill_pairs<__nv_bfloat16>(value_lut, VB, a.value_centroids, tid);
  // This lane's copy of each table.
  const unsigned key_lut_lane = shared_address(key_lut) + 4u * unsigned(lane);
  const unsigned outlier_lut_lane = shared_address(outlier_lut) + 4u * unsigned(lane);
  const unsigned value_lut_lane = shared_address(value_lut) + 4u * unsigned(lane);
  // Where this lane's codes of a key group start in the rows r and r + 8 of a stage: group u of `bits`-bit codes
  // starts at word u bits (plus, past the outliers, the words their wider codes take), lane col's 8 codes 8 col bits
  // further.
  const unsigned key_lane = 4u * unsigned(r * kw + KOG * (KO - KB) + ((8 * col * KB) >> 5));
  const int key_shift_in = (8 * col * KB) & 31;
  const unsigned outlier_lane = 4u * unsigned(r * kw + ((8 * col * (KO ? KO : 1)) >> 5));
  const int outlier_shift_in = (8 * col * (KO ? KO : 1)) & 31;
  // Q^T as the key product's B fragments, one per k-step: head r's coordinates 32 u + 8 col + {0 1, 2 3} (step 0)
  // and {4 5, 6 7} (step 1) as f16 pairs, times the score scale (base 2) and a power of two that puts the head's
  // largest coordinate in [128, 256) (f16's 11 significant bits without its narrow range; bf16 queries, 8 bits,
  // had missed the 1e-2 of docs/spec.md §3 in a conformance case); heads past the group's are 0. `up` undoes the
  // power of two for heads 2 col and 2 col + 1, the heads of this lane's scores.
  const float score_scale = a.scale * kLog2e;
  std::uint32_t qb[D / 32][4];
  float up[2];
  {
    const float* q = a.scratch + a.scratch_layout.q_rot(j, h0 + (r < heads ? r : 0));
    float largest = 0.0f;
#pragma unroll
    for (int u = 0; u < D / 32; ++u)
#pragma unroll
      for (int i = 0; i < 8; ++i) largest = fmaxf(largest, fabsf(score_scale * q[32 * u + 8 * col + i]));
    largest = fmaxf(largest, __shfl_xor_sync(0xFFFFFFFFu, largest, 1));
    largest = fmaxf(largest, __shfl_xor_sync(0xFFFFFFFFu, largest, 2));  // head r's, over its 4 lanes
    const int e = largest > 0.0f && r < heads && isfinite(largest) ? ilogbf(largest) - 7 : 0;
    const float down = ldexpf(1.0f, -e);
#pragma unroll
    for (int u = 0; u < D / 32; ++u)
#pragma unroll
      for (int x = 0; x < 4; ++x)
        qb[u][x] = r < heads ? pack2<__half>(score_scale * q[32 * u + 8 * col + 2 * x] * down,
                                             score_scale * q[32 * u + 8 * col + 2 * x + 1] * down)
                             : 0u;
    const float head_up = ldexpf(1.0f, e);
    up[0] = __shfl_sync(0xFFFFFFFFu, head_up, 4 * (2 * col));
    up[1] = __shfl_sync(0xFFFFFFFFu, head_up, 4 * (2 * col + 1));
  }
  const int value_bit = r * (D / 8) * VB;  // this lane's first value bit in a timestep's codes
  // Key block means: <q, mu_b> (scaled) of every block the warp's timesteps touch, 16 blocks an mma (the means' f16
  // words as they are the A fragments in the keys' coordinate order, Q^T the keys' B fragments), into the warp's rows
  // of shared memory after the area: row b - first_block holds the 8 heads' dots of block b.
  const int first_block = kg ? w_begin >> key_shift : 0;
  float2* const mean_dots = reinterpret_cast<float2*>(area + S::kArea) + warp * a.mean_dot_rows * (kHeads / 2);
  if (kg && w_begin < w_end) {
    const int blocks = ((w_end - 1) >> key_shift) - first_block + 1;
    for (int b0 = 0; b0 < blocks; b0 += 16) {
      const int rows[2] = {b0 + r, b0 + r + 8};
      const std::uint32_t* mean[2];
      for (int x = 0; x < 2; ++x)
        mean[x] =
            rows[x] < blocks ? keys + l.key_mean(kvh, sq.timestep(std::int64_t(first_block + rows[x]) * kg)) : nullptr;
      auto fragment = [&](int x, int word) { return mean[x] ? mean[x][word] : 0u; };
      float dots[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int u = 0; u < D / 32; ++u)
#pragma unroll
        for (int step = 0; step < 2; ++step) {
          const int w = 16 * u + 4 * col + 2 * step;  // coordinates 32 u + 8 col + 4 step + {0 1}, then {2 3}
          mma_16816<__half>(dots, fragment(0, w), fragment(1, w), fragment(0, w + 1), fragment(1, w + 1),
                            qb[u][2 * step], qb[u][2 * step + 1]);
        }
      for (int x = 0; x < 2; ++x)
        if (rows[x] < blocks)
          mean_dots[rows[x] * (kHeads / 2) + col] = make_float2(dots[2 * x] * up[0], dots[2 * x + 1] * up[1]);
    }
  }
  __syncthreads();  // the tables (and each warp's mean dots)

  // Per lane, for heads 2 col and 2 col + 1: the running maximum (base 2; equal across the lanes of a head) and the
  // lane's share of the sum of weights and of the value-mean weights of the current block (summed over the lanes
  // of a head at the end and where a block ends).
  float m[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.0f, 0.0f}, mean_w[2] = {0.0f, 0.0f};
  float acc[D / 16][4] = {};  // O^T: dims r D / 8 + 2 i (+ 1 in [2], [3]) of heads 2 col, 2 col + 1
  int buf = 0;
  for (int t0 = w_begin; t0 < w_end; t0 += kTile, buf ^= 1) {
    const bool more = t0 + kTile < w_end;
    if (more) {
      fill(t0 + kTile, buf ^ 1);
    } else {
      cp_async_commit();  // an empty group: the wait below is always for this tile
    }
    cp_async_wait<1>();
    __syncwarp();
    const unsigned st = stages + 4u * unsigned(buf * S::kStage);
    const unsigned kst = st + 4u * unsigned(k_lead), vst = st + 4u * unsigned(kValueAt + v_lead);
    const unsigned knst = st + 4u * unsigned(kKeyNormAt + kn_lead), vnst = st + 4u * unsigned(kValueNormAt + vn_lead);

    // ---- keys: S^T = K Q^T, timesteps r and r + 8 (s[0..1], s[2..3]) of heads 2 col, 2 col + 1 ----
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    {
      float part[2][4] = {};  // a k-step parity each: two chains of dependent products, not one
      int p = 0;
      // A group of 32 coordinates of `bits`-bit codes: rows r and r + 8's windows of the lane's 8 codes, whose
      // pairs 0, 1 make the first k-step's A fragment and pairs 2, 3 the second's.
      auto group = [&](auto bits, unsigned words, int shift, unsigned lut, int u) {
        constexpr int B = decltype(bits)::value;
        constexpr bool kWordAligned = 8 * B % 32 == 0;
        const std::uint32_t x0 = window_at<kWordAligned>(words, shift);
        const std::uint32_t x1 = window_at<kWordAligned>(words + 4u * unsigned(8 * kw), shift);
        mma_16816<__half>(part[0], pair_at<B, 0>(x0, lut), pair_at<B, 0>(x1, lut), pair_at<B, 2 * B>(x0, lut),
                          pair_at<B, 2 * B>(x1, lut), qb[u][0], qb[u][1]);
        mma_16816<__half>(part[1], pair_at<B, 4 * B>(x0, lut), pair_at<B, 4 * B>(x1, lut), pair_at<B, 6 * B>(x0, lut),
                          pair_at<B, 6 * B>(x1, lut), qb[u][2], qb[u][3]);
      };
#pragma unroll
      for (int u = 0; u < D / 32; ++u) {
        if (u < KOG) {
          group(std::integral_constant < int, KO ? KO : 1 > {}, kst + outlier_lane + 4u * unsigned(u * KO),
                outlier_shift_in, outlier_lut_lane, u);
        } else {
          group(std::integral_constant<int, KB>{}, kst + key_lane + 4u * unsigned(u * KB), key_shift_in, key_lut_lane,
                u);
        }
        if ((S::kPartEnds >> u) & 1u) {  // the part ends: its products times the rows' norms
          const unsigned at = knst + 4u * unsigned(r * nw + (p >> 1));
          const int half = 16 * (p & 1);
          const float n0 = f16_low(lds32(at) >> half), n1 = f16_low(lds32(at + 4u * unsigned(8 * nw)) >> half);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[e] = fmaf(e < 2 ? n0 : n1, part[0][e] + part[1][e], s[e]);
            part[0][e] = part[1][e] = 0.0f;
          }
          ++p;
        }
      }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) s[e] *= up[e & 1];  // the queries' power of two, undone
    if (kg) {  // heads 2 col, 2 col + 1's dot products with the block's key mean (scaled)
      const float2 mean_dot = mean_dots[((t0 >> key_shift) - first_block) * (kHeads / 2) + col];
#pragma unroll
      for (int e = 0; e < 4; ++e) s[e] += e & 1 ? mean_dot.y : mean_dot.x;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if constexpr (kCapped) s[e] = capped_score(s[e], a.softcap * kLog2e);
    }
    const bool edge = t0 < lo || t0 + kTile > w_end;  // a tile with hidden timesteps (the same for the warp)
    if (edge) {
      const int ta = t0 + r, tb = ta + 8;
      const bool va = ta >= lo && ta < w_end, vb = tb >= lo && tb < w_end;
      s[0] = va ? s[0] : -INFINITY, s[1] = va ? s[1] : -INFINITY;
      s[2] = vb ? s[2] : -INFINITY, s[3] = vb ? s[3] : -INFINITY;
    }
    // ---- online softmax of heads 2 col, 2 col + 1: maxima over the 8 lanes of a head ----
    float mx[2] = {fmaxf(s[0], s[2]), fmaxf(s[1], s[3])};
#pragma unroll
    for (int o = 4; o < 32; o *= 2)
#pragma unroll
      for (int h = 0; h < 2; ++h) mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xFFFFFFFFu, mx[h], o));
    float corr[2], base[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_new = fmaxf(m[h], mx[h]);
      corr[h] = m_new == -INFINITY ? 1.0f : exp2_approx(m[h] - m_new);
      base[h] = m_new == -INFINITY ? 0.0f : m_new;  // a hidden timestep's weight is exp2(-inf) = 0
      m[h] = m_new;
    }
    float pw[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) pw[e] = exp2_approx(s[e] - base[e & 1]);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      lsum[h] = fmaf(lsum[h], corr[h], pw[h] + pw[2 + h]);
      if (vg) mean_w[h] = fmaf(mean_w[h], corr[h], pw[h] + pw[2 + h]);
    }
    // P^T's B fragment for the value product: the weights times the value norms as bf16 pairs of rows r, r + 8
    // (heads 2 col, 2 col + 1), transposed by movmatrix into head r's timesteps 2 col, 2 col + 1 (and + 8). A
    // hidden timestep's norm, which may be any bits of the stage, is selected away.
    std::uint32_t pb[2];
    {
      const float vn0 = f16_low(lds32(vnst + 4u * unsigned(r))), vn1 = f16_low(lds32(vnst + 4u * unsigned(r + 8)));
      float w[4] = {pw[0] * vn0, pw[1] * vn0, pw[2] * vn1, pw[3] * vn1};
      if (edge) {
#pragma unroll
        for (int e = 0; e < 4; ++e) w[e] = pw[e] == 0.0f ? 0.0f : w[e];
      }
      pb[0] = movmatrix_trans(bf16_pair(w[0], w[1]));
      pb[1] = movmatrix_trans(bf16_pair(w[2], w[3]));
    }
    if (__any_sync(0xFFFFFFFFu, corr[0] != 1.0f || corr[1] != 1.0f)) {
#pragma unroll
      for (int i = 0; i < D / 16; ++i) {
        acc[i][0] *= corr[0], acc[i][1] *= corr[1];
        acc[i][2] *= corr[0], acc[i][3] *= corr[1];
      }
    }
    // ---- values: dims r D / 8 + 8 c .. + 7 of timesteps 2 col, 2 col + 1, 2 col + 8, 2 col + 9 ----
    {
      static_assert(9 * VB <= 32, "a window's 8 codes shifted by one code still fit 32 bits");
      constexpr std::uint32_t kEvenDims = even_code_bits(VB);
      constexpr int kLead = largest_value_lead(D, VB), kRowWords = (kLead + D / 8 * VB + 31) / 32;
      const unsigned v0 = vst + 4u * unsigned(2 * col * VW + (value_bit >> 5));
      const int lead = value_bit & 31;
      const RowWords<kRowWords> row0(v0), row1(v0 + 4 * VW), row8(v0 + 4 * 8 * VW), row9(v0 + 4 * 9 * VW);
#pragma unroll
      for (int c = 0; c < D / 64; ++c) {
        auto window = [&](const RowWords<kRowWords>& row) {
          switch (c) {  // the window's place as a constant (c is one after unrolling)
            case 0: return row_window<kLead, 0 * 8 * VB>(row, lead);
            case 1: return row_window<kLead, 1 * 8 * VB>(row, lead);
            case 2: return row_window<kLead, 2 * 8 * VB>(row, lead);
            default: return row_window<kLead, 3 * 8 * VB>(row, lead);
          }
        };
        const std::uint32_t x0 = window(row0), x2 = window(row8);
        // The odd timesteps' codes one code higher, then merged with the even ones into one word per parity of
        // the dim: dim d's pair index (even code low, odd code high) is that word's 2 VB bits at d VB.
        const std::uint32_t y1 = window(row1) << VB, y3 = window(row9) << VB;
        const std::uint32_t z01[2] = {merge_by_mask(x0, y1, kEvenDims), merge_by_mask(x0, y1, ~kEvenDims)};
        const std::uint32_t z23[2] = {merge_by_mask(x2, y3, kEvenDims), merge_by_mask(x2, y3, ~kEvenDims)};
        const unsigned t = value_lut_lane;
        mma_16816<__nv_bfloat16>(acc[4 * c + 0], pair_at<VB, 0 * VB>(z01[0], t), pair_at<VB, 1 * VB>(z01[1], t),
                                 pair_at<VB, 0 * VB>(z23[0], t), pair_at<VB, 1 * VB>(z23[1], t), pb[0], pb[1]);
        mma_16816<__nv_bfloat16>(acc[4 * c + 1], pair_at<VB, 2 * VB>(z01[0], t), pair_at<VB, 3 * VB>(z01[1], t),
                                 pair_at<VB, 2 * VB>(z23[0], t), pair_at<VB, 3 * VB>(z23[1], t), pb[0], pb[1]);
        mma_16816<__nv_bfloat16>(acc[4 * c + 2], pair_at<VB, 4 * VB>(z01[0], t), pair_at<VB, 5 * VB>(z01[1], t),
                                 pair_at<VB, 4 * VB>(z23[0], t), pair_at<VB, 5 * VB>(z23[1], t), pb[0], pb[1]);
        mma_16816<__nv_bfloat16>(acc[4 * c + 3], pair_at<VB, 6 * VB>(z01[0], t), pair_at<VB, 7 * VB>(z01[1], t),
                                 pair_at<VB, 6 * VB>(z23[0], t), pair_at<VB, 7 * VB>(z23[1], t), pb[0], pb[1]);
      }
    }
    if (ends_value_block(t0)) {
      float wsum[2] = {mean_w[0], mean_w[1]};
#pragma unroll
      for (int o = 4; o < 32; o *= 2)
#pragma unroll
        for (int h = 0; h < 2; ++h) wsum[h] += __shfl_xor_sync(0xFFFFFFFFu, wsum[h], o);
      const unsigned mean = st + 4u * unsigned(kValueMeanAt + r * (D / 16));  // row r's dims, staged
#pragma unroll
      for (int i = 0; i < D / 16; ++i) {
        const std::uint32_t word = lds32(mean + 4u * unsigned(i));
        const float lo_dim = f16_low(word), hi_dim = f16_low(word >> 16);
        acc[i][0] = fmaf(wsum[0], lo_dim, acc[i][0]), acc[i][1] = fmaf(wsum[1], lo_dim, acc[i][1]);
        acc[i][2] = fmaf(wsum[0], hi_dim, acc[i][2]), acc[i][3] = fmaf(wsum[1], hi_dim, acc[i][3]);
      }
      mean_w[0] = mean_w[1] = 0.0f;
    }
    __syncwarp();  // every lane has read this stage before it is refilled
  }

  // ---- the warps' results, combined into one partial ----
#pragma unroll
  for (int o = 4; o < 32; o *= 2)
#pragma unroll
    for (int h = 0; h < 2; ++h) lsum[h] += __shfl_xor_sync(0xFFFFFFFFu, lsum[h], o);
  __syncthreads();                                   // the stages are free
  float* const cm = reinterpret_cast<float*>(area);  // [kWarps][kHeads] maxima (base 2)
  float* const cl = cm + kWarps * kHeads;            // sums
  float* const cacc = cl + kWarps * kHeads;          // [kWarps][kHeads][D]
  if (r == 0) {
    cm[warp * kHeads + 2 * col] = m[0], cm[warp * kHeads + 2 * col + 1] = m[1];
    cl[warp * kHeads + 2 * col] = lsum[0], cl[warp * kHeads + 2 * col + 1] = lsum[1];
  }
#pragma unroll
  for (int i = 0; i < D / 16; ++i) {
    const int d = r * (D / 8) + 2 * i;
    float* even = cacc + (warp * kHeads + 2 * col) * D + d;
    float* odd = even + D;
    even[0] = acc[i][0], odd[0] = acc[i][1], even[1] = acc[i][2], odd[1] = acc[i][3];
  }
  __syncthreads();
  for (int e = tid; e < heads * D; e += kThreads) {
    const int h = e / D, d = e % D;
    float M = -INFINITY;
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, cm[w * kHeads + h]);
    float L = 0.0f, x = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      const float lw = cl[w * kHeads + h];
      if (lw == 0.0f) continue;
      const float f = exp2_approx(cm[w * kHeads + h] - M);
      L = fmaf(lw, f, L);
      x = fmaf(cacc[(w * kHeads + h) * D + d], f, x);
    }
    float* out = ws + h * ws_head;
    out[kPartialHeader + d] = x;
    if (d == 0) {
      out[0] = M * kLn2;  // the merge takes natural-log maxima
      out[1] = L;
    }
  }
}

template <int D, int KB, int KO, int VB, int KOG, bool kCapped>
void launch_capped(const AttendParams& a, dim3 grid, cudaStream_t stream) {
  using S = Shape<D, KB, KO, VB, KOG>;
  constexpr int kMeanDotRowBytes = kWarps * kHeads * int(sizeof(float));  // a row of every warp
  // The most rows a launch takes: the longest split's warps over the shortest key blocks.
  constexpr int kMostBytes =
      S::kBytes + (kMmaMaxSplitTokens / kWarps / tiles::kTqDecodeTcLeastBlock + 1) * kMeanDotRowBytes;
  allow_shared_bytes<decode_tc_kernel<D, KB, KO, VB, KOG, kCapped>>(kMostBytes);
  const int bytes = S::kBytes + a.mean_dot_rows * kMeanDotRowBytes;
  decode_tc_kernel<D, KB, KO, VB, KOG, kCapped><<<grid, kThreads, bytes, stream>>>(a);
}

// The kernel's constants for a key's parts and words against the layout's own rule (an internal error if they
// ever disagree).
template <int D, int KB, int KO, int VB, int KOG>
void check_shape(const TqLayout& l) {
  using S = Shape<D, KB, KO, VB, KOG>;
  unsigned ends = 0;
  for (int p = 0; p < l.key_parts(); ++p) {
    const TqLayout::KeyPart kp = l.key_part(p);
    ends |= 1u << ((kp.offset + kp.size) / 32 - 1);
  }
  if (ends != S::kPartEnds || l.key_code_words() != S::kKeyWords || l.key_norm_words() != S::kNormWords)
    throw Error("backend", "cuda: internal error: the tensor-core decode's key parts differ from the layout's");
}

template <int D, int KB, int KO, int VB, int KOG>
void launch_outliers(const AttendParams& a, dim3 grid, cudaStream_t stream) {
  check_shape<D, KB, KO, VB, KOG>(a.l);
  if (a.softcap > 0.0f) {
    launch_capped<D, KB, KO, VB, KOG, true>(a, grid, stream);
  } else {
    launch_capped<D, KB, KO, VB, KOG, false>(a, grid, stream);
  }
}

// Outlier channels in groups of 32, up to D / 2 (kernel_choice serves multiples of 32 only).
template <int D, int KB, int KO, int VB, int... G>
bool launch_groups(const AttendParams& a, dim3 grid, cudaStream_t stream, std::integer_sequence<int, G...>) {
  const int groups = a.l.key_outliers / 32;
  return ((groups == G + 1 ? (launch_outliers<D, KB, KO, VB, G + 1>(a, grid, stream), true) : false) || ...);
}

template <int D, int KB, int KO, int VB>
bool launch_widths(const AttendParams& a, dim3 grid, cudaStream_t stream) {
  if constexpr (KO == 0) {
    launch_outliers<D, KB, KO, VB, 0>(a, grid, stream);
    return true;
  } else {
    return launch_groups<D, KB, KO, VB>(a, grid, stream, std::make_integer_sequence<int, D / 64>{});
  }
}

template <int D, std::size_t... I>
bool launch_built(const AttendParams& a, dim3 grid, cudaStream_t stream, std::index_sequence<I...>) {
  const int ko = a.l.key_outliers ? a.l.key_outlier_bits : 0;
  constexpr auto& W = tiles::kTqDecodeTcWidths;
  return ((a.l.key_bits == W[I].key_bits && ko == W[I].outlier_bits && a.l.value_bits == W[I].value_bits
               ? launch_widths<D, W[I].key_bits, W[I].outlier_bits, W[I].value_bits>(a, grid, stream)
               : false) ||
          ...);
}

template <int D>
void launch_dim(const AttendParams& a, dim3 grid, cudaStream_t stream) {
  if (!launch_built<D>(a, grid, stream, std::make_index_sequence<tiles::kTqDecodeTcWidths.size()>{}))
    throw Error("backend",
                "cuda: internal error: no tensor-core decode built for this layout's code widths or outlier count");
}

}  // namespace

void launch_tc_decode(const AttendParams& call, dim3 grid, cudaStream_t stream) {
  AttendParams a = call;
  // The key blocks a warp's timesteps (at most split_tokens / kWarps of them) may touch.
  const int kg = a.l.key_block;
  a.mean_dot_rows = kg ? (a.split_tokens / kWarps + kg - 1) / kg + 1 : 0;
  switch (a.l.head_dim) {
    case 64: launch_dim<64>(a, grid, stream); break;
    case 128: launch_dim<128>(a, grid, stream); break;
    case 256: launch_dim<256>(a, grid, stream); break;
    default: throw Error("backend", "cuda: internal error: no tensor-core decode for this head_dim");
  }
}

}  // namespace flashtq::cuda

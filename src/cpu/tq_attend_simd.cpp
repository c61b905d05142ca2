// SIMD TurboQuant attention for the cpu backend, every layout (keys of 1 to 4 bits with or without
// QJL, values of 2 to 4 bits, norm correction, exact sink and recent tokens, block means, a sliding window):
// scores straight from the packed words, keys of 2 to 4 bits without QJL decoded a vector of codes at
// a time and multiplied with the heads' rotated queries, QJL and 1-bit keys through per-query tables
// (a field of a key's code stream, 2 to 8 dims, indexes the heads' partial dot products with the
// centroids it selects; QJL bits the same way, 8 per byte); values decoded a vector of codes at a time
// and accumulated in rotated space over a block of tokens; exact rows read as bf16; one inverse
// rotation at the end.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/tq_attend_simd.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/aligned_allocator.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/elements.hpp"
#include "core/half.hpp"
#include "core/rht.hpp"
#include "core/tq_outliers.hpp"
#include "cpu/kernels.hpp"
#include "cpu/merge.hpp"
#include "cpu/turboquant.hpp"

HWY_BEFORE_NAMESPACE();
namespace flashtq::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr std::int64_t kBlock = 64;  // tokens per softmax step

inline float f16_low(std::uint32_t w) { return core::f16_to_f32(std::uint16_t(w & 0xFFFFu)); }

inline std::uint32_t load_u32(const std::uint8_t* p) {
  std::uint32_t w;
  std::memcpy(&w, p, 4);
  return w;
}

// Floats between the tables of consecutive fields: a field's entries and 64 bytes more. A key reads
// one entry of every field; 4 KB apart (256 entries of 16 bytes) those reads would all fall in the few
// L1 sets their codes pick and evict each other; the padding moves each field to the next set.
constexpr std::int64_t padded_stride(int entries) { return std::int64_t(entries) * 4 + 16; }

// How a key's code stream is cut into table fields: whole bytes for 1, 2 and 4 bits (8, 4 or 2 dims
// a byte), 6-bit fields of 2 dims for 3 bits (four to the 3 bytes of 8 dims).
struct KeyFields {
  int bits, dims, width;
  explicit KeyFields(int b) : bits(b), dims(b == 3 ? 2 : 8 / b), width(b == 3 ? 6 : 8) {}
  int entries() const { return 1 << width; }
  std::int64_t count(std::int64_t D) const { return D / dims; }
  std::int64_t stride() const { return padded_stride(entries()); }
};

#if HWY_TARGET != HWY_SCALAR  // the tables need 128-bit vectors (one lane per head of a quad)
// Per-query tables, four heads per entry (one 128-bit vector): for key field f and each of its values,
// the heads' partial dot products with the centroids it selects; for byte j of the QJL bits (dims
// 8j..8j+7), the partial signed sums sum_i (+-1) q_jl[i]. A key's score is then one table read and
// vector add per field for all four heads, with no horizontal sums. Heads past the group read as zero.
struct KeyTables {
  hwy::AlignedFreeUniquePtr<float[]> storage;  // codes [fields][entries][4], then signs [D/8][256][4]
  std::size_t size = 0;
  float* codes = nullptr;
  float* signs = nullptr;
  void reserve(std::int64_t D, const KeyFields& f, bool qjl) {
    const std::size_t code_floats = std::size_t(f.count(D) * f.stride());
    const std::size_t need = code_floats + (qjl ? std::size_t(D / 8 * padded_stride(256)) : 0);
    if (need > size) storage = hwy::AllocateAligned<float>(need), size = need;
    codes = storage.get();
    signs = codes + code_floats;
  }
};

// Entries are built digit by digit (entry[x + levels^i * code] = entry[x] + q[i] * c[code]), about one
// vector add per entry.
void build_key_tables(const float* const* q_rot, const float* const* q_jl, int heads, std::int64_t D,
                      const KeyFields& f, bool qjl, const float* centroids, KeyTables& t) {
  const hn::Full128<float> d4;
  t.reserve(D, f, qjl);
  auto across_heads = [&](const float* const* rows, std::int64_t dim) {
    alignas(16) float x[4] = {};
    for (int h = 0; h < heads; ++h) x[h] = rows[h][dim];
    return hn::Load(d4, x);
  };
  const int levels = 1 << f.bits;
  for (std::int64_t j = 0; j < f.count(D); ++j) {
    float* e = t.codes + j * f.stride();
    hn::Store(hn::Zero(d4), d4, e);
    for (int i = 0, filled = 1; i < f.dims; ++i, filled *= levels) {
      const auto q = across_heads(q_rot, f.dims * j + i);
      for (int code = levels - 1; code >= 0; --code) {  // code 0 last: it overwrites the entries it reads
        const auto part = hn::Mul(q, hn::Set(d4, centroids[code]));
        for (int x = 0; x < filled; ++x)
          hn::Store(hn::Add(hn::Load(d4, e + x * 4), part), d4, e + (x + filled * code) * 4);
      }
    }
  }
  if (!qjl) return;
  for (std::int64_t j = 0; j < D / 8; ++j) {  // 8 dims of sign bits per byte
    float* e = t.signs + j * padded_stride(256);
    hn::Store(hn::Zero(d4), d4, e);
    for (int i = 0, filled = 1; i < 8; ++i, filled *= 2) {
      const auto q = across_heads(q_jl, 8 * j + i);
      for (int x = 0; x < filled; ++x) {
        const auto v = hn::Load(d4, e + x * 4);
        hn::Store(hn::Add(v, q), d4, e + (x + filled) * 4);
        hn::Store(hn::Sub(v, q), d4, e + x * 4);
      }
    }
  }
}

// The four heads' dot products of q_rot with one key's decoded unit vector, from its code bytes.
// Four partial sums: a single chain of adds would be latency-bound. A 3-bit key's last group reads
// one byte past its codes, which the next region of the cache always holds.
HWY_INLINE hn::Vec<hn::Full128<float>> key_polar(const float* table, const std::uint8_t* codes, std::int64_t D,
                                                 const KeyFields& f) {
  const hn::Full128<float> d4;
  auto c0 = hn::Zero(d4), c1 = c0, c2 = c0, c3 = c0;
  const std::int64_t stride = f.stride();
  if (f.width == 8) {
    const std::int64_t fields = f.count(D);  // a multiple of 4: D >= 32
    for (std::int64_t j = 0; j < fields; j += 4) {
      c0 = hn::Add(c0, hn::Load(d4, table + (j + 0) * stride + codes[j + 0] * 4));
      c1 = hn::Add(c1, hn::Load(d4, table + (j + 1) * stride + codes[j + 1] * 4));
      c2 = hn::Add(c2, hn::Load(d4, table + (j + 2) * stride + codes[j + 2] * 4));
      c3 = hn::Add(c3, hn::Load(d4, table + (j + 3) * stride + codes[j + 3] * 4));
    }
  } else {  // 3 bits: 8 dims in 3 bytes, four 6-bit fields
    for (std::int64_t g = 0; g < D / 8; ++g) {
      const std::uint32_t w = load_u32(codes + 3 * g);
      const float* t = table + 4 * g * stride;
      c0 = hn::Add(c0, hn::Load(d4, t + 0 * stride + (w & 63u) * 4));
      c1 = hn::Add(c1, hn::Load(d4, t + 1 * stride + ((w >> 6) & 63u) * 4));
      c2 = hn::Add(c2, hn::Load(d4, t + 2 * stride + ((w >> 12) & 63u) * 4));
      c3 = hn::Add(c3, hn::Load(d4, t + 3 * stride + ((w >> 18) & 63u) * 4));
    }
  }
  return hn::Add(hn::Add(c0, c1), hn::Add(c2, c3));
}

HWY_INLINE hn::Vec<hn::Full128<float>> key_signs(const float* table, const std::uint8_t* jl, std::int64_t D) {
  const hn::Full128<float> d4;
  auto s0 = hn::Zero(d4), s1 = s0;
  for (std::int64_t j = 0; j < D / 8; j += 2) {
    s0 = hn::Add(s0, hn::Load(d4, table + (j + 0) * padded_stride(256) + jl[j + 0] * 4));
    s1 = hn::Add(s1, hn::Load(d4, table + (j + 1) * padded_stride(256) + jl[j + 1] * 4));
  }
  return hn::Add(s0, s1);
}

// The centroids of value codes: one table lookup when the codebook fits a vector, two and a select
// when it fits two, a gather otherwise (16 levels on 4-lane vectors).
template <class D, int kBits>
struct ValueDecoder {
  using V = hn::Vec<D>;
  using DU = hn::RebindToUnsigned<D>;
  using VU = hn::Vec<DU>;
  using D8 = hn::Repartition<std::uint8_t, D>;
  using V8 = hn::Vec<D8>;
  static constexpr int bits = kBits, levels = 1 << kBits;
  // Lanes: a constant where the target's vectors have a fixed size (every x86 and NEON target), so that the
  // codebook's fit and the window's layout are decided when compiling.
  static constexpr std::int64_t N = HWY_HAVE_SCALABLE ? 0 : std::int64_t(hn::MaxLanes(D()));
  static_assert(HWY_HAVE_SCALABLE == 0, "ValueDecoder needs vectors of a fixed size");
  V lo, hi;
  VU shifts;
  // decode_pair: two chunks (2N dims, at most 16 bytes of codes) from one 16-byte load copied to every
  // 128-bit block; lane i of chunk k takes the two bytes holding its code (byte index >= 0x80 reads 0)
  // and shifts it down.
  bool pairs = false;
  V8 pair_bytes[2];
  VU pair_shifts[2];
  alignas(64) float centroids[16] = {};

  explicit ValueDecoder(D d, const float* c) {
    const DU du;
    // Repeated every `levels` entries: a permute that reads an index's low log2(N) bits (permute) then
    // finds code i at entry i + levels * k as well, whatever the higher code bits above it hold.
    for (int i = 0; i < 16; ++i) centroids[i] = c[i % levels];
    lo = hn::LoadU(d, centroids);
    hi = N < 16 ? hn::LoadU(d, centroids + N) : lo;
    // Lane i of a chunk holds dim c + i: its code sits at bit b * ((c + i) % 8) of the 32-bit window
    // at byte b * ((c + i) / 8) (8 dims take b bytes).
    shifts = hn::Mul(hn::And(hn::Iota(du, 0), hn::Set(du, 7u)), hn::Set(du, std::uint32_t(bits)));
    pairs = N >= 8 && N <= 16;
    if (!pairs) return;
    const D8 d8;
    for (int k = 0; k < 2; ++k) {
      alignas(64) std::uint8_t index[64] = {};
      alignas(64) std::uint32_t shift[16] = {};
      for (std::int64_t i = 0; i < N; ++i) {
        const std::int64_t bit = (k * N + i) * bits, byte = bit / 8;
        index[4 * i] = std::uint8_t(byte);
        index[4 * i + 1] = byte + 1 < 16 ? std::uint8_t(byte + 1) : std::uint8_t(0x80);
        index[4 * i + 2] = index[4 * i + 3] = 0x80;
        shift[i] = std::uint32_t(bit % 8);
      }
      pair_bytes[k] = hn::Load(d8, index);
      pair_shifts[k] = hn::Load(du, shift);
    }
  }

  // Lane i: table[idx[i] mod N]. AVX2's lane permute reads only the low 3 bits of each index, so a code's
  // window needs no mask there; other targets mask it (AVX-512's permute would not need it either, but
  // this machine cannot run that path to test it).
  static HWY_INLINE V permute(D d, V table, VU idx) {
#if HWY_TARGET == HWY_AVX2
    (void)d;
    return V{_mm256_permutevar8x32_ps(table.raw, idx.raw)};
#else
    const DU du;
    const hn::RebindToSigned<D> di;
    const VU low = hn::And(idx, hn::Set(du, std::uint32_t(N - 1)));
    return hn::TableLookupLanes(table, hn::IndicesFromVec(d, hn::BitCast(di, low)));
#endif
  }

  // The centroids (from the tables lo and hi, ValueDecoder's or scaled copies of them) of the codes in the
  // low `bits` bits of idx's lanes; the bits above them are ignored. A codebook larger than two vectors is
  // gathered from `centroids`, unscaled.
  HWY_INLINE V centroids_of(D d, VU idx, V table_lo, V table_hi) const {
    if constexpr (levels <= N) {
      return permute(d, table_lo, idx);
    } else if constexpr (levels <= 2 * N) {  // codes N and above from the second table
#if HWY_TARGET == HWY_AVX2
      // blendv selects by the sign bit: bit 3 of the code (8 lanes) moved there.
      return V{_mm256_blendv_ps(permute(d, table_lo, idx).raw, permute(d, table_hi, idx).raw,
                                _mm256_castsi256_ps(_mm256_slli_epi32(idx.raw, 28)))};
#else
      const DU du;
      const hn::RebindToSigned<D> di;
      const VU code = hn::And(idx, hn::Set(du, std::uint32_t(levels - 1)));
      const auto below = hn::Lt(hn::BitCast(di, code), hn::Set(di, std::int32_t(N)));  // code < 16: signed is exact
      return hn::IfThenElse(hn::RebindMask(d, below), permute(d, table_lo, idx), permute(d, table_hi, idx));
#endif
    } else {
      const DU du;
      const hn::RebindToSigned<D> di;
      return hn::GatherIndex(d, centroids, hn::BitCast(di, hn::And(idx, hn::Set(du, std::uint32_t(levels - 1)))));
    }
  }

  // Centroids of dims [c, c + N) of a row whose code bytes start at `codes` (c a multiple of N). The
  // last window reads up to one byte past the row, which the next region of the cache always holds.
  HWY_INLINE V decode(D d, const std::uint8_t* codes, std::int64_t c) const { return decode(d, codes, c, lo, hi); }
  // The same from the tables table_lo and table_hi (scaled copies of lo and hi).
  HWY_INLINE V decode(D d, const std::uint8_t* codes, std::int64_t c, V table_lo, V table_hi) const {
    const DU du;
    VU window;
    VU shift = shifts;
    if constexpr (N >= 16) {
      window = hn::IfThenElse(hn::FirstN(du, 8), hn::Set(du, load_u32(codes + bits * (c / 8))),
                              hn::Set(du, load_u32(codes + bits * (c / 8 + 1))));
    } else {
      window = hn::Set(du, load_u32(codes + bits * (c / 8)));
      if (N == 4 && c % 8 != 0) shift = hn::Add(shift, hn::Set(du, std::uint32_t(bits * 4)));
    }
    return centroids_of(d, hn::Shr(window, shift), table_lo, table_hi);
  }

  // Dims [c, c + N) and [c + N, c + 2N) (c a multiple of 8) with one load of the 16 bytes at the first
  // code's byte: up to 16 - 2 N b / 8 bytes past the two chunks, which callers allow only where the
  // cache holds that many more bytes (any slot but a region's last: the next slot's codes and the
  // region after them follow). Needs `pairs`.
  // Whether decode_pair may serve slot `slot` of a region of `slots`.
  bool pairs_at(std::int64_t slot, std::int64_t slots) const { return pairs && slot + 1 < slots; }

  HWY_INLINE void decode_pair(D d, const std::uint8_t* codes, std::int64_t c, V& out0, V& out1) const {
    decode_pair_at(d, codes + bits * (c / 8), lo, hi, out0, out1);
  }
  // The same from the byte of the pair's first code (codes + bits * c / 8) and the tables table_lo and
  // table_hi (scaled copies of lo and hi).
  HWY_INLINE void decode_pair_at(D d, const std::uint8_t* first_code, V table_lo, V table_hi, V& out0, V& out1) const {
    const DU du;
    const D8 d8;
    const V8 bytes = hn::LoadDup128(d8, first_code);
    const VU w0 = hn::BitCast(du, hn::TableLookupBytesOr0(bytes, pair_bytes[0]));
    const VU w1 = hn::BitCast(du, hn::TableLookupBytesOr0(bytes, pair_bytes[1]));
    out0 = centroids_of(d, hn::Shr(w0, pair_shifts[0]), table_lo, table_hi);
    out1 = centroids_of(d, hn::Shr(w1, pair_shifts[1]), table_lo, table_hi);
  }
};

// Dims [c, c + N) of an exact row (bf16, in element order).
template <class D>
HWY_INLINE hn::Vec<D> exact_chunk(D d, const std::uint32_t* row, std::int64_t c) {
  const hn::RebindToUnsigned<D> du;
  const hn::Rebind<std::uint16_t, D> d16;
  const auto halves = hn::LoadU(d16, reinterpret_cast<const std::uint16_t*>(row) + c);
  return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, halves)));
}

// Dims [c, c + N) of a row of f16 values (two per word, element 2i in the low half): a block mean.
template <class D>
HWY_INLINE hn::Vec<D> f16_chunk(D d, const std::uint32_t* row, std::int64_t c) {
  const hn::Rebind<hwy::float16_t, D> dh;
  return hn::PromoteTo(d, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(row) + c));
}

// The sum of x[0, n), a vector at a time.
template <class D>
HWY_INLINE float sum_of(D d, const float* x, std::int64_t n) {
  const std::int64_t N = std::int64_t(hn::Lanes(d));
  auto sum = hn::Zero(d);
  std::int64_t i = 0;
  for (; i + N <= n; i += N) sum = hn::Add(sum, hn::LoadU(d, x + i));
  float total = hn::GetLane(hn::SumOfLanes(d, sum));
  for (; i < n; ++i) total += x[i];
  return total;
}

// out[i] = the f16 halves of words [0, count) as floats, in memory order (a word's low half first): a
// vector of conversions at a time instead of one scalar conversion per norm.
template <class D>
HWY_INLINE void halves_to_floats(D d, const std::uint32_t* words, std::int64_t count, float* out) {
  const hn::Rebind<hwy::float16_t, D> dh;
  const std::int64_t N = std::int64_t(hn::Lanes(d)), halves = 2 * count;
  const auto* h = reinterpret_cast<const hwy::float16_t*>(words);
  std::int64_t i = 0;
  for (; i + N <= halves; i += N) hn::StoreU(hn::PromoteTo(d, hn::LoadU(dh, h + i)), d, out + i);
  for (; i < halves; ++i) out[i] = (i % 2 == 0 ? f16_low(words[i / 2]) : f16_low(words[i / 2] >> 16));
}

// Heads [g0, g0 + GT) (GT <= 4) of one (row, kv head) over timesteps [t0, t1): fills their m, l and
// rotated-space accumulators (acc: GT x D). Each code word is read once for all the heads.
// The heads' dot products of q_rot with a key's decoded codes are added to sum0/sum1 (two chains, so that
// the FMAs interleave), the codes decoded a vector at a time (as values are) instead of through tables:
// the tables of 2- to 4-bit codes are 64 to 256 KB at D = 128 and their reads wait on L2 (this measured
// about 1.5x faster for 4-bit keys, docs/benchmarks.md). The codes index the centroids times `part_scale`
// (the part's norm times the softmax scale: one multiply per part, not per chunk), so the parts of a key with outlier
// channels share one reduction per head (row_sums). `first`: the coordinate of q_rot where these codes start; dim is a
// multiple of the lanes (parts are at least 16 coordinates), not always of twice them. `pairs`: whether
// decode_pair may read past these codes (ValueDecoder::decode_pair).
// `dim` and `first` are std::int64_t, or std::integral_constant where the layout fixes them (kHead128).
template <int GT, class D, class Decoder, class Dim, class First>
HWY_INLINE void add_key_dots(D d, const Decoder& dec, const float* const* q_rot, const std::uint8_t* codes, Dim dim,
                             First first, float part_scale, bool pairs, hn::Vec<D> (&sum0)[GT],
                             hn::Vec<D> (&sum1)[GT]) {
  using V = hn::Vec<D>;
  const std::int64_t N = std::int64_t(hn::Lanes(d));
  const V k = hn::Set(d, part_scale);
  // The centroids times the part's scale: the tables scaled once where they are vectors, each decoded
  // chunk scaled where the codebook is gathered (16 levels on 4 lanes).
  constexpr bool kScaledTables = Decoder::levels <= 2 * Decoder::N;
  const V table_lo = kScaledTables ? hn::Mul(dec.lo, k) : dec.lo,
          table_hi = kScaledTables ? hn::Mul(dec.hi, k) : dec.hi;
  auto scaled = [&](V cent) { return kScaledTables ? cent : hn::Mul(cent, k); };
  // The heads' query coordinates of these codes: q_rot[g] + first, read at an offset from the first head's.
  const float* q = q_rot[0] + first;
  std::ptrdiff_t head_offset[GT];
  for (int g = 0; g < GT; ++g) head_offset[g] = q_rot[g] - q_rot[0];
  auto multiply = [&](const float* qc, V cent0, V cent1) {
    cent0 = scaled(cent0);
    cent1 = scaled(cent1);
    for (int g = 0; g < GT; ++g) {
      sum0[g] = hn::MulAdd(hn::LoadU(d, qc + head_offset[g]), cent0, sum0[g]);
      sum1[g] = hn::MulAdd(hn::LoadU(d, qc + head_offset[g] + N), cent1, sum1[g]);
    }
  };
  std::int64_t c = 0;
  if (pairs) {  // the pair's codes a pointer step apart (2N codes: 2N bits / 8 bytes); two induction pointers
    constexpr std::int64_t kStep = 2 * Decoder::N * Decoder::bits / 8;
    const std::int64_t count = std::int64_t(std::uint64_t(dim) / (2 * Decoder::N));  // unsigned: a shift
    const float* qc = q;
    for (const std::uint8_t *pair_codes = codes, *end = codes + count * kStep; pair_codes != end;
         pair_codes += kStep, qc += 2 * N) {
      V cent0, cent1;
      dec.decode_pair_at(d, pair_codes, table_lo, table_hi, cent0, cent1);
      multiply(qc, cent0, cent1);
    }
    c = count * 2 * N;
  } else {
    for (; c + 2 * N <= dim; c += 2 * N)
      multiply(q + c, dec.decode(d, codes, c, table_lo, table_hi), dec.decode(d, codes, c + N, table_lo, table_hi));
  }
  if (c < dim) {
    const V cent0 = scaled(dec.decode(d, codes, c, table_lo, table_hi));
    for (int g = 0; g < GT; ++g) sum0[g] = hn::MulAdd(hn::LoadU(d, q + c + head_offset[g]), cent0, sum0[g]);
  }
}

// Lane i of the result: the sum of the N lanes of rows[i] (N vectors of N floats, N a power of two): the
// dot products of N keys in log2(N) levels of pairwise sums instead of a horizontal sum each. Each level
// halves the lanes every vector gives to a row and keeps the rows in order.
template <class D>
HWY_INLINE hn::Vec<D> row_sums(D d, const float* rows) {
  using V = hn::Vec<D>;
  const std::int64_t N = std::int64_t(hn::Lanes(d));
  V v[16];
  for (std::int64_t i = 0; i < N; ++i) v[i] = hn::Load(d, rows + i * N);
  for (std::int64_t count = N; count > 1; count /= 2)
    for (std::int64_t k = 0; k < count / 2; ++k)
      v[k] = hn::Add(hn::ConcatEven(d, v[2 * k + 1], v[2 * k]), hn::ConcatOdd(d, v[2 * k + 1], v[2 * k]));
  return v[0];
}

// kKeyBits: the key code width decoded a vector at a time (keys without QJL), or 0 for the tables. kHead128:
// head_dim is 128 and the keys' parts are those has_head128_parts accepts (the presets' at 128), so that every loop
// over the coordinates and every key part has a constant trip count: a token's parts then cost no loop set-up.
template <int GT, int kValueBits, int kKeyBits, bool kHead128 = false>
void attend_heads(const TqAttendCall& a, std::int64_t row, std::int64_t kvh, std::int64_t g0, std::int64_t t0,
                  std::int64_t t1, std::int64_t end, float* m, float* l, float* acc) {
  const hn::ScalableTag<float> d;
  const hn::Full128<float> d4;  // one lane per head of the quad
  using V = hn::Vec<decltype(d)>;
  const std::int64_t N = std::int64_t(hn::Lanes(d));
  const TqLayout& lay = a.layout();
  const std::int64_t D = kHead128 ? 128 : lay.head_dim, H = a.n_heads, G = H / lay.n_kv_heads, b = row / a.n_queries;
  const std::uint32_t* keys = a.keys(b);
  const std::uint32_t* values = a.values(b);
  const TqSequence seq = a.sequence(b);
  const KeyFields fields(lay.key_bits);
  const ValueDecoder<decltype(d), kValueBits> value_codes(d, a.tables.value_centroids.data());
  const float scale = a.scale, qjl = a.qjl_scale;
  const float* q_rot[GT];
  const float* q_jl[GT];
  for (int g = 0; g < GT; ++g) {
    q_rot[g] = a.scratch + a.scratch_layout.q_rot(row, kvh * G + g0 + g);
    q_jl[g] = a.scratch + a.scratch_layout.q_jl(row, kvh * G + g0 + g);
    m[g] = -std::numeric_limits<float>::infinity();
    l[g] = 0.0f;
  }
  std::fill(acc, acc + GT * D, 0.0f);
  if (t0 >= t1) return;
  thread_local KeyTables tables;
  const ValueDecoder<decltype(d), kKeyBits == 0 ? 2 : kKeyBits> key_codes(d, a.tables.key_centroids.data());
  // Outlier channels' part: 4 bits (the only width the SIMD path serves for them, tq_attend_simd).
  const ValueDecoder<decltype(d), 4> outlier_codes(d, a.tables.outlier_centroids.data());
  // The key parts (with outlier channels): where each one's codes start (parts start on whole bytes), its
  // coordinates and their count; part 0, the outliers, starts at 0.
  std::int64_t part_byte[core::kMaxKeyParts], part_first[core::kMaxKeyParts], part_size[core::kMaxKeyParts];
  const int n_parts = lay.key_outliers ? lay.key_parts() : 0;
  for (int p = 0; p < n_parts; ++p) {
    const TqLayout::KeyPart kp = lay.key_part(p);
    part_byte[p] = kp.bit_offset / 8;
    part_first[p] = kp.offset;
    part_size[p] = kp.size;
  }
  if (kKeyBits == 0) build_key_tables(q_rot, q_jl, GT, D, fields, lay.qjl, a.tables.key_centroids.data(), tables);
  // The exact copy of timestep t, or null when its codes are read (docs/turboquant_layout.md).
  auto exact = [&](const std::uint32_t* cache, std::int64_t region, std::int64_t t) -> const std::uint32_t* {
    const std::int64_t r = lay.exact_row(t, end);
    return r < 0 ? nullptr : cache + region + lay.exact_row_at(seq.exact_set, kvh, r);
  };
  // Per head, the block's scores, then p * |v_t|: the weights of the values.
  alignas(64) float w[GT][kBlock];
  alignas(64) float w_lanes[kBlock * GT * 16];  // w broadcast: token t, head g at (t GT + g) N
  // Decoded keys: each token's per-head vector of partial dot products (N <= 16 lanes), reduced by row_sums;
  // zeroed once so that the rows past a block's last token hold finite numbers.
  alignas(64) float partial[kKeyBits != 0 ? GT : 1][kKeyBits != 0 ? kBlock * 16 : 1] = {};
  bool coded[kBlock];
  alignas(16) float scores[kBlock][4];  // exact rows' scores, and the tables' (four heads a token)
  const std::uint32_t* exact_v[kBlock];
  // The block's norms from f16, a vector at a time: each key slot's norm words (2 halves per word: the
  // norm and gamma, or the parts' norms), and each value slot's word (the norm in its low half).
  constexpr std::int64_t kMaxNormHalves = 2 * ((core::kMaxKeyParts + 1) / 2);
  const std::int64_t key_halves = 2 * lay.key_norm_words();
  alignas(64) float key_norms[kBlock * kMaxNormHalves];
  alignas(64) float value_norms[2 * kBlock];
  alignas(64) float vnorm[kBlock];
  const std::int64_t slots = lay.slots();
  // Block means (docs/turboquant_layout.md): the heads' <q_rot, mu_b> of the key block last seen, computed
  // once per block; a value block's mean is added once per softmax step, weighted by its coded timesteps' p.
  std::int64_t key_block_seen = -1;
  alignas(16) float key_mean_dots[4] = {};
  auto key_mean_dot = [&](std::int64_t t) -> const float* {
    if (t / lay.key_block != key_block_seen) {
      key_block_seen = t / lay.key_block;
      const std::uint32_t* mean = keys + lay.key_mean(kvh, seq.timestep(t));
      V sum[GT];
      for (int g = 0; g < GT; ++g) sum[g] = hn::Zero(d);
      for (std::int64_t c = 0; c < D; c += N) {
        const V mu = f16_chunk(d, mean, c);
        for (int g = 0; g < GT; ++g) sum[g] = hn::MulAdd(hn::LoadU(d, q_rot[g] + c), mu, sum[g]);
      }
      for (int g = 0; g < GT; ++g) key_mean_dots[g] = scale * hn::GetLane(hn::SumOfLanes(d, sum[g]));
    }
    return key_mean_dots;
  };
  for (std::int64_t tb = t0, n = 0; tb < t1; tb += n) {
    // A softmax step stays in one page of a pool (its timesteps are consecutive slots there).
    n = std::min(kBlock, t1 - tb);
    if (lay.paged()) n = std::min<std::int64_t>(n, lay.page_size - tb % lay.page_size);
    const std::int64_t slot0 = kvh * lay.capacity + seq.timestep(tb);  // timestep tb's slot
    // Whether the block holds an exact row: the sinks, or the recent window at the sequence's end.
    const bool any_exact = tb < lay.sink_tokens || (lay.recent_tokens > 0 && tb + n > end - lay.recent_tokens);
    halves_to_floats(d, keys + lay.key_norm_offset() + slot0 * lay.key_norm_words(), n * lay.key_norm_words(),
                     key_norms);
    halves_to_floats(d, values + lay.value_norm_offset() + slot0, n, value_norms);
    for (std::int64_t t = 0; t < n; ++t) {  // scores of the block's tokens, four heads at once
      const std::int64_t slot = slot0 + t;
      const float* norms = key_norms + t * key_halves;
      coded[t] = false;
      if (const std::uint32_t* k = any_exact ? exact(keys, lay.key_exact_offset(), tb + t) : nullptr) {
        for (int g = 0; g < 4; ++g) scores[t][g] = 0.0f;
        for (int g = 0; g < GT; ++g) {
          V dot = hn::Zero(d);
          for (std::int64_t c = 0; c < D; c += N)
            dot = hn::MulAdd(hn::LoadU(d, q_rot[g] + c), exact_chunk(d, k, c), dot);
          scores[t][g] = scale * hn::GetLane(hn::SumOfLanes(d, dot));
        }
        continue;
      }
      const auto* codes = reinterpret_cast<const std::uint8_t*>(keys + slot * lay.key_code_words());
      if (kKeyBits != 0) {  // no QJL with these keys; with outlier channels part by part, each by its norm
        V sum0[GT], sum1[GT];
        for (int g = 0; g < GT; ++g) sum0[g] = sum1[g] = hn::Zero(d);
        const bool pairs = key_codes.pairs_at(slot, slots);
        if (kHead128 && lay.key_outliers) {  // 32 outliers (4 bits), then parts of 64 and 32 coordinates
          using C = std::integral_constant<std::int64_t, 0>;
          add_key_dots<GT>(d, outlier_codes, q_rot, codes, std::integral_constant<std::int64_t, 32>{}, C{},
                           scale * norms[0], pairs, sum0, sum1);
          add_key_dots<GT>(d, key_codes, q_rot, codes + 16, std::integral_constant<std::int64_t, 64>{},
                           std::integral_constant<std::int64_t, 32>{}, scale * norms[1], pairs, sum0, sum1);
          add_key_dots<GT>(d, key_codes, q_rot, codes + 16 + 8 * kKeyBits, std::integral_constant<std::int64_t, 32>{},
                           std::integral_constant<std::int64_t, 96>{}, scale * norms[2], pairs, sum0, sum1);
        } else if (kHead128) {
          add_key_dots<GT>(d, key_codes, q_rot, codes, std::integral_constant<std::int64_t, 128>{},
                           std::integral_constant<std::int64_t, 0>{}, scale * norms[0], pairs, sum0, sum1);
        } else if (lay.key_outliers) {
          add_key_dots<GT>(d, outlier_codes, q_rot, codes, part_size[0], 0, scale * norms[0], pairs, sum0, sum1);
          for (int p = 1; p < n_parts; ++p)
            add_key_dots<GT>(d, key_codes, q_rot, codes + part_byte[p], part_size[p], part_first[p], scale * norms[p],
                             pairs, sum0, sum1);
        } else {
          add_key_dots<GT>(d, key_codes, q_rot, codes, D, 0, scale * norms[0], pairs, sum0, sum1);
        }
        for (int g = 0; g < GT; ++g) hn::Store(hn::Add(sum0[g], sum1[g]), d, partial[g] + t * N);
        coded[t] = true;  // its scores come from row_sums after the block's keys
        continue;
      }
      auto dot = key_polar(tables.codes, codes, D, fields);
      if (lay.qjl) {
        const auto* jl = reinterpret_cast<const std::uint8_t*>(keys + lay.key_jl_offset() + slot * lay.jl_words());
        dot = hn::MulAdd(hn::Set(d4, norms[1] * qjl), key_signs(tables.signs, jl, D), dot);
      }
      // score = scale |k| (<q, centroids> + gamma qjl <q_jl, signs>)
      hn::Store(hn::Mul(hn::Set(d4, scale * norms[0]), dot), d4, scores[t]);
    }
    for (int g = 0; g < GT; ++g) {  // the heads' scores into w, head by head
      float* s = w[g];
      if (kKeyBits != 0) {  // decoded keys: N tokens at a time (rows past the block's end are finite and unread)
        for (std::int64_t u = 0; u < n; u += N) hn::Store(row_sums(d, partial[g] + u * N), d, s + u);
        if (any_exact)
          for (std::int64_t t = 0; t < n; ++t)
            if (!coded[t]) s[t] = scores[t][g];
      } else {
        for (std::int64_t t = 0; t < n; ++t) s[t] = scores[t][g];
      }
    }
    if (lay.key_block) {  // coded keys: plus <q_rot, mu_b> of their block, a run of the block's tokens at a time
      for (std::int64_t t = 0; t < n;) {
        const std::int64_t run_end = std::min(n, ((tb + t) / lay.key_block + 1) * lay.key_block - tb);
        const float* dots = key_mean_dot(tb + t);
        for (int g = 0; g < GT; ++g) {
          if (any_exact) {
            for (std::int64_t u = t; u < run_end; ++u)
              if (!exact(keys, lay.key_exact_offset(), tb + u)) w[g][u] += dots[g];
          } else {
            for (std::int64_t u = t; u < run_end; ++u) w[g][u] += dots[g];
          }
        }
        t = run_end;
      }
    }
    for (std::int64_t t = 0; t < n; ++t) {  // |v_t|, once for the heads (1 for an exact row)
      exact_v[t] = any_exact ? exact(values, lay.value_exact_offset(), tb + t) : nullptr;
      vnorm[t] = exact_v[t] ? 1.0f : value_norms[2 * t];
    }
    for (int g = 0; g < GT; ++g) {  // online softmax per head; w becomes p * |v_t|
      float* s = w[g];
      if (a.softcap > 0.0f)  // docs/spec.md §1.8, on the whole score (block means' dots included); all visible
        ::flashtq::cpu::softcap(s, std::size_t(n), a.softcap);
      const float m_new = std::max(m[g], max_of(s, std::size_t(n)));
      const float corr = std::exp(m[g] - m_new);
      l[g] = l[g] * corr + exp_shift_sum(s, std::size_t(n), m_new);
      if (corr != 1.0f) ::flashtq::cpu::scale(acc + g * D, std::size_t(D), corr);
      m[g] = m_new;
      if (lay.value_block) {  // each value block's mean, weighted by its coded timesteps' p (before the norms)
        for (std::int64_t t = 0; t < n;) {
          const std::int64_t block_end = std::min(n, ((tb + t) / lay.value_block + 1) * lay.value_block - tb);
          float weight = 0.0f;
          if (any_exact) {
            for (std::int64_t u = t; u < block_end; ++u)
              if (!exact_v[u]) weight += s[u];
          } else {
            weight = sum_of(d, s + t, block_end - t);
          }
          if (weight != 0.0f) {
            const std::uint32_t* mean = values + lay.value_mean(kvh, seq.timestep(tb + t));
            const V wt = hn::Set(d, weight);
            for (std::int64_t c = 0; c < D; c += N)
              hn::StoreU(hn::MulAdd(wt, f16_chunk(d, mean, c), hn::LoadU(d, acc + g * D + c)), d, acc + g * D + c);
          }
          t = block_end;
        }
      }
      for (std::int64_t t = 0; t < n; ++t) s[t] *= vnorm[t];
    }
    // The weights broadcast once per token and head: the FMAs of every chunk pair read them as a memory
    // operand (AVX2 has no broadcast operand), instead of a broadcast instruction per head and chunk pair.
    for (std::int64_t t = 0; t < n; ++t)
      for (int g = 0; g < GT; ++g) hn::Store(hn::Set(d, w[g][t]), d, w_lanes + (t * GT + g) * N);
    // Values, two chunks at a time: the heads' accumulators of the chunks stay in registers over the
    // block, each weight serves both, and the two chunks' FMA chains interleave. `chunks`
    // gives token t's centroids (or exact row) of the two chunks at c.
    const std::int64_t code_bytes = 4 * lay.value_code_words();
    const auto* block_codes = reinterpret_cast<const std::uint8_t*>(values + slot0 * lay.value_code_words());
    auto accumulate_values = [&](auto chunks) {
      for (std::int64_t c = 0; c < D; c += 2 * N) {
        V sum0[GT], sum1[GT];
        for (int g = 0; g < GT; ++g) {
          sum0[g] = hn::LoadU(d, acc + g * D + c);
          sum1[g] = hn::LoadU(d, acc + g * D + c + N);
        }
        for (std::int64_t t = 0; t < n; ++t) {
          V cent0, cent1;
          chunks(t, c, cent0, cent1);
          for (int g = 0; g < GT; ++g) {
            const V wt = hn::Load(d, w_lanes + (t * GT + g) * N);
            sum0[g] = hn::MulAdd(wt, cent0, sum0[g]);
            sum1[g] = hn::MulAdd(wt, cent1, sum1[g]);
          }
        }
        for (int g = 0; g < GT; ++g) {
          hn::StoreU(sum0[g], d, acc + g * D + c);
          hn::StoreU(sum1[g], d, acc + g * D + c + N);
        }
      }
    };
    if (!any_exact && value_codes.pairs_at(slot0 + n - 1, slots)) {  // every token coded, every pair decode allowed
      accumulate_values([&](std::int64_t t, std::int64_t c, V& cent0, V& cent1) {
        value_codes.decode_pair(d, block_codes + t * code_bytes, c, cent0, cent1);
      });
    } else if (!any_exact && !value_codes.pairs) {  // every token coded, each chunk from its own window
      accumulate_values([&](std::int64_t t, std::int64_t c, V& cent0, V& cent1) {
        cent0 = value_codes.decode(d, block_codes + t * code_bytes, c);
        cent1 = value_codes.decode(d, block_codes + t * code_bytes, c + N);
      });
    } else {
      accumulate_values([&](std::int64_t t, std::int64_t c, V& cent0, V& cent1) {
        const std::uint8_t* codes = block_codes + t * code_bytes;
        if (exact_v[t]) {
          cent0 = exact_chunk(d, exact_v[t], c);
          cent1 = exact_chunk(d, exact_v[t], c + N);
        } else if (value_codes.pairs_at(slot0 + t, slots)) {
          value_codes.decode_pair(d, codes, c, cent0, cent1);
        } else {
          cent0 = value_codes.decode(d, codes, c);
          cent1 = value_codes.decode(d, codes, c + N);
        }
      });
    }
  }
}

// Whether attend_heads<..., kHead128> serves the layout: head_dim 128 with no outlier channels, or with 32 of them at
// 4 bits (parts of 32, 64 and 32 coordinates: the presets' layouts at 128).
bool has_head128_parts(const TqLayout& l) {
  if (l.head_dim != 128) return false;
  if (l.key_outliers == 0) return true;
  return l.key_outliers == 32 && l.key_outlier_bits == 4 && l.key_parts() == 3 && l.key_part(1).size == 64 &&
         l.key_part(2).size == 32 && l.key_part(1).bit_offset == 128 &&
         l.key_part(2).bit_offset == 128 + 64 * l.key_bits;
}

// One (row, kv head): every head of its group, in quads (the last one 3, 2 or 1 heads).
template <int kValueBits, int kKeyBits>
void attend_group(const TqAttendCall& a, std::int64_t row, std::int64_t kvh, std::int64_t t0, std::int64_t t1,
                  std::int64_t end, float* m, float* l, float* acc) {
  const std::int64_t G = a.group(), D = a.layout().head_dim;
  std::int64_t g = 0;
  if (kKeyBits != 0 && has_head128_parts(a.layout())) {
    for (; g + 4 <= G; g += 4)
      attend_heads<4, kValueBits, kKeyBits, true>(a, row, kvh, g, t0, t1, end, m + g, l + g, acc + g * D);
  }
  for (; g + 4 <= G; g += 4)
    attend_heads<4, kValueBits, kKeyBits>(a, row, kvh, g, t0, t1, end, m + g, l + g, acc + g * D);
  if (G - g == 3) attend_heads<3, kValueBits, kKeyBits>(a, row, kvh, g, t0, t1, end, m + g, l + g, acc + g * D);
  if (G - g == 2) attend_heads<2, kValueBits, kKeyBits>(a, row, kvh, g, t0, t1, end, m + g, l + g, acc + g * D);
  if (G - g == 1) attend_heads<1, kValueBits, kKeyBits>(a, row, kvh, g, t0, t1, end, m + g, l + g, acc + g * D);
}

template <int kKeyBits>
void attend_by_value_bits(const TqAttendCall& a, std::int64_t row, std::int64_t kvh, std::int64_t t0, std::int64_t t1,
                          std::int64_t end, float* m, float* l, float* acc) {
  switch (a.layout().value_bits) {  // the validator allows 2 to 4
    case 2: attend_group<2, kKeyBits>(a, row, kvh, t0, t1, end, m, l, acc); break;
    case 3: attend_group<3, kKeyBits>(a, row, kvh, t0, t1, end, m, l, acc); break;
    default: attend_group<4, kKeyBits>(a, row, kvh, t0, t1, end, m, l, acc); break;
  }
}

void AttendRange(const TqAttendCall& a, std::int64_t row, std::int64_t kvh, std::int64_t t0, std::int64_t t1,
                 std::int64_t end, float* m, float* l, float* acc) {
  const TqLayout& lay = a.layout();
  const int decoded = lay.qjl ? 0 : lay.key_bits;  // QJL keys and 1-bit keys: tables
  switch (decoded) {
    case 2: attend_by_value_bits<2>(a, row, kvh, t0, t1, end, m, l, acc); break;
    case 3: attend_by_value_bits<3>(a, row, kvh, t0, t1, end, m, l, acc); break;
    case 4: attend_by_value_bits<4>(a, row, kvh, t0, t1, end, m, l, acc); break;
    default: attend_by_value_bits<0>(a, row, kvh, t0, t1, end, m, l, acc); break;
  }
}

bool Supported() {
  const hn::ScalableTag<float> d;
  return hn::Lanes(d) >= 4 && hn::Lanes(d) <= 16;
}
#else
void AttendRange(const TqAttendCall&, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, float*,
                 float*, float*) {}
bool Supported() { return false; }
#endif

}  // namespace flashtq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace flashtq::cpu {

HWY_EXPORT(AttendRange);
HWY_EXPORT(Supported);

bool tq_attend_simd(const TqAttendCall& a, int threads) {
  const TqLayout& l = a.layout();
  // Keys with outlier channels: 4-bit outliers over 2- to 4-bit codes (every preset's); others take the per-row code.
  if ((l.key_outliers && (l.key_outlier_bits != 4 || l.key_bits < 2)) || !HWY_DYNAMIC_DISPATCH(Supported)()) {
    return false;
  }
  const std::int64_t D = l.head_dim, H = a.n_heads, G = H / l.n_kv_heads, rows = a.batch * a.n_queries;
  // Units of (row, kv head, split); splits keep every thread busy in decode.
  const std::int64_t base_units = rows * l.n_kv_heads;
  const std::int64_t splits = std::clamp<std::int64_t>((4 * threads + base_units - 1) / base_units, 1, 64);
  std::vector<float> part(std::size_t(base_units * splits * G * (D + 2)));
#pragma omp parallel for schedule(dynamic) num_threads(threads)
  for (std::int64_t u = 0; u < base_units * splits; ++u) {
    const std::int64_t split = u % splits, row = (u / splits) / l.n_kv_heads, kvh = (u / splits) % l.n_kv_heads;
    const std::int64_t b = row / a.n_queries, j = row % a.n_queries;
    const std::int64_t start = a.start_positions ? std::int64_t(a.start_positions[b]) : a.start_pos;
    const std::int64_t seq = std::max<std::int64_t>(0, std::min({start + j + 1, a.max_seq, a.reach}));
    const std::int64_t first = std::min(a.first_visible(start + j), seq);
    const std::int64_t per = (seq - first + splits - 1) / splits;
    const std::int64_t t0 = std::min(seq, first + split * per), t1 = std::min(seq, t0 + per);
    float* out = part.data() + u * G * (D + 2);
    HWY_DYNAMIC_DISPATCH(AttendRange)(a, row, kvh, t0, t1, a.sequence_end(start), out, out + G, out + 2 * G);
  }
  // Merge the splits by LSE, normalise, rotate back once.
#pragma omp parallel for schedule(static) num_threads(threads)
  for (std::int64_t r = 0; r < base_units; ++r) {
    const std::int64_t row = r / l.n_kv_heads, kvh = r % l.n_kv_heads;
    const std::int64_t b = row / a.n_queries, j = row % a.n_queries;
    std::vector<float> x(static_cast<std::size_t>(D));
    for (std::int64_t g = 0; g < G; ++g) {
      const std::pair<float, float> keys = merge_partials(
          splits, D,
          [&](std::int64_t s) {
            const float* u = part.data() + (r * splits + s) * G * (D + 2);
            return Partial{u[g], u[G + g], u + 2 * G + g * D};
          },
          x.data());
      const float sink = a.sinks != nullptr ? a.sinks[kvh * G + g] : -std::numeric_limits<float>::infinity();
      const float L = join_sink(sink, keys, D, x.data()).second;
      for (float& e : x) e = L > 0.0f ? e / L : 0.0f;  // a row that sees nothing writes zeros
      core::inverse_rht(x.data(), D, a.tables.polar_sign_bits);
      float* out = static_cast<float*>(a.out.data) + core::offset(a.out, b, j, kvh * G + g);
      std::copy(x.begin(), x.end(), out);
    }
  }
  return true;
}

}  // namespace flashtq::cpu
#endif

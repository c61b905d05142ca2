// SIMD TurboQuant attention for the cpu backend, for 2-bit codebooks (keys 2+1 bits, values 2 bits):
// scores straight from the packed words (codes decoded 16 at a time into centroid vectors by a lane
// permutation, QJL bits loaded as a lane mask), values accumulated in rotated space chunk by chunk
// over a block of tokens, one inverse rotation at the end.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/tq_attend_simd.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/aligned_allocator.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/elements.hpp"
#include "core/half.hpp"
#include "core/rht.hpp"
#include "cpu/kernels.hpp"
#include "cpu/merge.hpp"
#include "cpu/turboquant.hpp"

HWY_BEFORE_NAMESPACE();
namespace flashtq::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr std::int64_t kBlock = 64;  // tokens per softmax step

inline float f16_low(std::uint32_t w) { return core::f16_to_f32(std::uint16_t(w & 0xFFFFu)); }

// Centroids of the 2-bit codes of dims [c, c + N) of a slot's code words.
template <class D, class V>
HWY_INLINE V decode(D d, const std::uint32_t* codes, std::int64_t c, V centroids) {
  const hn::RebindToUnsigned<D> du;
  const hn::RebindToSigned<D> di;
  const auto shifts = hn::Add(hn::Set(du, std::uint32_t(2 * (c % 16))), hn::ShiftLeft<1>(hn::Iota(du, 0)));
  const auto idx = hn::And(hn::Shr(hn::Set(du, codes[c / 16]), shifts), hn::Set(du, 3u));
  return hn::TableLookupLanes(centroids, hn::IndicesFromVec(d, hn::BitCast(di, idx)));
}

#if HWY_TARGET != HWY_SCALAR  // the tables need 128-bit vectors (one lane per head of a quad)
// Per-query lookup tables for key scores, four heads per entry (one 128-bit vector): for byte j of a
// key's code words (dims 4j..4j+3) and each of its 256 values, the heads' partial dot products with
// the centroids it selects; for byte j of the QJL bits (dims 8j..8j+7), the partial signed sums
// sum_i (+-1) q_jl[i]. A key's score is then 3D/8 table reads and vector adds for all four heads,
// with no horizontal sums. Heads past the group's end read as zero.
struct KeyTables {
  hwy::AlignedFreeUniquePtr<float[]> storage;  // codes [D/4][256][4], then signs [D/8][256][4]
  std::size_t size = 0;
  float* codes = nullptr;
  float* signs = nullptr;
  void reserve(std::int64_t D) {
    const std::size_t need = std::size_t(D / 4 * 256 * 4 + D / 8 * 256 * 4);
    if (need > size) storage = hwy::AllocateAligned<float>(need), size = need;
    codes = storage.get();
    signs = codes + D / 4 * 256 * 4;
  }
};

// Entries are built digit by digit (entry[x + radix^i * m] = entry[x] + q[i] * value(m)), about one
// vector add per entry.
void build_key_tables(const float* const* q_rot, const float* const* q_jl, int heads, std::int64_t D,
                      const float* centroids, KeyTables& t) {
  const hn::Full128<float> d4;
  t.reserve(D);
  auto across_heads = [&](const float* const* rows, std::int64_t dim) {
    alignas(16) float x[4] = {};
    for (int h = 0; h < heads; ++h) x[h] = rows[h][dim];
    return hn::Load(d4, x);
  };
  for (std::int64_t j = 0; j < D / 4; ++j) {  // 4 dims of 2-bit codes per byte
    float* e = t.codes + j * 256 * 4;
    hn::Store(hn::Zero(d4), d4, e);
    for (int i = 0, filled = 1; i < 4; ++i, filled *= 4) {
      const auto q = across_heads(q_rot, 4 * j + i);
      for (int code = 3; code >= 0; --code) {  // code 0 last: it overwrites the entries it reads
        const auto part = hn::Mul(q, hn::Set(d4, centroids[code]));
        for (int x = 0; x < filled; ++x)
          hn::Store(hn::Add(hn::Load(d4, e + x * 4), part), d4, e + (x + filled * code) * 4);
      }
    }
  }
  for (std::int64_t j = 0; j < D / 8; ++j) {  // 8 dims of sign bits per byte
    float* e = t.signs + j * 256 * 4;
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

// Heads [g0, g0 + GT) (GT <= 4) of one (row, kv head) over timesteps [t0, t1): fills their m, l and
// rotated-space accumulators (acc: GT x D). Each code word is read once for all the heads.
template <int GT>
void attend_heads(const TqAttendCall& a, std::int64_t row, std::int64_t kvh, std::int64_t g0, std::int64_t t0,
                  std::int64_t t1, float* m, float* l, float* acc) {
  const hn::ScalableTag<float> d;
  const hn::Full128<float> d4;  // one lane per head of the quad
  using V = hn::Vec<decltype(d)>;
  using V4 = hn::Vec<decltype(d4)>;
  const std::int64_t N = std::int64_t(hn::Lanes(d));
  const TqLayout& lay = a.layout();
  const std::int64_t D = lay.head_dim, H = a.n_heads, G = H / lay.n_kv_heads, b = row / a.n_queries;
  const std::uint32_t* keys = a.k_cache + b * lay.key_words();
  const std::uint32_t* values = a.v_cache + b * lay.value_words();
  alignas(64) float vc[16] = {};
  for (int i = 0; i < 4; ++i) vc[i] = a.tables.value_centroids[std::size_t(i)];
  const V value_c = hn::LoadU(d, vc);
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
  build_key_tables(q_rot, q_jl, GT, D, a.tables.key_centroids.data(), tables);
  const float* code_table = tables.codes;
  const float* sign_table = tables.signs;
  alignas(64) float w[GT][kBlock];
  alignas(16) float scores[kBlock][4];
  for (std::int64_t tb = t0; tb < t1; tb += kBlock) {
    const std::int64_t n = std::min(kBlock, t1 - tb);
    for (std::int64_t t = 0; t < n; ++t) {  // scores of the block's tokens, four heads at once
      const std::int64_t slot = kvh * lay.capacity + tb + t;
      const auto* codes = reinterpret_cast<const std::uint8_t*>(keys + slot * lay.key_code_words());
      const auto* jl = reinterpret_cast<const std::uint8_t*>(keys + lay.key_jl_offset() + slot * lay.jl_words());
      const std::uint32_t nw = keys[lay.key_norm_offset() + slot];
      // Four partial sums each: a single chain of adds would be latency-bound.
      V4 c0 = hn::Zero(d4), c1 = c0, c2 = c0, c3 = c0, s0 = c0, s1 = c0;
      for (std::int64_t j = 0; j < D / 4; j += 4) {
        c0 = hn::Add(c0, hn::Load(d4, code_table + ((j + 0) * 256 + codes[j + 0]) * 4));
        c1 = hn::Add(c1, hn::Load(d4, code_table + ((j + 1) * 256 + codes[j + 1]) * 4));
        c2 = hn::Add(c2, hn::Load(d4, code_table + ((j + 2) * 256 + codes[j + 2]) * 4));
        c3 = hn::Add(c3, hn::Load(d4, code_table + ((j + 3) * 256 + codes[j + 3]) * 4));
      }
      for (std::int64_t j = 0; j < D / 8; j += 2) {
        s0 = hn::Add(s0, hn::Load(d4, sign_table + ((j + 0) * 256 + jl[j + 0]) * 4));
        s1 = hn::Add(s1, hn::Load(d4, sign_table + ((j + 1) * 256 + jl[j + 1]) * 4));
      }
      const V4 polar = hn::Add(hn::Add(c0, c1), hn::Add(c2, c3)), signs = hn::Add(s0, s1);
      const float norm = f16_low(nw), jl_weight = f16_low(nw >> 16) * qjl;
      // score = scale |k| (<q, centroids> + gamma qjl <q_jl, signs>)
      hn::Store(hn::Mul(hn::Set(d4, scale * norm), hn::MulAdd(hn::Set(d4, jl_weight), signs, polar)), d4, scores[t]);
    }
    for (int g = 0; g < GT; ++g) {  // online softmax per head; w becomes p * |v_t|
      float* s = w[g];
      for (std::int64_t t = 0; t < n; ++t) s[t] = scores[t][g];
      const float m_new = std::max(m[g], max_of(s, std::size_t(n)));
      const float corr = std::exp(m[g] - m_new);
      l[g] = l[g] * corr + exp_shift_sum(s, std::size_t(n), m_new);
      if (corr != 1.0f) ::flashtq::cpu::scale(acc + g * D, std::size_t(D), corr);
      m[g] = m_new;
      for (std::int64_t t = 0; t < n; ++t)
        s[t] *= f16_low(values[lay.value_norm_offset() + kvh * lay.capacity + tb + t]);
    }
    // Values, chunk by chunk: the heads' accumulators of a chunk stay in registers over the block.
    for (std::int64_t c = 0; c < D; c += N) {
      V sum[GT];
      for (int g = 0; g < GT; ++g) sum[g] = hn::LoadU(d, acc + g * D + c);
      for (std::int64_t t = 0; t < n; ++t) {
        const V cent = decode(d, values + (kvh * lay.capacity + tb + t) * lay.value_code_words(), c, value_c);
        for (int g = 0; g < GT; ++g) sum[g] = hn::MulAdd(hn::Set(d, w[g][t]), cent, sum[g]);
      }
      for (int g = 0; g < GT; ++g) hn::StoreU(sum[g], d, acc + g * D + c);
    }
  }
}

// One (row, kv head): every head of its group, in quads (the last one 3, 2 or 1 heads).
void AttendRange(const TqAttendCall& a, std::int64_t row, std::int64_t kvh, std::int64_t t0, std::int64_t t1, float* m,
                 float* l, float* acc) {
  const std::int64_t G = a.group(), D = a.layout().head_dim;
  std::int64_t g = 0;
  for (; g + 4 <= G; g += 4) attend_heads<4>(a, row, kvh, g, t0, t1, m + g, l + g, acc + g * D);
  if (G - g == 3) attend_heads<3>(a, row, kvh, g, t0, t1, m + g, l + g, acc + g * D);
  if (G - g == 2) attend_heads<2>(a, row, kvh, g, t0, t1, m + g, l + g, acc + g * D);
  if (G - g == 1) attend_heads<1>(a, row, kvh, g, t0, t1, m + g, l + g, acc + g * D);
}

bool Supported() {
  const hn::ScalableTag<float> d;
  return hn::Lanes(d) >= 4 && hn::Lanes(d) <= 16;
}
#else
void AttendRange(const TqAttendCall&, std::int64_t, std::int64_t, std::int64_t, std::int64_t, float*, float*, float*) {}
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
  if (l.key_bits != 2 || l.value_bits != 2 || !l.qjl || l.exact_rows() > 0 || !HWY_DYNAMIC_DISPATCH(Supported)())
    return false;
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
    const std::int64_t seq = std::max<std::int64_t>(0, std::min({start + j + 1, a.max_seq, l.capacity}));
    const std::int64_t first = std::min(a.first_visible(start + j), seq);
    const std::int64_t per = (seq - first + splits - 1) / splits;
    const std::int64_t t0 = std::min(seq, first + split * per), t1 = std::min(seq, t0 + per);
    float* out = part.data() + u * G * (D + 2);
    HWY_DYNAMIC_DISPATCH(AttendRange)(a, row, kvh, t0, t1, out, out + G, out + 2 * G);
  }
  // Merge the splits by LSE, normalise, rotate back once.
#pragma omp parallel for schedule(static) num_threads(threads)
  for (std::int64_t r = 0; r < base_units; ++r) {
    const std::int64_t row = r / l.n_kv_heads, kvh = r % l.n_kv_heads;
    const std::int64_t b = row / a.n_queries, j = row % a.n_queries;
    std::vector<float> x(static_cast<std::size_t>(D));
    for (std::int64_t g = 0; g < G; ++g) {
      const float L = merge_partials(
                          splits, D,
                          [&](std::int64_t s) {
                            const float* u = part.data() + (r * splits + s) * G * (D + 2);
                            return Partial{u[g], u[G + g], u + 2 * G + g * D};
                          },
                          x.data())
                          .second;
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

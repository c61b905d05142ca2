// TurboQuant-compressed KV cache: packed layout, per-layer tables, the three operations
// (encode, rotate queries, attend over the packed words) and a cache object for users.
// Semantics: docs/spec.md §2; layout: docs/turboquant_layout.md.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "flashtq/config.hpp"
#include "flashtq/error.hpp"
#include "flashtq/tensor.hpp"

namespace flashtq {

class Backend;

// The packed words of one layer: keys [codes | jl bits | norms], values [codes | norms].
// Codes are a little-endian bit stream of `bits` per coordinate, LSB first; a slot
// (kv_head * capacity + t) owns head_dim * bits / 32 whole words, so for 2 bits this is exactly
// the seed's layout (16 codes per word, element j in bits 2j..2j+1).
struct TqLayout {
  std::int64_t head_dim = 128;
  std::int64_t n_kv_heads = 1;
  std::int64_t capacity = 0;  // timesteps per kv head: the per-head stride of every region
  int key_bits = 2;           // b_mse of keys; the QJL bit comes on top unless qjl is false
  int value_bits = 2;
  // Keys carry a 1-bit QJL sketch of their residual (the paper's unbiased estimator); false spends
  // those bits elsewhere ("MSE-only" keys: codes only, up to 4 bits, no jl region, gamma 0).
  bool qjl = true;
  // Norm correction (docs/spec.md §2.6): the norm word holds n / |c[idx]| (the decoded unit vector's
  // length divided out), so a decoded row has length n exactly. Keys without QJL and values.
  bool norm_correction = false;
  // Exact tokens (docs/spec.md §2.6): the first sink_tokens timesteps and the last recent_tokens
  // timesteps of a sequence are also kept as bf16 copies of their rotated rows, which attention reads
  // instead of their codes (one softmax over both). Every timestep is encoded as well, so a timestep
  // that leaves the recent window is already in the packed part.
  std::int32_t sink_tokens = 0;
  std::int32_t recent_tokens = 0;
  // Outlier channels (docs/spec.md §2.6): key_outliers channels of each kv head, fixed by calibration
  // (TqKvCache::calibrate), are a part of the key of their own, coded with key_outlier_bits bits; the
  // other channels form parts of power-of-two sizes, largest first, with key_bits. Each part has its
  // own norm and its own rotation (the Hadamard transform of its size over its slice of the signs).
  // 0 = none; else a power of two in [16, head_dim / 2], keys without QJL, key_outlier_bits in
  // [key_bits, 4]. Which channels are a head's outliers is a mask in the key words (key_mask_offset).
  std::int32_t key_outliers = 0;
  std::int32_t key_outlier_bits = 0;
  // Block means (docs/spec.md §2.6): with key_block = g > 0, timesteps [b g, (b + 1) g) of a kv head
  // share a mean mu_b of their exact (rotated, bf16) rows, stored as head_dim f16 values, and the codes
  // hold each row minus mu_b; attention adds <q, mu_b> to the score (values: p mu_b to the output).
  // A timestep is coded when it leaves the recent window, from its exact row, so a block is complete
  // when its first timestep is coded: g is a power of two in [8, min(recent_tokens, 2 head_dim)],
  // keys without QJL. value_block the same for values. 0 = none.
  std::int32_t key_block = 0;
  std::int32_t value_block = 0;
  // Pages (docs/spec.md §2.7, docs/turboquant_layout.md "Pages"): with page_size = P > 0 this image is a
  // page pool of capacity / P pages shared by many sequences through a page table (TqPageTable): page p
  // owns timesteps [p P, (p + 1) P) of every kv head in every per-timestep region (codes, QJL bits,
  // norms, block means). P is a power of two in [16, 256] dividing capacity, and at least each block
  // of means (a page holds whole blocks). 0 = one sequence's contiguous image.
  std::int32_t page_size = 0;
  // Exact regions (sink and recent rows) the image holds: one per sequence it serves at once. A
  // contiguous image holds 1; a pool as many as its callers' sequences (TqPageTable::exact_sets).
  std::int64_t exact_sets = 1;

  FLASHTQ_HOST_DEVICE std::int64_t slots() const { return n_kv_heads * capacity; }
  // Parts of a key: one without outlier channels; with them, the outliers then the rest of head_dim in
  // powers of two, largest first (head_dim 64, 16 outliers: 16, 32, 16).
  struct KeyPart {
    std::int32_t offset, size, bits, bit_offset;  // coordinates [offset, offset + size) of the permuted key
  };
  FLASHTQ_HOST_DEVICE int key_parts() const {
    int parts = 1;
    for (std::int64_t rest = key_outliers ? head_dim - key_outliers : 0; rest; rest &= rest - 1) ++parts;
    return parts;
  }
  FLASHTQ_HOST_DEVICE KeyPart key_part(int p) const {
    if (!key_outliers) return {0, std::int32_t(head_dim), key_bits, 0};
    if (p == 0) return {0, key_outliers, key_outlier_bits, 0};
    std::int32_t offset = key_outliers, bit_offset = key_outliers * key_outlier_bits;
    std::int32_t rest = std::int32_t(head_dim) - key_outliers;
    for (int i = 1;; ++i) {
      std::int32_t size = 1;
      while (2 * size <= rest) size *= 2;
      if (i == p || size == rest) return {offset, size, key_bits, bit_offset};
      offset += size;
      bit_offset += size * key_bits;
      rest -= size;
    }
  }
  FLASHTQ_HOST_DEVICE std::int64_t key_code_bits() const {
    return head_dim * key_bits + std::int64_t(key_outliers) * (key_outlier_bits - key_bits);
  }
  FLASHTQ_HOST_DEVICE std::int64_t key_code_words() const { return (key_code_bits() + 31) / 32; }  // per slot
  // Norm words per key slot: one (f16 norm, f16 gamma); with outlier channels one f16 norm per part,
  // two to a word (part 2i in the low half of word i).
  FLASHTQ_HOST_DEVICE std::int64_t key_norm_words() const { return key_outliers ? (key_parts() + 1) / 2 : 1; }
  FLASHTQ_HOST_DEVICE std::int64_t jl_words() const { return qjl ? head_dim / 32 : 0; }  // per slot
  FLASHTQ_HOST_DEVICE std::int64_t value_code_words() const { return head_dim * value_bits / 32; }
  FLASHTQ_HOST_DEVICE std::int64_t key_jl_offset() const { return slots() * key_code_words(); }
  FLASHTQ_HOST_DEVICE std::int64_t key_norm_offset() const { return key_jl_offset() + slots() * jl_words(); }
  FLASHTQ_HOST_DEVICE std::int64_t key_exact_offset() const { return key_norm_offset() + slots() * key_norm_words(); }
  // The outlier masks, after the exact region: head_dim / 32 words per kv head, bit c of the head's
  // words set when channel c is an outlier (a mask without exactly key_outliers bits set means
  // channels [0, key_outliers): an uncalibrated cache).
  FLASHTQ_HOST_DEVICE std::int64_t key_mask_offset() const { return key_exact_offset() + exact_region_words(); }
  FLASHTQ_HOST_DEVICE std::int64_t key_mask_words() const { return key_outliers ? n_kv_heads * head_dim / 32 : 0; }
  // The block means, after the masks (values: after their exact region): for kv head h and block b,
  // head_dim f16 (two per word, element 2i in the low half) at mean_offset + (h * blocks + b) * head_dim / 2.
  FLASHTQ_HOST_DEVICE std::int64_t key_mean_offset() const { return key_mask_offset() + key_mask_words(); }
  FLASHTQ_HOST_DEVICE std::int64_t key_words() const { return key_mean_offset() + mean_words(key_block); }
  FLASHTQ_HOST_DEVICE std::int64_t value_norm_offset() const { return slots() * value_code_words(); }
  FLASHTQ_HOST_DEVICE std::int64_t value_exact_offset() const { return value_norm_offset() + slots(); }
  FLASHTQ_HOST_DEVICE std::int64_t value_mean_offset() const { return value_exact_offset() + exact_region_words(); }
  FLASHTQ_HOST_DEVICE std::int64_t value_words() const { return value_mean_offset() + mean_words(value_block); }
  FLASHTQ_HOST_DEVICE std::int32_t mean_block(bool keys) const { return keys ? key_block : value_block; }
  // Blocks of `block` timesteps per kv head (the last one may pass capacity) and their words.
  FLASHTQ_HOST_DEVICE std::int64_t mean_blocks(std::int32_t block) const {
    return block ? (capacity + block - 1) / block : 0;
  }
  FLASHTQ_HOST_DEVICE std::int64_t mean_words(std::int32_t block) const {
    return n_kv_heads * mean_blocks(block) * (head_dim / 2);
  }
  // The first word of the mean of timestep t's block for kv head h (keys or values).
  FLASHTQ_HOST_DEVICE std::int64_t key_mean(std::int64_t h, std::int64_t t) const {
    return key_mean_offset() + (h * mean_blocks(key_block) + t / key_block) * (head_dim / 2);
  }
  FLASHTQ_HOST_DEVICE std::int64_t value_mean(std::int64_t h, std::int64_t t) const {
    return value_mean_offset() + (h * mean_blocks(value_block) + t / value_block) * (head_dim / 2);
  }

  // The exact region of keys or values: exact_sets sets of exact_rows() rows per kv head, each head_dim bf16
  // (two per word, element 2i in the low half); row r of head h of set e at exact_offset + exact_row_at(e, h, r).
  FLASHTQ_HOST_DEVICE std::int64_t exact_rows() const { return std::int64_t(sink_tokens) + recent_tokens; }
  FLASHTQ_HOST_DEVICE std::int64_t exact_row_words() const { return head_dim / 2; }
  FLASHTQ_HOST_DEVICE std::int64_t exact_region_words() const {
    return exact_sets * n_kv_heads * exact_rows() * exact_row_words();
  }
  // Where row r of kv head h of exact set e starts, relative to key_exact_offset() or value_exact_offset().
  FLASHTQ_HOST_DEVICE std::int64_t exact_row_at(std::int64_t e, std::int64_t h, std::int64_t r) const {
    return ((e * n_kv_heads + h) * exact_rows() + r) * exact_row_words();
  }
  FLASHTQ_HOST_DEVICE bool paged() const { return page_size > 0; }
  FLASHTQ_HOST_DEVICE std::int64_t pages() const { return paged() ? capacity / page_size : 0; }
  // The exact row that holds timestep t of a sequence of `end` timesteps, or -1 when attention reads
  // t's codes: sinks at rows [0, sink_tokens), the recent window as a ring after them.
  FLASHTQ_HOST_DEVICE std::int64_t exact_row(std::int64_t t, std::int64_t end) const {
    if (t < sink_tokens) return t;
    if (recent_tokens > 0 && t >= end - recent_tokens) return sink_tokens + (t - sink_tokens) % recent_tokens;
    return -1;
  }

  // Bytes one timestep of one kv head costs in the packed part, keys and values together.
  // A block mean's share counts (2 head_dim bytes per block; a block is at most 2 head_dim timesteps, so
  // the share is a whole number of bytes).
  FLASHTQ_HOST_DEVICE std::int64_t bytes_per_token_per_head() const {
    return 4 * (key_code_words() + jl_words() + key_norm_words() + value_code_words() + 1) +
           (key_block ? 2 * head_dim / key_block : 0) + (value_block ? 2 * head_dim / value_block : 0);
  }
  // Bytes of the exact region of one kv head, keys and values together (a fixed cost per sequence).
  FLASHTQ_HOST_DEVICE std::int64_t exact_bytes_per_head() const { return 2 * 4 * exact_rows() * exact_row_words(); }
  // Compression against a bf16 cache for a sequence of `length` timesteps, the exact region included.
  double compression_vs_bf16(std::int64_t length) const {
    return double(2 * 2 * head_dim) * double(length) /
           (double(bytes_per_token_per_head()) * double(length) + double(exact_bytes_per_head()));
  }
  // The same per timestep of the packed part alone (the limit for long sequences).
  double compression_vs_bf16() const { return double(2 * 2 * head_dim) / double(bytes_per_token_per_head()); }
};

// The page table of a pooled cache (TqLayout::page_size > 0): sequence b's timestep t is timestep
// (pages[b * max_pages + t / P]) * P + t % P of the pool, and its exact rows are exact set exact_sets[b] (null:
// set b). The arrays live where the backend reads tables (Backend::page_table_memory(): host for reference, cpu and
// webgpu, which uploads them with the call; device memory for cuda), which `tables` says. Where they are on the
// host, core checks every entry a call reads; cuda's kernels clamp a page index into [0, pages) and a set into
// [0, exact_sets), never reading out of bounds.
struct TqPageTable {
  const std::int32_t* pages = nullptr;
  std::int64_t max_pages = 0;
  const std::int32_t* exact_sets = nullptr;
  Memory tables = Memory::host;
};

// Where one sequence's timesteps and exact rows are in an image (TqLayout), contiguous or pooled.
struct TqSequence {
  const std::int32_t* pages = nullptr;  // the sequence's row of the page table; null: contiguous
  std::int64_t page_count = 0;          // the pool's pages (clamp)
  std::int32_t page_shift = 0;
  std::int64_t exact_set = 0;

  // The image's timestep that holds the sequence's timestep t (t < its reach).
  FLASHTQ_HOST_DEVICE std::int64_t timestep(std::int64_t t) const {
    if (pages == nullptr) return t;
    std::int64_t p = pages[t >> page_shift];
    p = p < 0 ? 0 : (p >= page_count ? page_count - 1 : p);
    return (p << page_shift) | (t & ((std::int64_t(1) << page_shift) - 1));
  }
};

// Sequence b of a call: its timesteps through the table of a pool, else those of its own image (which
// starts at b * key_words() / b * value_words(): TqSequence does not hold that offset, tq_sequence_base does).
FLASHTQ_HOST_DEVICE inline TqSequence tq_sequence(const TqLayout& l, const TqPageTable& table, std::int64_t b) {
  TqSequence s;
  if (!l.paged()) return s;
  s.pages = table.pages + b * table.max_pages;
  s.page_count = l.pages();
  for (std::int32_t p = l.page_size; p > 1; p >>= 1) ++s.page_shift;
  std::int64_t e = table.exact_sets != nullptr ? std::int64_t(table.exact_sets[b]) : b;
  s.exact_set = e < 0 ? 0 : (e >= l.exact_sets ? l.exact_sets - 1 : e);
  return s;
}
// The first word of sequence b's image: a pool is shared (0), contiguous images follow each other.
FLASHTQ_HOST_DEVICE inline std::int64_t tq_sequence_base(const TqLayout& l, std::int64_t b, bool keys) {
  return l.paged() ? 0 : b * (keys ? l.key_words() : l.value_words());
}
// Timesteps a sequence can hold: max_pages pages of a pool, or the capacity of its own image.
FLASHTQ_HOST_DEVICE inline std::int64_t tq_reach(const TqLayout& l, const TqPageTable& table) {
  return l.paged() ? table.max_pages * l.page_size : l.capacity;
}

// An exact Lloyd–Max codebook (double, as computed): what encoders quantize with, so that every
// backend writes the oracle's codes.
struct TqCodebook {
  std::array<double, 16> centroids{};   // ascending, `levels` used
  std::array<double, 15> boundaries{};  // midpoints, levels - 1 used
  int levels = 0;
};

// One layer's layout and constants, small enough to pass by value to a GPU kernel: the single
// description every TurboQuant operation of that layer receives.
struct TqTables {
  TqLayout layout;
  std::array<std::uint32_t, 8> polar_sign_bits{};  // bit d set: s_polar[d] = -1
  std::array<std::uint32_t, 8> jl_sign_bits{};
  TqCodebook key_codebook, value_codebook;                   // encoders
  std::array<float, 16> key_centroids{}, value_centroids{};  // attention (f32), 2^bits used
  TqCodebook outlier_codebook;                               // key_outlier_bits (head_dim's density)
  std::array<float, 16> outlier_centroids{};
};

// Builds the tables of (seed, layer) for a layout.
TqTables make_tq_tables(const TqLayout& layout, std::uint64_t seed, std::int64_t layer);

// Encodes rows x [1, T, n_kv_heads, head_dim] (any dtype, any strides) into timesteps
// start_pos .. start_pos + T - 1 of a key or value cache laid out as tables.layout.
struct TqEncodeArgs {
  TqTables tables;
  TensorView x;
  std::int64_t start_pos = 0;
  std::uint32_t* cache = nullptr;
  void* stream = nullptr;
  // A pool (layout.page_size > 0): the sequence's pages (row 0 of the table) and exact set; start_pos
  // and T count the sequence's timesteps, up to max_pages * page_size.
  TqPageTable pages{};
};

// The rotated-query scratch [q_rot | q_jl | sums] of `rows` query rows of n_heads heads: q_rot and
// q_jl of (row, head) are head_dim floats each, its sum one float. The one place its offsets live.
struct TqScratchLayout {
  std::int64_t rows = 0, n_heads = 0, head_dim = 0;

  FLASHTQ_HOST_DEVICE std::int64_t region() const { return rows * n_heads * head_dim; }
  FLASHTQ_HOST_DEVICE std::int64_t q_rot(std::int64_t row, std::int64_t head) const {
    return (row * n_heads + head) * head_dim;
  }
  FLASHTQ_HOST_DEVICE std::int64_t q_jl(std::int64_t row, std::int64_t head) const {
    return region() + q_rot(row, head);
  }
  FLASHTQ_HOST_DEVICE std::int64_t sum(std::int64_t row, std::int64_t head) const {
    return 2 * region() + row * n_heads + head;
  }
  FLASHTQ_HOST_DEVICE std::int64_t floats() const { return rows * n_heads * (2 * head_dim + 1); }
};

// Floats of a scratch of q_cap rows (TqScratchLayout::floats). Callers size a buffer with it before
// any validation, so a negative argument or a count past 64 bits is an Error here, not an overflow.
inline std::int64_t tq_scratch_floats(std::int64_t q_cap, std::int64_t n_heads, std::int64_t head_dim) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  if (q_cap < 0 || n_heads < 0 || head_dim < 0) throw Error("q_cap", "scratch sizes must be >= 0");
  const bool fits = head_dim <= (kMax - 1) / 2 && (n_heads == 0 || q_cap <= kMax / n_heads) &&
                    (q_cap * n_heads == 0 || 2 * head_dim + 1 <= kMax / (q_cap * n_heads));
  if (!fits) throw Error("q_cap", "the scratch's float count overflows 64 bits");
  return TqScratchLayout{q_cap, n_heads, head_dim}.floats();
}

// Rotates queries q [batch, n_queries, n_heads, head_dim] into the scratch; query (b, j) becomes
// scratch row b * n_queries + j.
// With outlier channels (layout.key_outliers > 0) the rotation permutes each head's channels by its
// kv head's outlier mask, read from k_cache (sequence b's key words at k_cache + b * layout.key_words(),
// as TqAttendArgs has them; a pool's masks are the pool's, at k_cache); k_cache is not read otherwise.
struct TqRotateArgs {
  TqTables tables;
  TensorView q;
  std::int64_t q_cap = 0;  // rows the scratch holds; 0 means batch * n_queries
  float* scratch = nullptr;
  void* stream = nullptr;
  const std::uint32_t* k_cache = nullptr;
};

// Attention of n_queries rotated query rows against the packed caches. Row j sits at absolute
// position p = start_pos + j and sees timesteps [0, min(p + 1, max_seq)), or with a sliding window
// only those of them after p - window (the last `window` positions up to p, as Gemma's local layers).
//
// Batching: `batch` sequences in one call, each with its own caches (sequence b's words start at
// k_cache + b * layout.key_words() and v_cache + b * layout.value_words()), its query rows at
// scratch rows b * n_queries + j, and its output at out[b]. With start_positions (one int32 per
// sequence, in the backend's memory) every sequence has its own start position; values outside
// [0, capacity) are clamped by the kernels, never read out of bounds.
struct TqAttendArgs {
  TqTables tables;
  const float* scratch = nullptr;
  std::int64_t q_cap = 0;  // 0 means batch * n_queries
  std::int64_t n_heads = 0;
  std::int64_t n_queries = 1;
  std::int64_t start_pos = 0;
  std::optional<std::int64_t>
      max_seq;  // causal clamp; empty means start_pos + n_queries (capacity with start_positions)
  std::int64_t batch = 1;
  const std::int32_t* start_positions = nullptr;
  std::int64_t window = 0;         // 0 = none
  std::optional<float> scale;      // default 1/sqrt(head_dim)
  std::optional<float> qjl_scale;  // default sqrt(pi/2)/sqrt(head_dim)
  const std::uint32_t* k_cache = nullptr;
  const std::uint32_t* v_cache = nullptr;
  TensorView out;             // f32 [batch, n_queries, n_heads, head_dim]
  void* workspace = nullptr;  // in the backend's memory, tq_attend_workspace_bytes() large, 16-byte aligned
  std::size_t workspace_bytes = 0;
  void* stream = nullptr;
  // Attention in f32 against the oracle's 1e-5 (docs/spec.md §3) instead of the default bf16-class fast
  // path (1e-2); host backends are always exact. On cuda it keeps chunked prefill off the tensor-core path.
  bool exact = false;
  // As AttentionParams (docs/spec.md §1.8, §1.9): every score softcap * tanh(scale * <q, k> / softcap)
  // (0 = none), and optional f32 [n_heads] sink logits in the backend's memory (-inf = none for a head).
  float softcap = 0.0f;
  const float* sinks = nullptr;
  // A pool (layout.page_size > 0): sequence b's timesteps through row b of the table; positions count the
  // sequence's timesteps, up to max_pages * page_size (capacity is the pool's). Both caches are the pool's.
  TqPageTable pages{};
};

void tq_encode_keys(Backend& backend, const TqEncodeArgs& args);
void tq_encode_values(Backend& backend, const TqEncodeArgs& args);
void tq_rotate_queries(Backend& backend, const TqRotateArgs& args);
void tq_attend(Backend& backend, const TqAttendArgs& args);
// Scratch tq_attend needs on this backend for these arguments (0 on host backends).
std::size_t tq_attend_workspace_bytes(Backend& backend, const TqAttendArgs& args);

// Named configurations, chosen by measured perplexity on real models (docs/quality.md); the first is
// the library's default. "seed" is the seed kernel's configuration (keys 2+1 bits, values 2 bits).
// A preset's key width may depend on head_dim: a vector's norm words and exact rows cost the same
// whatever D, so at D <= 64 they weigh twice what they weigh at D = 128 and a preset that targets a
// compression keeps fewer key bits there.
struct TqPreset {
  // The configuration for one class of head_dim.
  struct Widths {
    int key_bits;
    int key_outlier_share;  // outlier channels: head_dim / share of them (at least 16); 0 = none
    int key_outlier_bits;
    int value_bits;
    std::int32_t sink_tokens, recent_tokens;
    std::int32_t key_block, value_block;  // block means over this many timesteps; 0 = none
  };
  const char* name;
  Widths up_to_64;  // head_dim <= 64
  Widths above_64;  // head_dim >= 128
  bool qjl;
  bool norm_correction;
  const char* summary;
};
const std::vector<TqPreset>& tq_presets();
// The layout of preset `name` for a model's head_dim and kv heads and a capacity in timesteps; an
// Error names the presets for an unknown name.
TqLayout tq_preset_layout(const std::string& name, std::int64_t head_dim, std::int64_t n_kv_heads,
                          std::int64_t capacity);

// What TqKvCache::attend passes on to tq_attend besides the cache and the queries (TqAttendArgs's fields).
struct TqAttendOptions {
  std::int64_t window = 0;       // > 0: row p sees only timesteps (p - window, p]
  bool exact = false;            // f32 arithmetic instead of the backend's bf16-class fast paths
  float softcap = 0.0f;          // docs/spec.md §1.8 (0 = none)
  const float* sinks = nullptr;  // docs/spec.md §1.9: f32 [n_heads] in the backend's memory, or none
};

struct TqCacheConfig {
  std::int64_t layers = 1;
  TqLayout layout;  // of every layer
  std::uint64_t seed = 0;
};

// A TurboQuant KV cache for every layer of a model, its packed words in the memory of the backend it
// runs on (host memory for reference and cpu, device memory for cuda and webgpu). Every operation
// goes to the cache's stream (set_stream; cudaStream_t on cuda) and does not wait for the device,
// except the ones that read words back to the host (key_words, value_words, save).
class TqKvCache {
 public:
  explicit TqKvCache(const TqCacheConfig& config, Backend* backend = nullptr);
  ~TqKvCache();
  TqKvCache(TqKvCache&&) noexcept;
  TqKvCache& operator=(TqKvCache&&) noexcept;

  // Encodes k, v [1, T, n_kv_heads, head_dim] (in the backend's memory, any dtype and strides) at
  // timesteps start_pos... = the layer's next ones (start_pos must equal length(layer)); a call that
  // would pass capacity is rejected and leaves the cache unchanged.
  void append(std::int64_t layer, const TensorView& k, const TensorView& v, std::int64_t start_pos);
  // Block means (layout.key_block or value_block > 0): a timestep's codes are written when it leaves the
  // recent window, from its exact row, so the calls' rows must be contiguous (append() makes them so).
  // Outlier channels (layout.key_outliers > 0): makes the key_outliers channels of largest mean square
  // over keys [1, T, n_kv_heads, head_dim] (in the backend's memory, any dtype; a prompt's keys or a
  // calibration text's) each kv head's outliers in `layer`. Only while the layer is empty, since its
  // codes depend on the choice; a layer never calibrated uses channels [0, key_outliers). The choice is
  // part of the layer's key words (docs/turboquant_layout.md), so save() keeps it.
  void calibrate(std::int64_t layer, const TensorView& keys);
  // Re-encodes timesteps [start_pos, start_pos + T) already appended (a rollback, say); not for a
  // cache with recent tokens.
  void overwrite(std::int64_t layer, const TensorView& k, const TensorView& v, std::int64_t start_pos);
  // Attention of q [1, n, n_heads, head_dim] at positions start_pos... into out (f32, same shape), both
  // in the backend's memory; with a window (> 0), row p sees only timesteps (p - window, p]. The rotated queries and
  // the kernels' workspace live in buffers the cache owns, grown to the largest call so far and reused.
  // `exact` as TqAttendArgs::exact: f32 arithmetic instead of the backend's bf16-class fast paths.
  void attend(std::int64_t layer, const TensorView& q, std::int64_t start_pos, const TensorView& out,
              std::int64_t window = 0, bool exact = false);
  // The same with every option of TqAttendOptions (softcap and sinks too).
  void attend(std::int64_t layer, const TensorView& q, std::int64_t start_pos, const TensorView& out,
              const TqAttendOptions& options);
  void set_stream(void* stream) { stream_ = stream; }

  const TqCacheConfig& config() const { return config_; }
  const TqLayout& layout() const { return config_.layout; }
  Backend& backend() const { return *backend_; }
  std::int64_t length(std::int64_t layer) const;  // timesteps written so far (highest end)
  std::int64_t bytes_per_token() const;           // all layers and kv heads, packed part
  std::int64_t exact_bytes() const;               // the exact tokens' fixed cost, all layers and kv heads
  double compression_vs_bf16() const { return config_.layout.compression_vs_bf16(); }
  // For a sequence of `length` timesteps, the exact tokens counted.
  double compression_vs_bf16(std::int64_t length) const { return config_.layout.compression_vs_bf16(length); }
  std::int64_t memory_bytes() const;  // packed words held, all layers
  // A host copy of a layer's words (waits for the device).
  std::vector<std::uint32_t> key_words(std::int64_t layer) const;
  std::vector<std::uint32_t> value_words(std::int64_t layer) const;

  void save(const std::string& path) const;
  static TqKvCache load(const std::string& path, Backend* backend = nullptr);

 private:
  struct Storage;  // the layers' word buffers and the scratch, in the backend's memory
  void check_layer(std::int64_t layer) const;
  void encode(std::int64_t layer, const TensorView& k, const TensorView& v, std::int64_t start_pos);  // locked
  TqCacheConfig config_;
  Backend* backend_;
  void* stream_ = nullptr;
  std::vector<TqTables> tables_;
  std::vector<std::int64_t> length_;
  std::unique_ptr<Storage> storage_;
};

}  // namespace flashtq

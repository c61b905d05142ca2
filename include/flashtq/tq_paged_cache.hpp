// A paged TurboQuant cache (docs/spec.md §2.7): every layer's packed words in one pool of pages, shared by the
// sequences a serving engine batches, each sequence reading its timesteps through its own list of pages.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "flashtq/turboquant.hpp"

namespace flashtq {

struct TqPagedCacheConfig {
  std::int64_t layers = 1;
  // A pool (docs/turboquant_layout.md, "Pages"): page_size > 0, capacity = pages * page_size timesteps per kv
  // head, exact_sets = the most sequences alive at once (each holds one set of exact rows).
  TqLayout layout;
  std::uint64_t seed = 0;
};

// Pages are handed out and taken back by the caller (a serving engine's block manager decides which
// sequence gets which page); a sequence maps pages in order, its timestep t in its page t / page_size. A page
// may be mapped by several sequences (fork shares a sequence's pages), and is written only while one sequence
// maps it: copy-on-write is the caller's, through copy_page. Freeing a page a sequence still maps is an error.
// Every operation goes to the cache's stream and does not wait for the device, except those that move words
// through the host (fork, copy_page, pool_words) and attend's and append's table uploads.
class TqPagedCache {
 public:
  explicit TqPagedCache(const TqPagedCacheConfig& config, Backend* backend = nullptr);
  ~TqPagedCache();
  TqPagedCache(TqPagedCache&&) noexcept;
  TqPagedCache& operator=(TqPagedCache&&) noexcept;

  // A free page, the caller's until free_page; an Error naming "pages" when none is left.
  std::int32_t allocate_page();
  // Back to the free pages: an Error while a sequence maps it or when it is not allocated.
  void free_page(std::int32_t page);
  std::int64_t free_pages() const;

  // A new sequence (its id is its exact set), with no pages and no timesteps in any layer.
  std::int64_t add_sequence();
  // Appends allocated pages to the sequence's list.
  void map_pages(std::int64_t sequence, const std::vector<std::int32_t>& pages);
  // A new sequence with the same timesteps as `sequence`: its pages shared (mapped by both), its exact rows and
  // lengths copied.
  std::int64_t fork(std::int64_t sequence);
  // Page `index` of the sequence's list replaced by `fresh` (allocated, mapped by no one) holding a copy of
  // its words in every layer: copy-on-write before appending into a shared page.
  void copy_page(std::int64_t sequence, std::int64_t index, std::int32_t fresh);
  // Unmaps its pages (they stay allocated) and frees its exact set.
  void remove_sequence(std::int64_t sequence);
  const std::vector<std::int32_t>& pages_of(std::int64_t sequence) const;
  std::int64_t length(std::int64_t layer, std::int64_t sequence) const;

  // Encodes k, v [1, T, n_kv_heads, head_dim] (in the backend's memory, any dtype and strides) as the
  // sequence's next T timesteps of `layer`: its pages must cover them, and the pages written (those of the new
  // timesteps, and with block means those of the timesteps that leave the recent window) must be mapped by it
  // alone. A refused call writes nothing.
  void append(std::int64_t layer, std::int64_t sequence, const TensorView& k, const TensorView& v);
  // Outlier channels (layout.key_outliers > 0), as TqKvCache::calibrate: while no sequence has timesteps in
  // the layer.
  void calibrate(std::int64_t layer, const TensorView& keys);
  // Attention of q [B, n, n_heads, head_dim] for sequences[b], its n rows ending at that sequence's length in
  // `layer`, into out (f32, the same shape); both in the backend's memory.
  void attend(std::int64_t layer, const std::vector<std::int64_t>& sequences, const TensorView& q,
              const TensorView& out, const TqAttendOptions& options = {});
  void set_stream(void* stream) { stream_ = stream; }

  const TqPagedCacheConfig& config() const { return config_; }
  const TqLayout& layout() const { return config_.layout; }
  Backend& backend() const { return *backend_; }
  std::int64_t memory_bytes() const;  // the pools' words, all layers
  // A host copy of a layer's pool (waits for the device).
  std::vector<std::uint32_t> key_words(std::int64_t layer) const;
  std::vector<std::uint32_t> value_words(std::int64_t layer) const;

 private:
  struct State;
  TqPagedCacheConfig config_;
  Backend* backend_;
  void* stream_ = nullptr;
  std::unique_ptr<State> state_;
};

}  // namespace flashtq

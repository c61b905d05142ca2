// TqPagedCache: a pool of pages per layer in the memory of its backend, the pages' owners and mappings on the host.
#include "flashtq/tq_paged_cache.hpp"

#include <algorithm>
#include <mutex>
#include <string>

#include "core/backend_buffer.hpp"
#include "core/checked.hpp"
#include "core/entry_guard.hpp"
#include "core/growing_buffer.hpp"
#include "core/tq_calibration.hpp"
#include "core/validate.hpp"
#include "flashtq/backend.hpp"
#include "flashtq/error.hpp"

namespace flashtq {
namespace {

constexpr int kFree = -1;  // TqPagedCache::State::refs of a page no one holds

struct Span {
  std::int64_t offset, words;
};

// Where page `page`'s words are in a pool's keys or values: per kv head, its slots of every per-timestep
// region and its blocks of means (docs/turboquant_layout.md, "Pages").
std::vector<Span> page_spans(const TqLayout& l, bool keys, std::int64_t page) {
  const std::int64_t P = l.page_size;
  std::vector<Span> spans;
  for (std::int64_t h = 0; h < l.n_kv_heads; ++h) {
    const std::int64_t slot = h * l.capacity + page * P;
    if (keys) {
      spans.push_back({slot * l.key_code_words(), P * l.key_code_words()});
      if (l.jl_words()) spans.push_back({l.key_jl_offset() + slot * l.jl_words(), P * l.jl_words()});
      spans.push_back({l.key_norm_offset() + slot * l.key_norm_words(), P * l.key_norm_words()});
      if (l.key_block) spans.push_back({l.key_mean(h, page * P), P / l.key_block * (l.head_dim / 2)});
    } else {
      spans.push_back({slot * l.value_code_words(), P * l.value_code_words()});
      spans.push_back({l.value_norm_offset() + slot, P});
      if (l.value_block) spans.push_back({l.value_mean(h, page * P), P / l.value_block * (l.head_dim / 2)});
    }
  }
  return spans;
}

void check_layer(std::int64_t layer, std::int64_t layers) {
  if (layer < 0 || layer >= layers) throw Error("layer", "must be in [0, " + std::to_string(layers) + ")");
}

Span exact_span(const TqLayout& l, bool keys, std::int64_t set) {
  return {(keys ? l.key_exact_offset() : l.value_exact_offset()) + l.exact_row_at(set, 0, 0),
          l.n_kv_heads * l.exact_rows() * l.exact_row_words()};
}

}  // namespace

struct TqPagedCache::State {
  struct Sequence {
    bool alive = false;
    std::vector<std::int32_t> pages;
    std::vector<std::int64_t> length;  // per layer
  };
  std::vector<TqTables> tables;
  std::vector<core::BackendBuffer> keys, values;  // one pool per layer
  std::vector<int> refs;                          // per page: kFree, or how many sequences map it
  std::vector<std::int32_t> free;                 // free pages, the next one handed out last
  std::vector<Sequence> sequences;                // per exact set
  core::GrowingBuffer scratch, workspace, tables_on_device, starts_on_device;
  std::mutex mutex;  // one call at a time

  Sequence& live(std::int64_t s) {
    if (s < 0 || s >= std::int64_t(sequences.size()) || !sequences[std::size_t(s)].alive) {
      throw Error("sequence", std::to_string(s) + " is not a live sequence of this cache (add_sequence, fork)");
    }
    return sequences[std::size_t(s)];
  }
  void check_allocated(std::int32_t page) const {
    if (page < 0 || page >= std::int32_t(refs.size()) || refs[std::size_t(page)] == kFree) {
      throw Error("pages", "page " + std::to_string(page) + " is not allocated (allocate_page)");
    }
  }
  std::int64_t take_exact_set() const {
    for (std::size_t s = 0; s < sequences.size(); ++s)
      if (!sequences[s].alive) return std::int64_t(s);
    throw Error("sequence", "every one of the layout's exact_sets (" + std::to_string(sequences.size()) +
                                ") holds a live sequence: remove one first");
  }
};

TqPagedCache::TqPagedCache(const TqPagedCacheConfig& config, Backend* backend) try
    : config_(config), backend_(backend ? backend : &default_backend()), state_(std::make_unique<State>()) {
  if (config.layers < 1) throw Error("layers", "must be >= 1");
  const TqLayout& l = config.layout;
  core::validate_tq_layout(l);
  if (!l.paged()) throw Error("layout", "a paged cache needs a pool (page_size > 0); TqKvCache holds one sequence");
  if (!backend_->available()) {
    throw Error("backend", "'" + backend_->name() + "' is not available here: " + backend_->unavailable_reason());
  }
  if (auto why = backend_->unsupported(l)) throw Error("backend", backend_->name() + ": " + *why);
  const std::int64_t total =
      core::checked_mul(core::checked_mul(4, l.key_words() + l.value_words(), "capacity"), config.layers, "layers");
  State& s = *state_;
  try {
    s.refs.assign(std::size_t(l.pages()), kFree);
    for (std::int64_t p = l.pages() - 1; p >= 0; --p) s.free.push_back(std::int32_t(p));  // page 0 first
    s.sequences.resize(std::size_t(l.exact_sets));
    s.tables.reserve(std::size_t(config.layers));
    const std::vector<std::uint32_t> zero_keys(std::size_t(l.key_words()), 0u),
        zero_values(std::size_t(l.value_words()), 0u);
    for (std::int64_t layer = 0; layer < config.layers; ++layer) {
      s.tables.push_back(make_tq_tables(l, config.seed, layer));
      s.keys.emplace_back(*backend_, zero_keys);
      s.values.emplace_back(*backend_, zero_values);
    }
  } catch (const std::exception&) {  // std::bad_alloc or std::length_error
    throw Error("capacity",
                "the cache's " + std::to_string(total) + " bytes cannot be allocated on '" + backend_->name() + "'");
  }
} catch (...) {
  core::rethrow_as_error("backend");
}

TqPagedCache::~TqPagedCache() = default;
TqPagedCache::TqPagedCache(TqPagedCache&&) noexcept = default;
TqPagedCache& TqPagedCache::operator=(TqPagedCache&&) noexcept = default;

std::int32_t TqPagedCache::allocate_page() try {
  std::lock_guard<std::mutex> lock(state_->mutex);
  State& s = *state_;
  if (s.free.empty()) throw Error("pages", "all " + std::to_string(s.refs.size()) + " pages are allocated");
  const std::int32_t page = s.free.back();
  s.free.pop_back();
  s.refs[std::size_t(page)] = 0;
  return page;
} catch (...) {
  core::rethrow_as_error("pages");
}

void TqPagedCache::free_page(std::int32_t page) try {
  std::lock_guard<std::mutex> lock(state_->mutex);
  State& s = *state_;
  s.check_allocated(page);
  if (const int n = s.refs[std::size_t(page)]; n > 0) {
    throw Error("pages", "page " + std::to_string(page) + " is mapped by " + std::to_string(n) +
                             " sequence(s): remove them (remove_sequence) before freeing it");
  }
  s.refs[std::size_t(page)] = kFree;
  s.free.push_back(page);
} catch (...) {
  core::rethrow_as_error("pages");
}

std::int64_t TqPagedCache::free_pages() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return std::int64_t(state_->free.size());
}

std::int64_t TqPagedCache::add_sequence() try {
  std::lock_guard<std::mutex> lock(state_->mutex);
  State& s = *state_;
  const std::int64_t id = s.take_exact_set();
  s.sequences[std::size_t(id)] = {true, {}, std::vector<std::int64_t>(std::size_t(config_.layers), 0)};
  return id;
} catch (...) {
  core::rethrow_as_error("sequence");
}

void TqPagedCache::map_pages(std::int64_t sequence, const std::vector<std::int32_t>& pages) try {
  std::lock_guard<std::mutex> lock(state_->mutex);
  State& s = *state_;
  State::Sequence& seq = s.live(sequence);
  for (const std::int32_t p : pages) s.check_allocated(p);  // all before any is mapped
  for (std::size_t i = 0; i < pages.size(); ++i)
    if (std::count(pages.begin(), pages.begin() + std::ptrdiff_t(i), pages[i]) ||
        std::count(seq.pages.begin(), seq.pages.end(), pages[i])) {
      throw Error("pages", "page " + std::to_string(pages[i]) + " would be mapped twice by sequence " +
                               std::to_string(sequence));
    }
  for (const std::int32_t p : pages) ++s.refs[std::size_t(p)];
  seq.pages.insert(seq.pages.end(), pages.begin(), pages.end());
} catch (...) {
  core::rethrow_as_error("pages");
}

std::int64_t TqPagedCache::fork(std::int64_t sequence) try {
  std::lock_guard<std::mutex> lock(state_->mutex);
  State& s = *state_;
  const State::Sequence& from = s.live(sequence);
  const std::int64_t id = s.take_exact_set();
  const TqLayout& l = config_.layout;
  if (l.exact_rows() > 0) {  // the exact rows of every layer, through the host
    backend_->synchronize();
    for (std::int64_t layer = 0; layer < config_.layers; ++layer)
      for (const bool keys : {true, false}) {
        auto* words = static_cast<std::uint32_t*>((keys ? s.keys : s.values)[std::size_t(layer)].get());
        const Span a = exact_span(l, keys, sequence), b = exact_span(l, keys, id);
        std::vector<std::uint32_t> host(std::size_t(a.words));
        backend_->download(host.data(), words + a.offset, host.size() * 4);
        backend_->upload(words + b.offset, host.data(), host.size() * 4);
      }
  }
  for (const std::int32_t p : from.pages) ++s.refs[std::size_t(p)];
  s.sequences[std::size_t(id)] = from;
  return id;
} catch (...) {
  core::rethrow_as_error("sequence");
}

void TqPagedCache::copy_page(std::int64_t sequence, std::int64_t index, std::int32_t fresh) try {
  std::lock_guard<std::mutex> lock(state_->mutex);
  State& s = *state_;
  State::Sequence& seq = s.live(sequence);
  if (index < 0 || index >= std::int64_t(seq.pages.size())) {
    throw Error("index", "must be in [0, the sequence's " + std::to_string(seq.pages.size()) + " pages)");
  }
  s.check_allocated(fresh);
  if (s.refs[std::size_t(fresh)] != 0) {
    throw Error("fresh", "page " + std::to_string(fresh) + " is mapped by a sequence; a copy needs an unmapped page");
  }
  const std::int32_t old = seq.pages[std::size_t(index)];
  backend_->synchronize();
  for (std::int64_t layer = 0; layer < config_.layers; ++layer)
    for (const bool keys : {true, false}) {
      auto* words = static_cast<std::uint32_t*>((keys ? s.keys : s.values)[std::size_t(layer)].get());
      const std::vector<Span> from = page_spans(config_.layout, keys, old),
                              to = page_spans(config_.layout, keys, fresh);
      for (std::size_t i = 0; i < from.size(); ++i) {
        std::vector<std::uint32_t> host(std::size_t(from[i].words));
        backend_->download(host.data(), words + from[i].offset, host.size() * 4);
        backend_->upload(words + to[i].offset, host.data(), host.size() * 4);
      }
    }
  --s.refs[std::size_t(old)];
  ++s.refs[std::size_t(fresh)];
  seq.pages[std::size_t(index)] = fresh;
} catch (...) {
  core::rethrow_as_error("pages");
}

void TqPagedCache::remove_sequence(std::int64_t sequence) try {
  std::lock_guard<std::mutex> lock(state_->mutex);
  State& s = *state_;
  State::Sequence& seq = s.live(sequence);
  for (const std::int32_t p : seq.pages) --s.refs[std::size_t(p)];
  seq = {};
} catch (...) {
  core::rethrow_as_error("sequence");
}

const std::vector<std::int32_t>& TqPagedCache::pages_of(std::int64_t sequence) const try {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->live(sequence).pages;
} catch (...) {
  core::rethrow_as_error("sequence");
}

std::int64_t TqPagedCache::length(std::int64_t layer, std::int64_t sequence) const try {
  check_layer(layer, config_.layers);
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->live(sequence).length[std::size_t(layer)];
} catch (...) {
  core::rethrow_as_error("sequence");
}

namespace {

// int32 words a call reads in `where`: the host vector itself, or a copy in `device` (after the device has
// finished with its last contents).
const std::int32_t* words_in(Memory where, Backend& backend, const std::vector<std::int32_t>& host,
                             core::GrowingBuffer& device) {
  if (where == Memory::host) return host.data();
  backend.synchronize();
  void* at = device.at_least(backend, host.size() * sizeof(std::int32_t));
  backend.upload(at, host.data(), host.size() * sizeof(std::int32_t));
  return static_cast<const std::int32_t*>(at);
}

}  // namespace

void TqPagedCache::append(std::int64_t layer, std::int64_t sequence, const TensorView& k, const TensorView& v) try {
  check_layer(layer, config_.layers);
  std::lock_guard<std::mutex> lock(state_->mutex);
  State& s = *state_;
  State::Sequence& seq = s.live(sequence);
  const TqLayout& l = config_.layout;
  if (k.shape != v.shape) throw Error("v", "must have the same shape as k");
  const std::int64_t start = seq.length[std::size_t(layer)], T = k.shape[1];
  if (T < 1) throw Error("k", "must hold at least one row (dimension 1)");
  const std::int64_t need = (start + T + l.page_size - 1) / l.page_size;
  if (need > std::int64_t(seq.pages.size())) {
    throw Error("pages", "sequence " + std::to_string(sequence) + " maps " + std::to_string(seq.pages.size()) +
                             " pages; its timesteps " + std::to_string(start) + ".." + std::to_string(start + T - 1) +
                             " need " + std::to_string(need) + " (map_pages)");
  }
  // The pages written: the new timesteps', and with block means those of the timesteps leaving the recent window.
  const bool means = l.key_block > 0 || l.value_block > 0;
  const std::int64_t first_written = means ? std::max<std::int64_t>(0, start - l.recent_tokens) : start;
  for (std::int64_t p = first_written / l.page_size; p < need; ++p) {
    const std::int32_t page = seq.pages[std::size_t(p)];
    if (s.refs[std::size_t(page)] > 1) {
      throw Error("pages", "page " + std::to_string(page) + " (index " + std::to_string(p) + " of sequence " +
                               std::to_string(sequence) +
                               ") is shared with another sequence: copy it (copy_page) "
                               "before appending into it");
    }
  }
  std::vector<std::int32_t> host(seq.pages);
  host.push_back(std::int32_t(sequence));  // the exact set after the pages
  const std::int32_t* table = words_in(backend_->page_table_memory(), *backend_, host, s.tables_on_device);
  const TqTables& tables = s.tables[std::size_t(layer)];
  const TqPageTable pages{table, std::int64_t(seq.pages.size()), table + seq.pages.size(),
                          backend_->page_table_memory()};
  auto* keys = static_cast<std::uint32_t*>(s.keys[std::size_t(layer)].get());
  auto* values = static_cast<std::uint32_t*>(s.values[std::size_t(layer)].get());
  TqEncodeArgs ka{tables, k, start, keys, stream_, pages}, va{tables, v, start, values, stream_, pages};
  const TqEncodeCall kc = core::validate_tq_encode_views(*backend_, ka, true, "k");
  const TqEncodeCall vc = core::validate_tq_encode_views(*backend_, va, false, "v");
  core::check_tq_rows_storable(*backend_, kc, "k");
  core::check_tq_rows_storable(*backend_, vc, "v");
  backend_->tq_encode(kc);
  backend_->tq_encode(vc);
  seq.length[std::size_t(layer)] = start + T;
} catch (...) {
  core::rethrow_as_error("backend");
}

void TqPagedCache::calibrate(std::int64_t layer, const TensorView& keys) try {
  check_layer(layer, config_.layers);
  std::lock_guard<std::mutex> lock(state_->mutex);
  State& s = *state_;
  const TqLayout& l = config_.layout;
  core::validate_tq_calibration(*backend_, l, keys);
  for (const State::Sequence& seq : s.sequences)
    if (seq.alive && seq.length[std::size_t(layer)] > 0) {
      throw Error("layer", "layer " + std::to_string(layer) +
                               " holds timesteps of a live sequence: outlier channels are chosen before any append");
    }
  s.keys[std::size_t(layer)].write_at(std::size_t(l.key_mask_offset()),
                                      core::calibrated_outlier_masks(*backend_, l, keys));
} catch (...) {
  core::rethrow_as_error("keys");
}

void TqPagedCache::attend(std::int64_t layer, const std::vector<std::int64_t>& sequences, const TensorView& q,
                          const TensorView& out, const TqAttendOptions& options) try {
  check_layer(layer, config_.layers);
  std::lock_guard<std::mutex> lock(state_->mutex);
  State& s = *state_;
  const std::int64_t B = std::int64_t(sequences.size()), n = q.shape[1], heads = q.shape[2];
  if (B < 1 || q.shape[0] != B) {
    throw Error("sequences", "must name one sequence per batch row of q (" + std::to_string(q.shape[0]) + ")");
  }
  if (n < 1 || heads < 1) throw Error("q", "must have at least one query row and one head");
  // The tables, [B, max_pages] pages then B exact sets (where the backend reads tables), and the B start positions
  // (in the backend's memory).
  std::int64_t max_pages = 1;
  for (const std::int64_t id : sequences) max_pages = std::max<std::int64_t>(max_pages, s.live(id).pages.size());
  std::vector<std::int32_t> host(std::size_t(B * max_pages + B), 0), starts(static_cast<std::size_t>(B), 0);
  for (std::int64_t b = 0; b < B; ++b) {
    const State::Sequence& seq = s.live(sequences[std::size_t(b)]);
    const std::int64_t length = seq.length[std::size_t(layer)];
    if (length < n) {
      throw Error("sequences", "sequence " + std::to_string(sequences[std::size_t(b)]) + " holds " +
                                   std::to_string(length) + " timesteps of layer " + std::to_string(layer) +
                                   ", fewer than the " + std::to_string(n) + " query rows that end at its length");
    }
    std::copy(seq.pages.begin(), seq.pages.end(), host.begin() + b * max_pages);
    host[std::size_t(B * max_pages + b)] = std::int32_t(sequences[std::size_t(b)]);
    starts[std::size_t(b)] = std::int32_t(length - n);
  }
  const std::int32_t* table = words_in(backend_->page_table_memory(), *backend_, host, s.tables_on_device);
  const TqTables& tables = s.tables[std::size_t(layer)];
  TqAttendArgs a;
  a.tables = tables;
  a.q_cap = B * n;
  a.n_heads = heads;
  a.n_queries = n;
  a.batch = B;
  a.start_positions = words_in(backend_->memory(), *backend_, starts, s.starts_on_device);
  a.pages = {table, max_pages, table + B * max_pages, backend_->page_table_memory()};
  a.window = options.window;
  a.exact = options.exact;
  a.softcap = options.softcap;
  a.sinks = options.sinks;
  a.k_cache = static_cast<const std::uint32_t*>(s.keys[std::size_t(layer)].get());
  a.v_cache = static_cast<const std::uint32_t*>(s.values[std::size_t(layer)].get());
  a.out = out;
  a.stream = stream_;
  // Validated with a stand-in scratch before anything is sized by the call (as TqKvCache::attend).
  alignas(16) static float stand_in[4];
  a.scratch = stand_in;
  const TqRotateCall probe = core::validate_tq_rotate(*backend_, {tables, q, B * n, stand_in, stream_, a.k_cache});
  const std::size_t need = backend_->tq_attend_workspace(core::validate_tq_attend(*backend_, a, false));
  float* scratch = nullptr;
  try {
    scratch =
        static_cast<float*>(s.scratch.at_least(*backend_, std::size_t(probe.scratch_layout.floats()) * sizeof(float)));
    if (need > 0) {
      a.workspace = s.workspace.at_least(*backend_, need);
      a.workspace_bytes = need;
    }
  } catch (const std::bad_alloc&) {
    throw Error("q", "the rotated queries and workspace of " + std::to_string(B * n) + " rows of " +
                         std::to_string(heads) + " heads cannot be allocated on '" + backend_->name() + "'");
  }
  a.scratch = scratch;
  const TqRotateCall rotate = core::validate_tq_rotate(*backend_, {tables, q, B * n, scratch, stream_, a.k_cache});
  const TqAttendCall attend = core::validate_tq_attend(*backend_, a);
  backend_->tq_rotate_queries(rotate);
  backend_->tq_attend(attend);
} catch (...) {
  core::rethrow_as_error("backend");
}

std::int64_t TqPagedCache::memory_bytes() const {
  return 4 * (config_.layout.key_words() + config_.layout.value_words()) * config_.layers;
}

std::vector<std::uint32_t> TqPagedCache::key_words(std::int64_t layer) const try {
  check_layer(layer, config_.layers);
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->keys[std::size_t(layer)].read<std::uint32_t>();
} catch (...) {
  core::rethrow_as_error("backend");
}

std::vector<std::uint32_t> TqPagedCache::value_words(std::int64_t layer) const try {
  check_layer(layer, config_.layers);
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->values[std::size_t(layer)].read<std::uint32_t>();
} catch (...) {
  core::rethrow_as_error("backend");
}

}  // namespace flashtq

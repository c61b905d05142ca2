// TqKvCache: a TurboQuant cache for every layer in the memory of its backend, with byte accounting and save/load.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <type_traits>

#include "core/backend_buffer.hpp"
#include "core/atomic_file.hpp"
#include "core/checked.hpp"
#include "core/crc32c.hpp"
#include "core/elements.hpp"
#include "core/entry_guard.hpp"
#include "core/growing_buffer.hpp"
#include "core/tq_calibration.hpp"
#include "core/tq_outliers.hpp"
#include "core/validate.hpp"
#include "flashtq/backend.hpp"
#include "flashtq/error.hpp"
#include "flashtq/turboquant.hpp"

namespace flashtq {
namespace {

static_assert(std::endian::native == std::endian::little, "the cache file format is little-endian");

constexpr char kMagic[8] = {'F', 'T', 'Q', 'C', 'A', 'C', 'H', 'E'};
// Version 7: the layout gained page pools (page_size, exact_sets; a saved cache is contiguous: 0 and 1). Version 6:
// the layout gained block means (key_block, value_block) and, with them, each layer's words
// their mean regions. Version 5: the layout gained outlier channels (key_outliers, key_outlier_bits) and, with them,
// the key words their outlier masks and a norm word per two parts. Version 4: the layout gained its exact tokens
// (sink_tokens, recent_tokens) and each layer's words their exact region. Version 3: the header holds the configuration
// as TqCacheConfig lays it out, the layout's qjl flag included, and a CRC-32C of everything before it ends the file
// (version 2 had neither, version 1 spelt the fields out in another order). Older versions are refused by name.
constexpr std::uint32_t kFileVersion = 7;

struct FileHeader {
  char magic[8];
  std::uint32_t version;
  std::uint32_t header_bytes;
  TqCacheConfig config;
};
static_assert(std::is_trivially_copyable_v<TqCacheConfig> && sizeof(TqCacheConfig) == 88,
              "the file header stores TqCacheConfig's bytes: a change to it changes the file format");

}  // namespace

struct TqKvCache::Storage {
  std::vector<core::BackendBuffer> keys, values;  // one per layer
  core::GrowingBuffer scratch, workspace;
  // One call at a time: calls from several threads are safe and run one after the other (they
  // share the words, the lengths and the scratch).
  std::mutex mutex;
};

// A function-try-block: what the member initialisers throw is converted too (core/entry_guard.hpp).
TqKvCache::TqKvCache(const TqCacheConfig& config, Backend* backend) try
    : config_(config), backend_(backend ? backend : &default_backend()), storage_(std::make_unique<Storage>()) {
  if (config.layers < 1) throw Error("layers", "must be >= 1");
  const TqLayout& layout = config.layout;
  core::validate_tq_layout(layout);
  if (layout.paged()) {
    throw Error("layout", "TqKvCache holds one sequence per layer (page_size 0); a page pool is TqPagedCache's");
  }
  if (!backend_->available()) {
    throw Error("backend", "'" + backend_->name() + "' is not available here: " + backend_->unavailable_reason());
  }
  if (auto why = backend_->unsupported(layout)) throw Error("backend", backend_->name() + ": " + *why);
  const std::int64_t total = core::checked_mul(
      core::checked_mul(4, layout.key_words() + layout.value_words(), "capacity"), config.layers, "layers");
  try {  // the per-layer bookkeeping first: an absurd layer count fails here, before any layer is made
    tables_.reserve(std::size_t(config.layers));
    storage_->keys.reserve(std::size_t(config.layers));
    storage_->values.reserve(std::size_t(config.layers));
    length_.assign(std::size_t(config.layers), 0);
  } catch (const std::exception&) {  // std::bad_alloc or std::length_error
    throw Error("layers", std::to_string(config.layers) + " layers' tables cannot be allocated on the host");
  }
  try {
    const std::vector<std::uint32_t> zero_keys(std::size_t(layout.key_words()), 0u),
        zero_values(std::size_t(layout.value_words()), 0u);
    for (std::int64_t layer = 0; layer < config.layers; ++layer) {
      tables_.push_back(make_tq_tables(layout, config.seed, layer));
      storage_->keys.emplace_back(*backend_, zero_keys);
      storage_->values.emplace_back(*backend_, zero_values);
    }
  } catch (const std::bad_alloc&) {
    throw Error("capacity",
                "the cache's " + std::to_string(total) + " bytes cannot be allocated on '" + backend_->name() + "'");
  }
} catch (...) {
  core::rethrow_as_error("backend");
}

TqKvCache::~TqKvCache() = default;
TqKvCache::TqKvCache(TqKvCache&&) noexcept = default;
TqKvCache& TqKvCache::operator=(TqKvCache&&) noexcept = default;

void TqKvCache::check_layer(std::int64_t layer) const {
  if (layer < 0 || layer >= config_.layers) {
    throw Error("layer", "must be in [0, " + std::to_string(config_.layers) + ")");
  }
}

void TqKvCache::append(std::int64_t layer, const TensorView& k, const TensorView& v, std::int64_t start_pos) try {
  check_layer(layer);
  std::lock_guard<std::mutex> lock(storage_->mutex);
  const std::int64_t length = length_[std::size_t(layer)];
  if (start_pos != length) {
    // A gap would leave slots that attention reads as keys of score 0; an overlap would silently rewrite.
    throw Error("start_pos", "must equal the layer's length " + std::to_string(length) +
                                 " (appends are contiguous; overwrite() rewrites timesteps already appended)");
  }
  encode(layer, k, v, start_pos);
} catch (...) {
  core::rethrow_as_error("backend");
}

void TqKvCache::calibrate(std::int64_t layer, const TensorView& keys) try {
  check_layer(layer);
  std::lock_guard<std::mutex> lock(storage_->mutex);
  const TqLayout& l = config_.layout;
  core::validate_tq_calibration(*backend_, l, keys);
  if (length_[std::size_t(layer)] != 0) {
    throw Error("layer",
                "layer " + std::to_string(layer) + " already holds " + std::to_string(length_[std::size_t(layer)]) +
                    " timesteps: outlier channels are chosen before the first append (the codes depend on them)");
  }
  storage_->keys[std::size_t(layer)].write_at(std::size_t(l.key_mask_offset()),
                                              core::calibrated_outlier_masks(*backend_, l, keys));
} catch (...) {
  core::rethrow_as_error("keys");
}

void TqKvCache::overwrite(std::int64_t layer, const TensorView& k, const TensorView& v, std::int64_t start_pos) try {
  check_layer(layer);
  std::lock_guard<std::mutex> lock(storage_->mutex);
  const std::int64_t length = length_[std::size_t(layer)];
  if (config_.layout.recent_tokens > 0) {
    throw Error("start_pos", "a cache with recent_tokens cannot overwrite (its recent window is the last timesteps)");
  }
  // start_pos first, so that length - start_pos cannot overflow whatever T is (the validator refuses T < 1).
  if (start_pos < 0 || k.shape[1] < 0 || start_pos > length || k.shape[1] > length - start_pos) {
    throw Error("start_pos",
                "overwrite() rewrites timesteps already appended: [start_pos, start_pos + T) must lie in "
                "[0, " +
                    std::to_string(length) + ")");
  }
  encode(layer, k, v, start_pos);
} catch (...) {
  core::rethrow_as_error("backend");
}

void TqKvCache::encode(std::int64_t layer, const TensorView& k, const TensorView& v, std::int64_t start_pos) {
  if (k.shape != v.shape) throw Error("v", "must have the same shape as k");
  const TqTables& tables = tables_[std::size_t(layer)];
  auto* keys = static_cast<std::uint32_t*>(storage_->keys[std::size_t(layer)].get());
  auto* values = static_cast<std::uint32_t*>(storage_->values[std::size_t(layer)].get());
  // Both validated before either is written, so a rejected call leaves the cache unchanged; both views
  // before either's rows are read, so a call refused for one view never reads the other's memory.
  const TqEncodeCall ka = core::validate_tq_encode_views(*backend_, {tables, k, start_pos, keys, stream_}, true, "k");
  const TqEncodeCall va =
      core::validate_tq_encode_views(*backend_, {tables, v, start_pos, values, stream_}, false, "v");
  core::check_tq_rows_storable(*backend_, ka, "k");
  core::check_tq_rows_storable(*backend_, va, "v");
  backend_->tq_encode(ka);
  backend_->tq_encode(va);
  length_[std::size_t(layer)] = std::max(length_[std::size_t(layer)], start_pos + k.shape[1]);
}

void TqKvCache::attend(std::int64_t layer, const TensorView& q, std::int64_t start_pos, const TensorView& out,
                       std::int64_t window, bool exact) {
  TqAttendOptions options;
  options.window = window;
  options.exact = exact;
  attend(layer, q, start_pos, out, options);
}

void TqKvCache::attend(std::int64_t layer, const TensorView& q, std::int64_t start_pos, const TensorView& out,
                       const TqAttendOptions& options) try {
  check_layer(layer);
  std::lock_guard<std::mutex> lock(storage_->mutex);
  const std::int64_t n = q.shape[1], heads = q.shape[2];
  if (n < 1 || heads < 1) throw Error("q", "must have at least one query row and one head");
  const std::int64_t length = length_[std::size_t(layer)];
  if (start_pos < 0 || start_pos > length - n) {
    throw Error("start_pos", "query rows from " + std::to_string(start_pos) + " (" + std::to_string(n) +
                                 " of them) must lie within the " + std::to_string(length) +
                                 " timesteps appended to this layer");
  }
  if (config_.layout.recent_tokens > 0 && start_pos + n != length) {
    throw Error("start_pos", "query rows must end at the layer's length " + std::to_string(length) +
                                 " (the recent window holds that sequence's last timesteps)");
  }
  const TqTables& tables = tables_[std::size_t(layer)];
  TqAttendArgs a;
  a.tables = tables;
  a.q_cap = n;
  a.n_heads = heads;
  a.n_queries = n;
  a.start_pos = start_pos;
  a.max_seq = start_pos + n;
  a.window = options.window;
  a.exact = options.exact;
  a.softcap = options.softcap;
  a.sinks = options.sinks;
  a.k_cache = static_cast<const std::uint32_t*>(storage_->keys[std::size_t(layer)].get());
  a.v_cache = static_cast<const std::uint32_t*>(storage_->values[std::size_t(layer)].get());
  a.out = out;
  a.stream = stream_;
  // Every argument is validated before anything is sized by it: first with a stand-in where the scratch
  // will be (q of 2^20 heads once went straight to the allocator), then again with the buffers.
  alignas(16) static float stand_in[4];
  a.scratch = stand_in;
  const TqRotateCall probe = core::validate_tq_rotate(*backend_, {tables, q, n, stand_in, stream_, a.k_cache});
  const std::size_t need = backend_->tq_attend_workspace(core::validate_tq_attend(*backend_, a, false));
  float* scratch = nullptr;
  try {
    scratch = static_cast<float*>(
        storage_->scratch.at_least(*backend_, std::size_t(probe.scratch_layout.floats()) * sizeof(float)));
    if (need > 0) {
      a.workspace = storage_->workspace.at_least(*backend_, need);
      a.workspace_bytes = need;
    }
  } catch (const std::bad_alloc&) {
    throw Error("q", "the rotated queries and workspace of " + std::to_string(n) + " rows of " + std::to_string(heads) +
                         " heads cannot be allocated on '" + backend_->name() + "'");
  }
  a.scratch = scratch;
  const TqRotateCall rotate = core::validate_tq_rotate(*backend_, {tables, q, n, scratch, stream_, a.k_cache});
  const TqAttendCall attend = core::validate_tq_attend(*backend_, a);
  backend_->tq_rotate_queries(rotate);
  backend_->tq_attend(attend);
} catch (...) {
  core::rethrow_as_error("backend");
}

std::int64_t TqKvCache::length(std::int64_t layer) const try {
  check_layer(layer);
  std::lock_guard<std::mutex> lock(storage_->mutex);
  return length_[std::size_t(layer)];
} catch (...) {
  core::rethrow_as_error("backend");
}

std::int64_t TqKvCache::bytes_per_token() const {
  return config_.layout.bytes_per_token_per_head() * config_.layout.n_kv_heads * config_.layers;
}

std::int64_t TqKvCache::exact_bytes() const {
  return config_.layout.exact_bytes_per_head() * config_.layout.n_kv_heads * config_.layers;
}

std::int64_t TqKvCache::memory_bytes() const {
  return 4 * (config_.layout.key_words() + config_.layout.value_words()) * config_.layers;
}

std::vector<std::uint32_t> TqKvCache::key_words(std::int64_t layer) const try {
  check_layer(layer);
  std::lock_guard<std::mutex> lock(storage_->mutex);
  return storage_->keys[std::size_t(layer)].read<std::uint32_t>();
} catch (...) {
  core::rethrow_as_error("backend");
}

std::vector<std::uint32_t> TqKvCache::value_words(std::int64_t layer) const try {
  check_layer(layer);
  std::lock_guard<std::mutex> lock(storage_->mutex);
  return storage_->values[std::size_t(layer)].read<std::uint32_t>();
} catch (...) {
  core::rethrow_as_error("backend");
}

void TqKvCache::save(const std::string& path) const try {
  std::lock_guard<std::mutex> lock(storage_->mutex);
  FileHeader h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kFileVersion;
  h.header_bytes = sizeof(FileHeader);
  std::memcpy(&h.config, &config_, sizeof config_);
  core::AtomicFile f(path);
  std::uint32_t crc = 0;
  auto put = [&](const void* data, std::size_t bytes) {
    f.write(data, bytes);
    crc = core::crc32c(crc, data, bytes);
  };
  put(&h, sizeof h);
  put(length_.data(), length_.size() * sizeof(std::int64_t));
  for (std::int64_t layer = 0; layer < config_.layers; ++layer) {
    const std::vector<std::uint32_t> k = storage_->keys[std::size_t(layer)].read<std::uint32_t>(),
                                     v = storage_->values[std::size_t(layer)].read<std::uint32_t>();
    put(k.data(), k.size() * 4);
    put(v.data(), v.size() * 4);
  }
  f.write(&crc, sizeof crc);
  f.commit();
} catch (...) {
  core::rethrow_as_error("path");
}

TqKvCache TqKvCache::load(const std::string& path, Backend* backend) try {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw Error("path", "cannot open '" + path + "' for reading");
  const std::int64_t file_bytes = std::int64_t(f.tellg());
  f.seekg(0);
  FileHeader h{};
  unsigned char raw[sizeof h];
  constexpr std::size_t version_end = offsetof(FileHeader, version) + sizeof h.version;
  if (file_bytes < std::int64_t(version_end) || !f.read(reinterpret_cast<char*>(raw), version_end) ||
      std::memcmp(raw, kMagic, sizeof kMagic) != 0) {
    throw Error("path", "'" + path + "' is not a flashtq cache file");
  }
  std::memcpy(&h.version, raw + offsetof(FileHeader, version), sizeof h.version);
  if (h.version != kFileVersion) {  // before the rest of the header, whose size depends on the version
    throw Error("path", "'" + path + "' has file version " + std::to_string(h.version) + "; this build reads version " +
                            std::to_string(kFileVersion) + " only");
  }
  if (file_bytes < std::int64_t(sizeof h) ||
      !f.read(reinterpret_cast<char*>(raw + version_end), std::streamsize(sizeof h - version_end))) {
    throw Error("path", "'" + path + "' is truncated: shorter than its header");
  }
  // The bytes become a FileHeader only once every field is a valid value of its type (a bool is 0 or 1).
  constexpr std::size_t qjl_at =
      offsetof(FileHeader, config) + offsetof(TqCacheConfig, layout) + offsetof(TqLayout, qjl);
  constexpr std::size_t nc_at =
      offsetof(FileHeader, config) + offsetof(TqCacheConfig, layout) + offsetof(TqLayout, norm_correction);
  if (raw[qjl_at] > 1 || raw[nc_at] > 1) {
    throw Error("path", "'" + path + "' is damaged: its header is not a valid configuration");
  }
  std::memcpy(&h, raw, sizeof h);
  if (h.header_bytes != sizeof h) throw Error("path", "'" + path + "' is damaged: its header size is wrong");
  // Everything the header implies is checked against the file before anything is allocated.
  const TqCacheConfig& c = h.config;
  if (c.layers < 1) throw Error("path", "'" + path + "' names a cache of no layers");
  try {
    core::validate_tq_layout(c.layout);
  } catch (const Error& e) {
    throw Error("path", "'" + path + "' holds an invalid configuration (" + e.what() + ")");
  }
  const std::int64_t layer_bytes = core::checked_mul(4, c.layout.key_words() + c.layout.value_words(), "path");
  const std::int64_t expected =
      core::checked_add(core::checked_add(std::int64_t(sizeof h) + 4, core::checked_mul(8, c.layers, "path"), "path"),
                        core::checked_mul(layer_bytes, c.layers, "path"), "path");
  if (file_bytes != expected) {
    throw Error("path", "'" + path + "' holds " + std::to_string(file_bytes) + " bytes; its header implies " +
                            std::to_string(expected));
  }
  {  // The checksum of all that precedes it, before the file's contents are trusted.
    std::uint32_t crc = core::crc32c(0, &h, sizeof h), stored = 0;
    std::vector<char> chunk(1 << 20);
    for (std::int64_t left = expected - std::int64_t(sizeof h) - 4; left > 0;) {
      const std::size_t n = std::size_t(std::min<std::int64_t>(left, std::int64_t(chunk.size())));
      if (!f.read(chunk.data(), std::streamsize(n))) throw Error("path", "reading '" + path + "' failed");
      crc = core::crc32c(crc, chunk.data(), n);
      left -= std::int64_t(n);
    }
    if (!f.read(reinterpret_cast<char*>(&stored), sizeof stored) || stored != crc) {
      throw Error("path", "'" + path + "' is damaged: its checksum does not match its contents");
    }
  }
  f.seekg(std::streamoff(sizeof h));
  std::vector<std::int64_t> lengths(std::size_t(c.layers));
  f.read(reinterpret_cast<char*>(lengths.data()), std::streamsize(8 * c.layers));
  for (std::int64_t length : lengths) {
    if (length < 0 || length > c.layout.capacity) {
      throw Error("path", "'" + path + "' has a layer length outside [0, capacity]");
    }
  }
  TqKvCache cache(c, backend);
  cache.length_ = lengths;
  for (std::int64_t layer = 0; layer < c.layers; ++layer) {
    std::vector<std::uint32_t> k(std::size_t(c.layout.key_words())), v(std::size_t(c.layout.value_words()));
    f.read(reinterpret_cast<char*>(k.data()), std::streamsize(k.size() * 4));
    f.read(reinterpret_cast<char*>(v.data()), std::streamsize(v.size() * 4));
    if (!f) throw Error("path", "reading '" + path + "' failed");
    cache.storage_->keys[std::size_t(layer)].write(k);
    cache.storage_->values[std::size_t(layer)].write(v);
  }
  return cache;
} catch (...) {
  core::rethrow_as_error("path");
}

}  // namespace flashtq

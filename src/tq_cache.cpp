// TqKvCache: a TurboQuant cache for every layer in the memory of its backend, with byte accounting and save/load.
#include <algorithm>
#include <bit>
#include <cstring>
#include <fstream>
#include <optional>
#include <type_traits>

#include "core/backend_buffer.hpp"
#include "core/checked.hpp"
#include "core/validate.hpp"
#include "flashtq/backend.hpp"
#include "flashtq/error.hpp"
#include "flashtq/turboquant.hpp"

namespace flashtq {
namespace {

static_assert(std::endian::native == std::endian::little, "the cache file format is little-endian");

constexpr char kMagic[8] = {'F', 'T', 'Q', 'C', 'A', 'C', 'H', 'E'};
// Version 2: the header holds the configuration as TqCacheConfig lays it out (version 1 spelt its
// fields out in another order).
constexpr std::uint32_t kFileVersion = 2;

struct FileHeader {
  char magic[8];
  std::uint32_t version;
  std::uint32_t header_bytes;
  TqCacheConfig config;
};
static_assert(std::is_trivially_copyable_v<TqCacheConfig> && sizeof(TqCacheConfig) == 48,
              "the file header stores TqCacheConfig's bytes: a change to it changes the file format");

// A buffer in the backend's memory that grows to the largest request and is kept.
struct GrowingBuffer {
  std::optional<core::BackendBuffer> buffer;
  void* at_least(Backend& backend, std::size_t bytes) {
    if (!buffer || buffer->bytes() < bytes) {
      buffer.reset();  // the old one first: a device may not hold both
      buffer.emplace(backend, bytes);
    }
    return buffer->get();
  }
};

}  // namespace

struct TqKvCache::Storage {
  std::vector<core::BackendBuffer> keys, values;  // one per layer
  GrowingBuffer scratch, workspace;
};

TqKvCache::TqKvCache(const TqCacheConfig& config, Backend* backend)
    : config_(config), backend_(backend ? backend : &default_backend()), storage_(std::make_unique<Storage>()) {
  if (config.layers < 1) throw Error("layers", "must be >= 1");
  const TqLayout& layout = config.layout;
  core::validate_tq_layout(layout);
  if (!backend_->available()) {
    throw Error("backend", "'" + backend_->name() + "' is not available here: " + backend_->unavailable_reason());
  }
  if (auto why = backend_->unsupported(layout)) throw Error("backend", backend_->name() + ": " + *why);
  const std::vector<std::uint32_t> zero_keys(std::size_t(layout.key_words()), 0u),
      zero_values(std::size_t(layout.value_words()), 0u);
  for (std::int64_t layer = 0; layer < config.layers; ++layer) {
    tables_.push_back(make_tq_tables(layout, config.seed, layer));
    storage_->keys.emplace_back(*backend_, zero_keys);
    storage_->values.emplace_back(*backend_, zero_values);
  }
  length_.assign(std::size_t(config.layers), 0);
}

TqKvCache::~TqKvCache() = default;
TqKvCache::TqKvCache(TqKvCache&&) noexcept = default;
TqKvCache& TqKvCache::operator=(TqKvCache&&) noexcept = default;

void TqKvCache::check_layer(std::int64_t layer) const {
  if (layer < 0 || layer >= config_.layers) {
    throw Error("layer", "must be in [0, " + std::to_string(config_.layers) + ")");
  }
}

void TqKvCache::append(std::int64_t layer, const TensorView& k, const TensorView& v, std::int64_t start_pos) {
  check_layer(layer);
  if (k.shape != v.shape) throw Error("v", "must have the same shape as k");
  const TqTables& tables = tables_[std::size_t(layer)];
  auto* keys = static_cast<std::uint32_t*>(storage_->keys[std::size_t(layer)].get());
  auto* values = static_cast<std::uint32_t*>(storage_->values[std::size_t(layer)].get());
  // Both validated before either is written, so a rejected call leaves the cache unchanged.
  const TqEncodeCall ka = core::validate_tq_encode(*backend_, {tables, k, start_pos, keys, stream_}, true);
  const TqEncodeCall va = core::validate_tq_encode(*backend_, {tables, v, start_pos, values, stream_}, false);
  backend_->tq_encode(ka);
  backend_->tq_encode(va);
  length_[std::size_t(layer)] = std::max(length_[std::size_t(layer)], start_pos + k.shape[1]);
}

void TqKvCache::attend(std::int64_t layer, const TensorView& q, std::int64_t start_pos, const TensorView& out) {
  check_layer(layer);
  const std::int64_t n = q.shape[1], heads = q.shape[2];
  if (n < 1 || heads < 1) throw Error("q", "must have at least one query row and one head");
  const std::int64_t length = length_[std::size_t(layer)];
  if (start_pos < 0 || start_pos > length - n) {
    throw Error("start_pos", "query rows from " + std::to_string(start_pos) + " (" + std::to_string(n) +
                                 " of them) must lie within the " + std::to_string(length) +
                                 " timesteps appended to this layer");
  }
  const std::int64_t floats = core::checked_mul(core::checked_mul(n, heads, "q"), 2 * config_.layout.head_dim + 1, "q");
  float* scratch = static_cast<float*>(storage_->scratch.at_least(*backend_, std::size_t(floats) * sizeof(float)));
  const TqTables& tables = tables_[std::size_t(layer)];
  TqAttendArgs a;
  a.tables = tables;
  a.scratch = scratch;
  a.q_cap = n;
  a.n_heads = heads;
  a.n_queries = n;
  a.start_pos = start_pos;
  a.max_seq = start_pos + n;
  a.k_cache = static_cast<const std::uint32_t*>(storage_->keys[std::size_t(layer)].get());
  a.v_cache = static_cast<const std::uint32_t*>(storage_->values[std::size_t(layer)].get());
  a.out = out;
  a.stream = stream_;
  const TqRotateCall rotate = core::validate_tq_rotate(*backend_, {tables, q, n, scratch, stream_});
  const std::size_t need = backend_->tq_attend_workspace(core::validate_tq_attend(*backend_, a, false));
  if (need > 0) {
    a.workspace = storage_->workspace.at_least(*backend_, need);
    a.workspace_bytes = need;
  }
  const TqAttendCall attend = core::validate_tq_attend(*backend_, a);
  backend_->tq_rotate_queries(rotate);
  backend_->tq_attend(attend);
}

std::int64_t TqKvCache::length(std::int64_t layer) const {
  check_layer(layer);
  return length_[std::size_t(layer)];
}

std::int64_t TqKvCache::bytes_per_token() const {
  return config_.layout.bytes_per_token_per_head() * config_.layout.n_kv_heads * config_.layers;
}

std::int64_t TqKvCache::memory_bytes() const {
  return 4 * (config_.layout.key_words() + config_.layout.value_words()) * config_.layers;
}

std::vector<std::uint32_t> TqKvCache::key_words(std::int64_t layer) const {
  check_layer(layer);
  return storage_->keys[std::size_t(layer)].read<std::uint32_t>();
}

std::vector<std::uint32_t> TqKvCache::value_words(std::int64_t layer) const {
  check_layer(layer);
  return storage_->values[std::size_t(layer)].read<std::uint32_t>();
}

void TqKvCache::save(const std::string& path) const {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw Error("path", "cannot open '" + path + "' for writing");
  FileHeader h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kFileVersion;
  h.header_bytes = sizeof(FileHeader);
  h.config = config_;
  f.write(reinterpret_cast<const char*>(&h), sizeof h);
  f.write(reinterpret_cast<const char*>(length_.data()), std::streamsize(length_.size() * sizeof(std::int64_t)));
  for (std::int64_t layer = 0; layer < config_.layers; ++layer) {
    const std::vector<std::uint32_t> k = key_words(layer), v = value_words(layer);
    f.write(reinterpret_cast<const char*>(k.data()), std::streamsize(k.size() * 4));
    f.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * 4));
  }
  if (!f) throw Error("path", "writing '" + path + "' failed");
}

TqKvCache TqKvCache::load(const std::string& path, Backend* backend) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw Error("path", "cannot open '" + path + "' for reading");
  const std::int64_t file_bytes = std::int64_t(f.tellg());
  f.seekg(0);
  FileHeader h{};
  if (file_bytes < std::int64_t(sizeof h) || !f.read(reinterpret_cast<char*>(&h), sizeof h) ||
      std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) {
    throw Error("path", "'" + path + "' is not a flashtq cache file");
  }
  if (h.version != kFileVersion || h.header_bytes != sizeof h) {
    throw Error("path", "'" + path + "' has file version " + std::to_string(h.version) + "; this build reads version " +
                            std::to_string(kFileVersion));
  }
  const TqCacheConfig& c = h.config;
  TqKvCache cache(c, backend);  // validates the header's configuration
  const std::int64_t expected = std::int64_t(sizeof h) + 8 * c.layers + cache.memory_bytes();
  if (file_bytes != expected) {
    throw Error("path", "'" + path + "' holds " + std::to_string(file_bytes) + " bytes; its header implies " +
                            std::to_string(expected));
  }
  f.read(reinterpret_cast<char*>(cache.length_.data()), std::streamsize(8 * c.layers));
  for (std::int64_t layer = 0; layer < c.layers; ++layer) {
    if (cache.length_[std::size_t(layer)] < 0 || cache.length_[std::size_t(layer)] > c.layout.capacity) {
      throw Error("path", "'" + path + "' has a layer length outside [0, capacity]");
    }
    std::vector<std::uint32_t> k(std::size_t(c.layout.key_words())), v(std::size_t(c.layout.value_words()));
    f.read(reinterpret_cast<char*>(k.data()), std::streamsize(k.size() * 4));
    f.read(reinterpret_cast<char*>(v.data()), std::streamsize(v.size() * 4));
    if (!f) throw Error("path", "reading '" + path + "' failed");
    cache.storage_->keys[std::size_t(layer)].write(k);
    cache.storage_->values[std::size_t(layer)].write(v);
  }
  return cache;
}

}  // namespace flashtq

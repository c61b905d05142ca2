// TqKvCache: a host-memory TurboQuant cache for every layer, with byte accounting and save/load.
#include <bit>
#include <cstring>
#include <fstream>
#include <type_traits>

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

}  // namespace

TqKvCache::TqKvCache(const TqCacheConfig& config, Backend* backend)
    : config_(config), backend_(backend ? backend : &default_backend()) {
  if (config.layers < 1) throw Error("layers", "must be >= 1");
  const TqLayout& layout = config.layout;
  core::validate_tq_layout(layout);
  if (backend_->memory() != Memory::host) {
    throw Error("backend",
                "TqKvCache keeps its words in host memory; '" + backend_->name() + "' works on device memory");
  }
  for (std::int64_t layer = 0; layer < config.layers; ++layer) {
    tables_.push_back(make_tq_tables(layout, config.seed, layer));
    keys_.emplace_back(std::size_t(layout.key_words()), 0u);
    values_.emplace_back(std::size_t(layout.value_words()), 0u);
  }
  length_.assign(std::size_t(config.layers), 0);
}

void TqKvCache::check_layer(std::int64_t layer) const {
  if (layer < 0 || layer >= config_.layers) {
    throw Error("layer", "must be in [0, " + std::to_string(config_.layers) + ")");
  }
}

void TqKvCache::append(std::int64_t layer, const TensorView& k, const TensorView& v, std::int64_t start_pos) {
  check_layer(layer);
  if (k.shape != v.shape) throw Error("v", "must have the same shape as k");
  const TqTables& tables = tables_[std::size_t(layer)];
  // Both validated before either is written, so a rejected call leaves the cache unchanged.
  const TqEncodeCall ka =
      core::validate_tq_encode(*backend_, {tables, k, start_pos, keys_[std::size_t(layer)].data(), nullptr}, true);
  const TqEncodeCall va =
      core::validate_tq_encode(*backend_, {tables, v, start_pos, values_[std::size_t(layer)].data(), nullptr}, false);
  backend_->tq_encode(ka);
  backend_->tq_encode(va);
  length_[std::size_t(layer)] = std::max(length_[std::size_t(layer)], start_pos + k.shape[1]);
}

void TqKvCache::attend(std::int64_t layer, const TensorView& q, std::int64_t start_pos, const TensorView& out) {
  check_layer(layer);
  const std::int64_t n = q.shape[1], heads = q.shape[2];
  if (start_pos < 0 || n < 1 || start_pos + n > length_[std::size_t(layer)]) {
    throw Error("start_pos", "query rows " + std::to_string(start_pos) + ".." + std::to_string(start_pos + n - 1) +
                                 " must lie within the " + std::to_string(length_[std::size_t(layer)]) +
                                 " timesteps appended to this layer");
  }
  scratch_.resize(std::size_t(tq_scratch_floats(n, heads, config_.layout.head_dim)));
  TqRotateArgs r{tables_[std::size_t(layer)], q, n, scratch_.data(), nullptr};
  TqAttendArgs a;
  a.tables = tables_[std::size_t(layer)];
  a.scratch = scratch_.data();
  a.q_cap = n;
  a.n_heads = heads;
  a.n_queries = n;
  a.start_pos = start_pos;
  a.max_seq = start_pos + n;
  a.k_cache = keys_[std::size_t(layer)].data();
  a.v_cache = values_[std::size_t(layer)].data();
  a.out = out;
  const TqRotateCall rotate = core::validate_tq_rotate(*backend_, r);
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

const std::vector<std::uint32_t>& TqKvCache::key_words(std::int64_t layer) const {
  check_layer(layer);
  return keys_[std::size_t(layer)];
}

const std::vector<std::uint32_t>& TqKvCache::value_words(std::int64_t layer) const {
  check_layer(layer);
  return values_[std::size_t(layer)];
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
    const auto& k = keys_[std::size_t(layer)];
    const auto& v = values_[std::size_t(layer)];
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
    auto& k = cache.keys_[std::size_t(layer)];
    auto& v = cache.values_[std::size_t(layer)];
    f.read(reinterpret_cast<char*>(k.data()), std::streamsize(k.size() * 4));
    f.read(reinterpret_cast<char*>(v.data()), std::streamsize(v.size() * 4));
  }
  if (!f) throw Error("path", "reading '" + path + "' failed");
  return cache;
}

}  // namespace flashtq

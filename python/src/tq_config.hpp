// The TurboQuant caches' configuration as Python sees it (flashtq._flashtq.TqKvCache and TqPagedCache): every
// use of the layout's fields by the bindings is here, so a change of TqLayout is a change here only.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <vector>

#include "flashtq/error.hpp"
#include "flashtq/turboquant.hpp"

namespace flashtq::python {

// The cache's configuration as Python sees it: every use of TqCacheConfig's fields is in the two
// functions below, so a change of that struct is a change here only.
struct Config {
  std::int64_t layers, n_kv_heads, head_dim, capacity;
  int key_bits, value_bits;
  bool qjl;
  std::uint64_t seed;
  std::int64_t sink_tokens, recent_tokens;
  bool norm_correction;
  std::int64_t key_outliers, key_outlier_bits;
  std::int64_t key_block, value_block;
  std::int64_t page_size = 0, exact_sets = 1;  // a pool's (TqPagedCache)
};

inline TqCacheConfig to_library(const Config& c) {
  TqCacheConfig out;
  out.layers = c.layers;
  out.layout.head_dim = c.head_dim;
  out.layout.n_kv_heads = c.n_kv_heads;
  out.layout.capacity = c.capacity;
  out.layout.key_bits = c.key_bits;
  out.layout.value_bits = c.value_bits;
  out.layout.qjl = c.qjl;
  // Checked here because the layout holds them as int32: a larger value must not wrap into a valid one.
  if (c.sink_tokens < 0 || c.sink_tokens > INT32_MAX) throw Error("sink_tokens", "must be in [0, 2^31)");
  if (c.recent_tokens < 0 || c.recent_tokens > INT32_MAX) throw Error("recent_tokens", "must be in [0, 2^31)");
  out.layout.sink_tokens = std::int32_t(c.sink_tokens);
  out.layout.recent_tokens = std::int32_t(c.recent_tokens);
  out.layout.norm_correction = c.norm_correction;
  if (c.key_outliers < 0 || c.key_outliers > 512) throw Error("key_outliers", "must be in [0, 512]");
  if (c.key_outlier_bits < 0 || c.key_outlier_bits > 8) throw Error("key_outlier_bits", "must be in [0, 8]");
  out.layout.key_outliers = std::int32_t(c.key_outliers);
  out.layout.key_outlier_bits = std::int32_t(c.key_outlier_bits);
  if (c.key_block < 0 || c.key_block > 1024) throw Error("key_block", "must be in [0, 1024]");
  if (c.value_block < 0 || c.value_block > 1024) throw Error("value_block", "must be in [0, 1024]");
  out.layout.key_block = std::int32_t(c.key_block);
  out.layout.value_block = std::int32_t(c.value_block);
  if (c.page_size < 0 || c.page_size > 1024) throw Error("page_size", "must be in [0, 1024]");
  out.layout.page_size = std::int32_t(c.page_size);
  out.layout.exact_sets = c.exact_sets;
  out.seed = c.seed;
  return out;
}

inline Config from_library(const TqCacheConfig& c) {
  const TqLayout& l = c.layout;
  return {
      c.layers,      l.n_kv_heads,  l.head_dim,      l.capacity,        l.key_bits,     l.value_bits,       l.qjl,
      c.seed,        l.sink_tokens, l.recent_tokens, l.norm_correction, l.key_outliers, l.key_outlier_bits, l.key_block,
      l.value_block, l.page_size,   l.exact_sets};
}

// The fields of a configuration that flashtq.TurboQuantConfig holds besides its seed.
inline void put_widths(nanobind::dict& d, const Config& c) {
  d["key_bits"] = c.key_bits;
  d["value_bits"] = c.value_bits;
  d["qjl"] = c.qjl;
  d["sink_tokens"] = c.sink_tokens;
  d["recent_tokens"] = c.recent_tokens;
  d["norm_correction"] = c.norm_correction;
  d["key_outliers"] = c.key_outliers;
  d["key_outlier_bits"] = c.key_outlier_bits;
  d["key_block"] = c.key_block;
  d["value_block"] = c.value_block;
}

// The options of a cache's attend as the bindings take them (sinks: a device or host address, 0 = none).
inline TqAttendOptions attend_options(std::int64_t window, bool exact, float softcap, std::uintptr_t sinks) {
  TqAttendOptions options;
  options.window = window;
  options.exact = exact;
  options.softcap = softcap;
  options.sinks = reinterpret_cast<const float*>(sinks);
  return options;
}

// A layer's words as Python bytes.
inline nanobind::bytes words(const std::vector<std::uint32_t>& w) {
  return nanobind::bytes(reinterpret_cast<const char*>(w.data()), w.size() * sizeof(std::uint32_t));
}

}  // namespace flashtq::python

// libFuzzer harness: TqKvCache::load on fuzzed file bytes, on the reference and cpu backends.
//
// The input is the file. It is loaded as it is and, when its checksum does not match, once more
// with the checksum recomputed (so that the fuzzer also reaches what load checks after the CRC).
// Requires:
// - load returns or throws flashtq::Error, nothing else (no crash, no sanitizer report, no
//   allocation the file's size does not justify), and both backends agree on which;
// - a file that loads saves back to the very same bytes;
// - the loaded cache works: attention at each layer's last timestep, and an append where there is room.
//
// `fuzz_tq_load --write-corpus=DIR` writes the seed corpus (small valid files) instead of fuzzing.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "core/crc32c.hpp"
#include "flashtq/backend.hpp"
#include "flashtq/turboquant.hpp"
#include "fuzz_support.hpp"

namespace {

using namespace flashtq;
using fuzz::finding;
using fuzz::temp_dir;

void write_file(const std::string& path, const std::uint8_t* data, std::size_t size) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  if (!f) finding("cannot write %s", path.c_str());
}

std::vector<std::uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// Rows with values in [-2, 2): x [1, T, heads, D] f32, contiguous.
std::vector<float> rows(std::int64_t T, std::int64_t heads, std::int64_t D, std::uint64_t seed) {
  fuzz::Rng rng{seed};
  std::vector<float> x(std::size_t(T * heads * D));
  for (float& e : x) e = rng.uniform(-2.0f, 2.0f);
  return x;
}

// Uses a loaded cache: one attention row at each non-empty layer's last timestep, one append where
// there is room. Words from a fuzzed file may decode to anything (a NaN norm, say), so outputs are
// not checked, only that the calls are accepted and stay in bounds.
void exercise(TqKvCache& cache) {
  const TqLayout& l = cache.layout();
  const std::int64_t D = l.head_dim, H = l.n_kv_heads;
  std::vector<float> q = rows(1, H, D, 1), out(q.size());
  for (std::int64_t layer = 0; layer < cache.config().layers; ++layer) {
    const std::int64_t len = cache.length(layer);
    if (len > 0) {
      if (auto e = fuzz::refused([&] {
            cache.attend(layer, TensorView::bshd(q.data(), DType::f32, 1, 1, H, D), len - 1,
                         TensorView::bshd(out.data(), DType::f32, 1, 1, H, D));
          }))
        finding("%s: attend on a loaded cache refused (argument '%s')", cache.backend().name().c_str(), e->c_str());
    }
    if (len < l.capacity) {
      std::vector<float> k = rows(1, H, D, 2), v = rows(1, H, D, 3);
      if (auto e = fuzz::refused([&] {
            cache.append(layer, TensorView::bshd(k.data(), DType::f32, 1, 1, H, D),
                         TensorView::bshd(v.data(), DType::f32, 1, 1, H, D), len);
          }))
        finding("%s: append to a loaded cache refused (argument '%s')", cache.backend().name().c_str(), e->c_str());
    }
  }
}

void load_file(const std::uint8_t* data, std::size_t size) {
  const std::string path = temp_dir() + "/input.ftq", again = temp_dir() + "/saved.ftq";
  write_file(path, data, size);
  std::optional<bool> loaded;
  for (const char* name : {"reference", "cpu"}) {
    Backend& be = backend(name);
    std::optional<TqKvCache> cache;
    const auto error = fuzz::refused([&] { cache.emplace(TqKvCache::load(path, &be)); });
    if (loaded && *loaded != !error)
      finding("the backends disagree: reference %s the file, cpu %s it", *loaded ? "loads" : "refuses",
              error ? "refuses" : "loads");
    loaded = !error;
    if (error) continue;
    fuzz::stats.count(1, "files loaded");
    if (auto e = fuzz::refused([&] { cache->save(again); })) finding("saving a loaded cache failed ('%s')", e->c_str());
    const std::vector<std::uint8_t> bytes = read_file(again);
    if (bytes.size() != size || !std::equal(bytes.begin(), bytes.end(), data))
      finding("%s: the loaded file saves back to other bytes (%zu bytes, was %zu)", name, bytes.size(), size);
    exercise(*cache);
  }
}

void run(const std::uint8_t* data, std::size_t size) {
  load_file(data, size);
  fuzz::stats.count(0, "inputs");
  if (size < 4) return;
  // The same bytes with a checksum that matches them (CRC-32C of all before the last 4 bytes).
  std::vector<std::uint8_t> fixed(data, data + size);
  const std::uint32_t crc = core::crc32c(0, fixed.data(), size - 4);
  if (std::equal(fixed.end() - 4, fixed.end(), reinterpret_cast<const std::uint8_t*>(&crc))) return;
  std::copy_n(reinterpret_cast<const std::uint8_t*>(&crc), 4, fixed.end() - 4);
  load_file(fixed.data(), fixed.size());
}

// The seed corpus: a few small valid files, each of another configuration and fill.
void write_corpus(const std::string& dir) {
  struct Seed {
    TqCacheConfig config;
    std::vector<std::int64_t> fill;  // timesteps appended per layer
  };
  const Seed seeds[] = {
      {{1, {32, 1, 4, 2, 2}, 1}, {3}},                                    // the seed's widths
      {{1, {32, 1, 2, 1, 3}, 2}, {0}},                                    // empty
      {{2, {64, 2, 3, 3, 4, false, true, 1, 1}, 3}, {3, 1}},              // no QJL, norm correction, exact tokens
      {{1, {128, 1, 2, 4, 2, false}, 4}, {2}},                            // 4-bit keys
      {{3, {32, 2, 2, 2, 3, true, false, 0, 2}, 5}, {2, 0, 1}},           // recent tokens only
      {{1, {256, 1, 1, 3, 4, true, false, 1, 0}, 6}, {1}},                // head_dim 256, a sink
      {{2, {64, 2, 3, 3, 3, false, true, 1, 1, 16, 4}, 7}, {2, 3}},       // outlier channels (masks uncalibrated)
      {{1, {32, 1, 12, 2, 3, false, false, 1, 8, 0, 0, 8, 8}, 8}, {11}},  // block means (three timesteps coded)
  };
  int i = 0;
  for (const Seed& s : seeds) {
    TqKvCache cache(s.config, &backend("reference"));
    const TqLayout& l = s.config.layout;
    for (std::int64_t layer = 0; layer < s.config.layers; ++layer) {
      const std::int64_t T = s.fill[std::size_t(layer)];
      if (T == 0) continue;
      std::vector<float> k = rows(T, l.n_kv_heads, l.head_dim, 10 + layer), v = rows(T, l.n_kv_heads, l.head_dim, 20);
      cache.append(layer, TensorView::bshd(k.data(), DType::f32, 1, T, l.n_kv_heads, l.head_dim),
                   TensorView::bshd(v.data(), DType::f32, 1, T, l.n_kv_heads, l.head_dim), 0);
    }
    cache.save(dir + "/valid-" + std::to_string(i++) + ".ftq");
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  fuzz::write_corpus_if_asked(*argc, *argv, write_corpus);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  run(data, size);
  return 0;
}

// libFuzzer harness: flashtq::TqKvCache on the reference and cpu backends.
//
// An input is a cache configuration (head_dim, kv heads, capacity, bit widths, qjl, norm
// correction, exact tokens, layers, seed) and a sequence of operations: append, overwrite, attend
// (any dtype, strides, pointers, positions, window), save + load, and the readers (length,
// key_words, value_words). The same sequence runs on a reference cache and a cpu cache side by side.
// The harness states independently, from docs/spec.md §2 and §4, whether each call is valid, and
// requires:
// - every call returns or throws flashtq::Error, nothing else (no crash, no sanitizer report);
// - a call the spec refuses throws on both backends, one it accepts succeeds on both;
// - a refused call leaves the cache as it was (every layer's length and words);
// - appends move the length to start_pos + T, overwrites keep it;
// - attention over moderate inputs writes finite outputs (every row sees at least its own timestep);
// - save + load gives back the same lengths and words, and saving to a missing folder is an Error.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "flashtq/backend.hpp"
#include "flashtq/turboquant.hpp"
#include "fuzz_support.hpp"

namespace {

using namespace flashtq;
using fuzz::finding;
using fuzz::temp_dir;
using fuzz::Tensor;
using fuzz::Values;

constexpr std::int64_t kMaxCacheBytes = 4 << 20;  // a cache this harness builds, all layers
constexpr std::size_t kMaxViewBytes = 256 * 1024;
constexpr int kMaxOps = 24;

// docs/spec.md §2 and §4 on a layout: why it is refused, or empty.
std::string layout_invalid(const TqLayout& l) {
  const std::int64_t d = l.head_dim;
  if (d < 32 || d > 256 || (d & (d - 1)) != 0) return "head_dim";
  if (l.key_bits < 1 || l.key_bits > (l.qjl ? 3 : 4)) return "key_bits";
  if (l.value_bits < 2 || l.value_bits > 4) return "value_bits";
  if (l.n_kv_heads < 1) return "n_kv_heads";
  if (l.capacity < 1) return "capacity";
  if (l.norm_correction && l.qjl) return "norm_correction";
  if (l.sink_tokens < 0 || l.sink_tokens > 65536 || l.recent_tokens < 0 || l.recent_tokens > 65536)
    return "exact tokens";
  if (std::int64_t(l.sink_tokens) + l.recent_tokens > l.capacity) return "exact tokens > capacity";
  if (l.key_outliers != 0 &&
      (l.key_outliers < 16 || l.key_outliers > d / 2 || (l.key_outliers & (l.key_outliers - 1)) || l.qjl ||
       l.key_outlier_bits < l.key_bits || l.key_outlier_bits > 4))
    return "key_outliers";
  if (l.key_outliers == 0 && l.key_outlier_bits != 0) return "key_outlier_bits";
  for (const std::int32_t g : {l.key_block, l.value_block})
    if (g != 0 && (g < 8 || g > 2 * d || (g & (g - 1)) || g > l.recent_tokens)) return "block means";
  if (l.key_block && l.qjl) return "key_block with QJL";
  // The widest slot's words (4-bit codes, the jl words, a norm, an exact row's share) under 2^32.
  const __int128 slots = (__int128)l.n_kv_heads * l.capacity, words_per_slot = d * 4 / 32 + d / 32 + 3 + d / 2;
  if (slots > (__int128)0xFFFFFFFFu || slots * words_per_slot > (__int128)0xFFFFFFFFu) return "2^32 words";
  return {};
}

// The state a refused call must leave as it was.
struct Snapshot {
  std::vector<std::int64_t> lengths;
  std::vector<std::vector<std::uint32_t>> words;
  bool operator==(const Snapshot&) const = default;
};

Snapshot snapshot(const TqKvCache& c) {
  Snapshot s;
  for (std::int64_t l = 0; l < c.config().layers; ++l) {
    s.lengths.push_back(c.length(l));
    s.words.push_back(c.key_words(l));
    s.words.push_back(c.value_words(l));
  }
  return s;
}

struct Side {
  Backend* backend;
  std::optional<TqKvCache> cache;
};

// A view for an operation: [1, T, heads, D] of a drawn dtype and strides, sometimes changed into
// one the spec refuses (or that claims more memory than it has: then it must be refused).
struct View {
  Tensor t;
  bool changed = false;
};

View draw_view(FuzzedDataProvider& fdp, std::int64_t T, std::int64_t heads, std::int64_t D, bool f32_only,
               Values values, fuzz::Rng& rng) {
  View v;
  TensorView& tv = v.t.view;
  tv.dtype = f32_only ? DType::f32 : DType(fdp.ConsumeIntegralInRange(0, 2));
  tv.shape = {1, T, heads, D};
  tv.strides = fuzz::fuzzed_strides(fdp, tv.shape);
  int null = 0, misalign = 0;
  if (fuzz::rarely(fdp, 0.15f)) {
    v.changed = true;
    switch (fdp.ConsumeIntegralInRange(0, 6)) {
      case 0: tv.dtype = DType(fdp.ConsumeIntegral<std::uint8_t>()); break;
      case 1: tv.memory = Memory(fdp.ConsumeIntegralInRange<std::uint8_t>(1, 3)); break;
      case 2: tv.shape[fdp.ConsumeIntegralInRange(0, 3)] = fuzz::interesting_int64(fdp); break;
      case 3: tv.strides[fdp.ConsumeIntegralInRange(0, 3)] = fuzz::interesting_int64(fdp); break;
      case 4: tv.shape[fdp.ConsumeIntegralInRange(0, 3)] = fdp.ConsumeIntegralInRange<std::int64_t>(0, 300); break;
      case 5: null = 1; break;
      case 6: misalign = fdp.ConsumeIntegralInRange(1, 2); break;
    }
  }
  v.t.allocate(kMaxViewBytes, null, std::size_t(misalign));
  v.t.fill(rng, values);
  return v;
}

// Why a view is refused for an operation that wants `want`: the view rules, then the shape.
std::string view_wrong(const TensorView& t, const std::array<std::int64_t, 4>& want) {
  if (auto why = fuzz::view_invalid(t); !why.empty()) return why;
  if (t.shape != want) return "shape";
  return {};
}

void check_unchanged(const Side& s, const Snapshot& before, const char* op, const std::string& why) {
  if (snapshot(*s.cache) != before)
    finding("%s: a refused %s (%s) changed the cache", s.backend->name().c_str(), op, why.c_str());
}

// What docs/spec.md §2.2 (step 4) and §4 say of the rows of an append: every row's norm n must be finite
// and its norm word at most 65504, else the call is refused. The word is n itself, or n / |c[idx]| with
// norm correction, which depends on the codes: there the harness holds only what |c[idx]| cannot change
// (|c[idx]| is at least sqrt(head_dim) times the smallest centroid, above 1/20 for the widths allowed),
// and near 65504 it leaves room for the f32 rounding of n.
enum class NormVerdict { fits, refused, either };

// spread: with outlier channels, sqrt(key_outliers / head_dim): a part's norm half holds up to 1 / spread times
// the row's norm, so fewer rows fit for sure (a row past 65504 still never fits: some half holds at least n).
NormVerdict norm_verdict(const Tensor& t, bool norm_correction, double spread = 1.0) {
  if (!t.fits || t.view.data == nullptr) return NormVerdict::fits;  // refused for its view first
  NormVerdict verdict = NormVerdict::fits;
  for (std::int64_t s = 0; s < t.view.shape[1]; ++s)
    for (std::int64_t h = 0; h < t.view.shape[2]; ++h) {
      double sum = 0;
      for (std::int64_t d = 0; d < t.view.shape[3]; ++d) {
        const double x = t.get(s * t.view.strides[1] + h * t.view.strides[2] + d * t.view.strides[3]);
        sum += x * x;
      }
      const double n = std::sqrt(sum);
      const double sure_fit = spread * (norm_correction ? 65504.0 / 20 : 65504.0 * (1 - 1e-3));
      if (!std::isfinite(n) || (!norm_correction && n > 65504.0 * (1 + 1e-3))) return NormVerdict::refused;
      if (n > sure_fit) verdict = NormVerdict::either;
    }
  return verdict;
}

// Runs op on both sides and holds each outcome to the expectation (why empty: must succeed; `either`:
// may be refused, the same way on both sides).
template <typename Op>
bool on_both(std::array<Side, 2>& sides, const char* name, const std::string& why, Op&& op, bool either = false) {
  bool ok = true;
  std::optional<bool> first_refused;
  for (Side& s : sides) {
    const Snapshot before = why.empty() && !either ? Snapshot{} : snapshot(*s.cache);
    const auto error = fuzz::refused([&] { op(s); });
    if (error && why.empty() && !either)
      finding("%s: %s refused a valid call (argument '%s')", s.backend->name().c_str(), name, error->c_str());
    if (!error && !why.empty())
      finding("%s: %s accepted a call the spec refuses (%s)", s.backend->name().c_str(), name, why.c_str());
    if (first_refused && *first_refused != bool(error))
      finding("%s: %s %s a call the other backend %s", s.backend->name().c_str(), name, error ? "refused" : "accepted",
              error ? "accepted" : "refused");
    first_refused = bool(error);
    if (error) check_unchanged(s, before, name, why.empty() ? "a norm past f16" : why);
    ok = !error;
  }
  return ok;
}

void run(const uint8_t* data, size_t size) {
  FuzzedDataProvider fdp(data, size);
  TqCacheConfig config;
  config.layers = fuzz::rarely(fdp, 0.05f) ? fuzz::interesting_int64(fdp) : fdp.ConsumeIntegralInRange(1, 3);
  TqLayout& l = config.layout;
  static constexpr std::int64_t head_dims[] = {32, 64, 128, 256};
  l.head_dim = fuzz::rarely(fdp, 0.05f) ? fuzz::interesting_int64(fdp) : fdp.PickValueInArray(head_dims);
  l.n_kv_heads = fuzz::rarely(fdp, 0.05f) ? fuzz::interesting_int64(fdp) : fdp.ConsumeIntegralInRange(1, 3);
  l.capacity = fuzz::rarely(fdp, 0.05f) ? fuzz::interesting_int64(fdp) : fdp.ConsumeIntegralInRange(1, 40);
  l.qjl = !fdp.ConsumeBool();
  l.key_bits = fdp.ConsumeIntegralInRange(1, 3) + (fuzz::rarely(fdp, 0.1f) ? fdp.ConsumeIntegralInRange(-2, 3) : 0);
  l.value_bits = fdp.ConsumeIntegralInRange(2, 4) + (fuzz::rarely(fdp, 0.1f) ? fdp.ConsumeIntegralInRange(-2, 2) : 0);
  l.norm_correction = !l.qjl && fdp.ConsumeBool();
  if (fuzz::rarely(fdp, 0.05f)) l.norm_correction = true;
  const std::int64_t exact_max = std::clamp<std::int64_t>(l.capacity, 0, 6);
  l.sink_tokens = fuzz::rarely(fdp, 0.5f) ? std::int32_t(fdp.ConsumeIntegralInRange<std::int64_t>(0, exact_max)) : 0;
  l.recent_tokens = fuzz::rarely(fdp, 0.5f) ? std::int32_t(fdp.ConsumeIntegralInRange<std::int64_t>(0, exact_max)) : 0;
  if (fuzz::rarely(fdp, 0.05f)) l.recent_tokens = std::int32_t(fuzz::interesting_int64(fdp));
  config.seed = fdp.ConsumeIntegral<std::uint64_t>();
  // Outlier channels from the seed's top bits (no bytes of their own, so the corpus keeps its meaning): one
  // input in eight without QJL gets 16 to 128 of them (past head_dim / 2 sometimes: refused), at key_bits to
  // key_bits + 3 bits (past 4 sometimes: refused).
  if (!l.qjl && (config.seed >> 61) == 0) {
    l.key_outliers = 16 << ((config.seed >> 58) & 3);
    l.key_outlier_bits = l.key_bits + int((config.seed >> 56) & 3);
  }
  // Block means from the seed's next bits: one input in eight gets key blocks of 8 to 64 timesteps (with QJL or
  // past recent_tokens sometimes: refused), values the same half the time, and a recent window that holds them.
  if (((config.seed >> 53) & 7) == 1) {
    l.key_block = std::int32_t(8) << ((config.seed >> 50) & 3);
    l.value_block = ((config.seed >> 49) & 1) ? l.key_block : 0;
    if ((config.seed >> 48) & 1) l.recent_tokens = std::max(l.recent_tokens, l.key_block);
  }

  std::string why = config.layers < 1 ? "layers" : layout_invalid(l);
  if (why.empty()) {
    const __int128 bytes = (__int128)4 * (l.key_words() + l.value_words()) * config.layers;
    if (bytes > kMaxCacheBytes) {
      if (bytes <= fuzz::kInt64Max) return;  // valid but too large to build here
      why = "bytes overflow 64 bits";
    }
  }
  std::array<Side, 2> sides{Side{&backend("reference"), {}}, Side{&backend("cpu"), {}}};
  sides[1].backend->set_threads(fdp.ConsumeIntegralInRange(1, 3));
  for (Side& s : sides) {
    const auto error = fuzz::refused([&] { s.cache.emplace(config, s.backend); });
    if (error && why.empty())
      finding("%s: a valid configuration was refused (argument '%s')", s.backend->name().c_str(), error->c_str());
    if (!error && !why.empty())
      finding("%s: a configuration the spec refuses was accepted (%s)", s.backend->name().c_str(), why.c_str());
  }
  if (!why.empty()) return;
  fuzz::stats.count(0, "caches built");

  const std::int64_t D = l.head_dim, Hkv = l.n_kv_heads;
  std::vector<std::int64_t> length(std::size_t(config.layers), 0);
  bool moderate = true;  // every row appended so far had moderate values
  fuzz::Rng rng{fdp.ConsumeIntegral<std::uint64_t>()};
  auto draw_layer = [&] {
    return fuzz::rarely(fdp, 0.05f) ? fuzz::interesting_int64(fdp)
                                    : fdp.ConsumeIntegralInRange<std::int64_t>(0, config.layers - 1);
  };
  auto layer_bad = [&](std::int64_t layer) { return layer < 0 || layer >= config.layers; };
  for (int op = 0; op < kMaxOps && fdp.remaining_bytes() > 0; ++op) {
    switch (fdp.ConsumeIntegralInRange(0, 7)) {
      case 0:
      case 1:
      case 2:
      case 3: {  // append, or overwrite timesteps already appended
        const bool overwrite = fuzz::rarely(fdp, 0.3f);
        const std::int64_t layer = draw_layer();
        const std::int64_t len = layer_bad(layer) ? 0 : length[std::size_t(layer)];
        const std::int64_t room = overwrite ? len : l.capacity - len;
        const std::int64_t T = fdp.ConsumeIntegralInRange<std::int64_t>(1, std::clamp<std::int64_t>(room, 1, 8) + 1);
        std::int64_t start =
            overwrite ? fdp.ConsumeIntegralInRange<std::int64_t>(0, std::max<std::int64_t>(len - T, 0)) : len;
        if (fuzz::rarely(fdp, 0.1f)) start += fdp.ConsumeIntegralInRange(-2, 2);
        if (fuzz::rarely(fdp, 0.03f)) start = fuzz::interesting_int64(fdp);
        const Values values = fuzz::rarely(fdp, 0.1f) ? Values(fdp.ConsumeIntegralInRange(1, 3)) : Values::moderate;
        View k = draw_view(fdp, T, Hkv, D, false, values, rng), v = draw_view(fdp, T, Hkv, D, false, values, rng);
        const std::array<std::int64_t, 4> want{1, k.t.view.shape[1], Hkv, D};
        const std::int64_t kT = k.t.view.shape[1];
        std::string why;
        if (layer_bad(layer)) {
          why = "layer";
        } else if (overwrite) {
          if (l.recent_tokens > 0)
            why = "overwrite with recent tokens";
          else if (start < 0 || (__int128)start + kT > len)
            why = "overwrite outside [0, length)";
        } else if (start != len) {
          why = "append not at the length";
        }
        if (why.empty() && k.t.view.shape != v.t.view.shape) why = "v's shape";
        if (why.empty()) {
          if (auto w = view_wrong(k.t.view, want); !w.empty())
            why = "k: " + w;
          else if (auto w2 = view_wrong(v.t.view, want); !w2.empty())
            why = "v: " + w2;
          else if ((__int128)start + kT > l.capacity)
            why = "past capacity";
        }
        if (why.empty() && !(k.t.fits && v.t.fits)) break;  // valid, but larger than its buffers
        bool norm_either = false;
        if (why.empty()) {
          // With block means a row must fit twice over (its residual may be up to twice its block's longest row).
          const double spread = l.key_outliers ? std::sqrt(double(l.key_outliers) / double(l.head_dim)) : 1.0;
          const NormVerdict kv[] = {norm_verdict(k.t, l.norm_correction && !l.qjl, spread / (l.key_block ? 2.02 : 1)),
                                    norm_verdict(v.t, l.norm_correction, l.value_block ? 1 / 2.02 : 1.0)};
          for (NormVerdict n : kv) {
            if (n == NormVerdict::refused) why = "a norm past f16";
            norm_either = norm_either || n == NormVerdict::either;
          }
          if (!why.empty()) norm_either = false;
        }
        const bool ok = on_both(
            sides, overwrite ? "overwrite" : "append", why,
            [&](Side& s) {
              if (overwrite)
                s.cache->overwrite(layer, k.t.view, v.t.view, start);
              else
                s.cache->append(layer, k.t.view, v.t.view, start);
            },
            norm_either);
        fuzz::stats.count(ok ? 1 : 2, ok ? "appends/overwrites" : "appends/overwrites refused");
        if (!ok) break;
        if (values != Values::moderate && values != Values::zeros) moderate = false;
        if (!overwrite) length[std::size_t(layer)] = start + kT;
        for (Side& s : sides)
          if (s.cache->length(layer) != length[std::size_t(layer)])
            finding("%s: length %ld after %s, expected %ld", s.backend->name().c_str(), s.cache->length(layer),
                    overwrite ? "overwrite" : "append", length[std::size_t(layer)]);
        break;
      }
      case 4:
      case 5: {  // attend
        const std::int64_t layer = draw_layer();
        const std::int64_t len = layer_bad(layer) ? 0 : length[std::size_t(layer)];
        const std::int64_t n = fdp.ConsumeIntegralInRange<std::int64_t>(1, std::clamp<std::int64_t>(len, 1, 4));
        const std::int64_t H = Hkv * fdp.ConsumeIntegralInRange(1, 3);
        std::int64_t start = l.recent_tokens > 0 || fdp.ConsumeBool()
                                 ? len - n
                                 : fdp.ConsumeIntegralInRange<std::int64_t>(0, std::max<std::int64_t>(len - n, 0));
        if (fuzz::rarely(fdp, 0.1f)) start += fdp.ConsumeIntegralInRange(-2, 2);
        if (fuzz::rarely(fdp, 0.03f)) start = fuzz::interesting_int64(fdp);
        std::int64_t window = fuzz::rarely(fdp, 0.3f) ? fdp.ConsumeIntegralInRange<std::int64_t>(1, l.capacity + 1) : 0;
        if (fuzz::rarely(fdp, 0.05f)) window = fuzz::interesting_int64(fdp);
        const Values values = fuzz::rarely(fdp, 0.1f) ? Values(fdp.ConsumeIntegralInRange(1, 3)) : Values::moderate;
        View q = draw_view(fdp, n, H, D, false, values, rng);
        View out = draw_view(fdp, n, H, D, !fuzz::rarely(fdp, 0.05f), Values::zeros, rng);
        const std::int64_t qn = q.t.view.shape[1], qh = q.t.view.shape[2];
        std::string why;
        if (layer_bad(layer))
          why = "layer";
        else if (qn < 1 || qh < 1)
          why = "no rows or heads";
        else if (start < 0 || (__int128)start + qn > len)
          why = "rows outside the appended timesteps";
        else if (l.recent_tokens > 0 && start + qn != len)
          why = "rows must end at the length";
        else if (auto w = fuzz::view_invalid(q.t.view); !w.empty())
          why = "q: " + w;
        else if (q.t.view.shape[0] != 1)
          why = "q batch";
        else if (q.t.view.shape[3] != D)
          why = "q head_dim";
        else if (qh % Hkv != 0)
          why = "heads not a multiple of kv heads";
        else if (window < 0 || window > 2147483647)  // docs/spec.md §4: a window outside [0, 2^31 - 1]
          why = "window";
        else if (auto w3 = view_wrong(out.t.view, {1, qn, qh, D}); !w3.empty())
          why = "out: " + w3;
        else if (out.t.view.dtype != DType::f32)
          why = "out dtype";
        if (why.empty() && !(q.t.fits && out.t.fits)) break;
        const bool ok = on_both(sides, "attend", why, [&](Side& s) {
          out.t.poison();
          s.cache->attend(layer, q.t.view, start, out.t.view, window);
          if (!moderate || values != Values::moderate) return;
          out.t.for_each([&](std::int64_t, std::int64_t i, std::int64_t h, std::int64_t d, std::int64_t e) {
            const float x = out.t.get(e);
            if (!std::isfinite(x))
              finding("%s: attend out[0, %ld, %ld, %ld] = %g (start %ld, window %ld)", s.backend->name().c_str(), i, h,
                      d, x, start, window);
          });
        });
        fuzz::stats.count(ok ? 3 : 4, ok ? "attends" : "attends refused");
        break;
      }
      case 6: {  // save and load, into the same backend; sometimes carry on with the loaded cache
        const bool bad_path = fuzz::rarely(fdp, 0.1f);
        const bool swap = fdp.ConsumeBool();
        const std::string path = temp_dir() + (bad_path ? "/no such folder/cache.ftq" : "/cache.ftq");
        on_both(sides, "save", bad_path ? "a folder that does not exist" : "", [&](Side& s) {
          s.cache->save(path);
          if (bad_path) return;
          TqKvCache loaded = TqKvCache::load(path, s.backend);
          if (snapshot(loaded) != snapshot(*s.cache))
            finding("%s: a loaded cache differs from the one saved", s.backend->name().c_str());
          if (swap) *s.cache = std::move(loaded);
        });
        fuzz::stats.count(5, "save + load");
        break;
      }
      case 7: {  // the readers
        const std::int64_t layer = draw_layer();
        const std::string why = layer_bad(layer) ? "layer" : "";
        on_both(sides, "length/key_words/value_words", why, [&](Side& s) {
          const int which = int(layer & 3);
          if (which == 0) s.cache->length(layer);
          if (which == 1) s.cache->key_words(layer);
          if (which == 2) s.cache->value_words(layer);
          if (which == 3) {
            s.cache->length(layer);
            s.cache->value_words(layer);
            s.cache->key_words(layer);
          }
        });
        break;
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  fuzz::write_corpus_if_asked(*argc, *argv, [](const std::string& dir) { fuzz::write_random_corpus(dir, 2); });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  run(data, size);
  return 0;
}

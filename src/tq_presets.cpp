// The named TurboQuant presets: the one list the C++ API, the Python package and the conformance suite read.
#include <algorithm>
#include <string>
#include <vector>

#include "core/entry_guard.hpp"
#include "core/validate.hpp"
#include "flashtq/error.hpp"
#include "flashtq/turboquant.hpp"

namespace flashtq {

const std::vector<TqPreset>& tq_presets() {
  // Measured in docs/quality.md (python -m flashtq.eval); the first entry is the default.
  static const std::vector<TqPreset> presets = {
      {"default",
       {3, 0, 0, 3, 4, 64, 64, 0},
       {3, 4, 4, 3, 4, 64, 64, 64},
       false,
       true,
       "keys 3-bit codes (at head_dim > 64 with a quarter of the channels, the outliers, at 4 bits), values 3 "
       "bits, means over blocks of 64 timesteps of the keys (and of the values at head_dim > 64), norm "
       "correction, 4 sink and 64 recent tokens exact: at least 4x against bf16 from 4096 tokens; outliers "
       "chosen by TqKvCache::calibrate"},
      {"quality",
       {4, 0, 0, 3, 4, 64, 64, 0},
       {4, 0, 0, 3, 4, 64, 64, 64},
       false,
       true,
       "keys 4-bit codes, values 3 bits, means over blocks of 64 timesteps of the keys (and of the values at "
       "head_dim > 64), norm correction, 4 sink and 64 recent tokens exact"},
      {"small",
       {2, 2, 4, 2, 4, 20, 0, 0},
       {2, 4, 4, 2, 4, 32, 32, 0},
       false,
       true,
       "keys 2-bit codes with outlier channels at 4 bits (half of the channels at head_dim <= 64, a quarter "
       "above), values 2 bits, norm correction, 4 sink and 20 (32 above 64) recent tokens exact, above 64 means "
       "over blocks of 32 timesteps of the keys: at least 5x against bf16 at 2048 tokens; outliers chosen by "
       "TqKvCache::calibrate"},
      {"seed",
       {2, 0, 0, 2, 0, 0, 0, 0},
       {2, 0, 0, 2, 0, 0, 0, 0},
       true,
       false,
       "the seed kernel's layout: keys 2-bit codes + 1 QJL bit, values 2 bits"},
  };
  return presets;
}

TqLayout tq_preset_layout(const std::string& name, std::int64_t head_dim, std::int64_t n_kv_heads,
                          std::int64_t capacity) try {
  std::string names;
  for (const TqPreset& p : tq_presets()) {
    if (name == p.name) {
      TqLayout l;
      l.head_dim = head_dim;
      l.n_kv_heads = n_kv_heads;
      l.capacity = capacity;
      const TqPreset::Widths& w = head_dim <= 64 ? p.up_to_64 : p.above_64;
      l.key_bits = w.key_bits;
      l.value_bits = w.value_bits;
      l.qjl = p.qjl;
      l.sink_tokens = w.sink_tokens;
      l.recent_tokens = w.recent_tokens;
      l.norm_correction = p.norm_correction;
      l.key_block = w.key_block;
      l.value_block = w.value_block;
      if (w.key_outlier_share) {
        l.key_outliers = std::int32_t(std::max<std::int64_t>(16, head_dim / w.key_outlier_share));
        l.key_outlier_bits = w.key_outlier_bits;
      }
      core::validate_tq_layout(l);
      return l;
    }
    names += (names.empty() ? "" : ", ") + std::string(p.name);
  }
  throw Error("preset", "unknown name '" + name + "' (presets: " + names + ")");
} catch (...) {
  core::rethrow_as_error("preset");
}

}  // namespace flashtq

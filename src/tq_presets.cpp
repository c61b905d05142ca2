// The named TurboQuant presets: the one list the C++ API, the Python package and the conformance suite read.
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
      {"default", 4, 3, 3, false, 4, 32, true,
       "keys 4-bit codes (3-bit at head_dim <= 64), values 3 bits, norm correction, 4 sink and 32 recent tokens "
       "exact: at least 4x against bf16 at 2048 tokens"},
      {"quality", 4, 4, 3, false, 4, 32, true,
       "keys 4-bit codes, values 3 bits, norm correction, 4 sink and 32 recent tokens exact"},
      {"small", 3, 3, 2, false, 4, 16, true,
       "keys 3-bit codes, values 2 bits, norm correction, 4 sink and 16 recent tokens exact: at least 5x"},
      {"seed", 2, 2, 2, true, 0, 0, false, "the seed kernel's layout: keys 2-bit codes + 1 QJL bit, values 2 bits"},
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
      l.key_bits = head_dim <= 64 ? p.key_bits_at_64 : p.key_bits;
      l.value_bits = p.value_bits;
      l.qjl = p.qjl;
      l.sink_tokens = p.sink_tokens;
      l.recent_tokens = p.recent_tokens;
      l.norm_correction = p.norm_correction;
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

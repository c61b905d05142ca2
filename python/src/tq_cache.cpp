// The host TurboQuant cache (flashtq::TqKvCache) for Python: one object per sequence; the package's
// flashtq.TurboQuantCache holds one per batch row so that every sequence keeps its own length.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include <cstdint>
#include <memory>

#include "bindings.hpp"
#include "tq_config.hpp"
#include "flashtq/backend.hpp"
#include "flashtq/error.hpp"
#include "flashtq/turboquant.hpp"

namespace nb = nanobind;

namespace flashtq::python {
void bind_tq_cache(nb::module_& m) {
  m.def("tq_presets", [] {
    nb::list out;
    for (const TqPreset& p : tq_presets()) {
      nb::dict d;
      d["name"] = p.name;
      d["summary"] = p.summary;
      out.append(d);
    }
    return out;
  });
  // A preset's widths for one head_dim (they may depend on it: TqPreset).
  m.def(
      "tq_preset_layout",
      [](const std::string& name, std::int64_t head_dim) {
        nb::dict d;
        TqCacheConfig c;
        c.layout = tq_preset_layout(name, head_dim, 1, 1 << 16);
        put_widths(d, from_library(c));
        return d;
      },
      nb::arg("name"), nb::arg("head_dim"));
  nb::class_<TqKvCache>(m, "TqKvCache")
      .def(
          "__init__",
          [](TqKvCache* self, std::int64_t layers, std::int64_t n_kv_heads, std::int64_t head_dim,
             std::int64_t capacity, int key_bits, int value_bits, std::uint64_t seed, const std::string& backend,
             bool qjl, std::int64_t sink_tokens, std::int64_t recent_tokens, bool norm_correction,
             std::int64_t key_outliers, std::int64_t key_outlier_bits, std::int64_t key_block,
             std::int64_t value_block) {
            new (self) TqKvCache(
                to_library({layers, n_kv_heads, head_dim, capacity, key_bits, value_bits, qjl, seed, sink_tokens,
                            recent_tokens, norm_correction, key_outliers, key_outlier_bits, key_block, value_block}),
                &flashtq::backend(backend));
          },
          nb::arg("layers"), nb::arg("n_kv_heads"), nb::arg("head_dim"), nb::arg("capacity"), nb::arg("key_bits"),
          nb::arg("value_bits"), nb::arg("seed"), nb::arg("backend"), nb::arg("qjl") = true, nb::arg("sink_tokens") = 0,
          nb::arg("recent_tokens") = 0, nb::arg("norm_correction") = false, nb::arg("key_outliers") = 0,
          nb::arg("key_outlier_bits") = 0, nb::arg("key_block") = 0, nb::arg("value_block") = 0)
      .def(
          "append",
          [](TqKvCache& c, std::int64_t layer, const TensorView& k, const TensorView& v, std::int64_t start_pos) {
            nb::gil_scoped_release release;
            c.append(layer, k, v, start_pos);
          },
          nb::arg("layer"), nb::arg("k"), nb::arg("v"), nb::arg("start_pos"))
      .def(
          "calibrate",
          [](TqKvCache& c, std::int64_t layer, const TensorView& keys) {
            nb::gil_scoped_release release;
            c.calibrate(layer, keys);
          },
          nb::arg("layer"), nb::arg("keys"))
      .def(
          "attend",
          [](TqKvCache& c, std::int64_t layer, const TensorView& q, std::int64_t start_pos, const TensorView& out,
             std::int64_t window, bool exact, float softcap, std::uintptr_t sinks) {
            const TqAttendOptions options = attend_options(window, exact, softcap, sinks);
            nb::gil_scoped_release release;
            c.attend(layer, q, start_pos, out, options);
          },
          nb::arg("layer"), nb::arg("q"), nb::arg("start_pos"), nb::arg("out"), nb::arg("window") = 0,
          nb::arg("exact") = false, nb::arg("softcap") = 0.0f, nb::arg("sinks") = 0)
      .def(
          "set_stream", [](TqKvCache& c, std::uintptr_t stream) { c.set_stream(reinterpret_cast<void*>(stream)); },
          nb::arg("stream"))
      .def("length", &TqKvCache::length, nb::arg("layer"))
      .def("bytes_per_token", &TqKvCache::bytes_per_token)
      .def("memory_bytes", &TqKvCache::memory_bytes)
      .def("exact_bytes", &TqKvCache::exact_bytes)
      .def("compression_vs_bf16", [](const TqKvCache& c) { return c.compression_vs_bf16(); })
      .def(
          "compression_vs_bf16_at",
          [](const TqKvCache& c, std::int64_t length) { return c.compression_vs_bf16(length); }, nb::arg("length"))
      .def(
          "key_words", [](const TqKvCache& c, std::int64_t layer) { return words(c.key_words(layer)); },
          nb::arg("layer"))
      .def(
          "value_words", [](const TqKvCache& c, std::int64_t layer) { return words(c.value_words(layer)); },
          nb::arg("layer"))
      .def("config",
           [](const TqKvCache& c) {
             const Config k = from_library(c.config());
             nb::dict d;
             d["layers"] = k.layers;
             d["n_kv_heads"] = k.n_kv_heads;
             d["head_dim"] = k.head_dim;
             d["capacity"] = k.capacity;
             d["seed"] = k.seed;
             put_widths(d, k);
             return d;
           })
      .def("save", &TqKvCache::save, nb::arg("path"))
      .def_static(
          "load",
          [](const std::string& path, const std::string& backend) {
            return std::make_unique<TqKvCache>(TqKvCache::load(path, &flashtq::backend(backend)));
          },
          nb::arg("path"), nb::arg("backend"));
}

}  // namespace flashtq::python

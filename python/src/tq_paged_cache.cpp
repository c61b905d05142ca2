// The paged TurboQuant cache (flashtq::TqPagedCache) for Python: one pool of pages per layer shared by many
// sequences; the package's flashtq.PagedTurboQuantCache wraps it with torch tensors.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <vector>

#include "bindings.hpp"
#include "flashtq/backend.hpp"
#include "flashtq/tq_paged_cache.hpp"
#include "tq_config.hpp"

namespace nb = nanobind;

namespace flashtq::python {

void bind_tq_paged_cache(nb::module_& m) {
  nb::class_<TqPagedCache>(m, "TqPagedCache")
      .def(
          "__init__",
          [](TqPagedCache* self, std::int64_t layers, std::int64_t n_kv_heads, std::int64_t head_dim,
             std::int64_t pages, std::int64_t page_size, std::int64_t max_sequences, int key_bits, int value_bits,
             std::uint64_t seed, const std::string& backend, bool qjl, std::int64_t sink_tokens,
             std::int64_t recent_tokens, bool norm_correction, std::int64_t key_outliers, std::int64_t key_outlier_bits,
             std::int64_t key_block, std::int64_t value_block) {
            if (pages < 1 || page_size < 1 || pages > INT64_MAX / page_size) {
              throw Error("pages", "pages and page_size must be >= 1 and their product fit in 64 bits");
            }
            const TqCacheConfig c = to_library({layers, n_kv_heads, head_dim, pages * page_size, key_bits, value_bits,
                                                qjl, seed, sink_tokens, recent_tokens, norm_correction, key_outliers,
                                                key_outlier_bits, key_block, value_block, page_size, max_sequences});
            new (self) TqPagedCache({c.layers, c.layout, c.seed}, &flashtq::backend(backend));
          },
          nb::arg("layers"), nb::arg("n_kv_heads"), nb::arg("head_dim"), nb::arg("pages"), nb::arg("page_size"),
          nb::arg("max_sequences"), nb::arg("key_bits"), nb::arg("value_bits"), nb::arg("seed"), nb::arg("backend"),
          nb::arg("qjl") = true, nb::arg("sink_tokens") = 0, nb::arg("recent_tokens") = 0,
          nb::arg("norm_correction") = false, nb::arg("key_outliers") = 0, nb::arg("key_outlier_bits") = 0,
          nb::arg("key_block") = 0, nb::arg("value_block") = 0)
      .def("allocate_page", &TqPagedCache::allocate_page)
      .def("free_page", &TqPagedCache::free_page, nb::arg("page"))
      .def("free_pages", &TqPagedCache::free_pages)
      .def("add_sequence", &TqPagedCache::add_sequence)
      .def("map_pages", &TqPagedCache::map_pages, nb::arg("sequence"), nb::arg("pages"))
      .def("fork", &TqPagedCache::fork, nb::arg("sequence"))
      .def("copy_page", &TqPagedCache::copy_page, nb::arg("sequence"), nb::arg("index"), nb::arg("fresh"))
      .def("remove_sequence", &TqPagedCache::remove_sequence, nb::arg("sequence"))
      .def(
          "pages_of", [](const TqPagedCache& c, std::int64_t s) { return c.pages_of(s); }, nb::arg("sequence"))
      .def("length", &TqPagedCache::length, nb::arg("layer"), nb::arg("sequence"))
      .def(
          "append",
          [](TqPagedCache& c, std::int64_t layer, std::int64_t sequence, const TensorView& k, const TensorView& v) {
            nb::gil_scoped_release release;
            c.append(layer, sequence, k, v);
          },
          nb::arg("layer"), nb::arg("sequence"), nb::arg("k"), nb::arg("v"))
      .def(
          "calibrate",
          [](TqPagedCache& c, std::int64_t layer, const TensorView& keys) {
            nb::gil_scoped_release release;
            c.calibrate(layer, keys);
          },
          nb::arg("layer"), nb::arg("keys"))
      .def(
          "attend",
          [](TqPagedCache& c, std::int64_t layer, const std::vector<std::int64_t>& sequences, const TensorView& q,
             const TensorView& out, std::int64_t window, bool exact, float softcap, std::uintptr_t sinks) {
            const TqAttendOptions options = attend_options(window, exact, softcap, sinks);
            nb::gil_scoped_release release;
            c.attend(layer, sequences, q, out, options);
          },
          nb::arg("layer"), nb::arg("sequences"), nb::arg("q"), nb::arg("out"), nb::arg("window") = 0,
          nb::arg("exact") = false, nb::arg("softcap") = 0.0f, nb::arg("sinks") = 0)
      .def(
          "set_stream", [](TqPagedCache& c, std::uintptr_t stream) { c.set_stream(reinterpret_cast<void*>(stream)); },
          nb::arg("stream"))
      .def("memory_bytes", &TqPagedCache::memory_bytes)
      .def(
          "key_words", [](const TqPagedCache& c, std::int64_t layer) { return words(c.key_words(layer)); },
          nb::arg("layer"))
      .def(
          "value_words", [](const TqPagedCache& c, std::int64_t layer) { return words(c.value_words(layer)); },
          nb::arg("layer"));
}

}  // namespace flashtq::python

// The module flashtq._flashtq: errors, backends and the version; the ops live in their own files.
// The Python package (python/flashtq/) wraps these low-level calls; nothing here knows about torch.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings.hpp"
#include "flashtq/backend.hpp"
#include "flashtq/error.hpp"

namespace nb = nanobind;

NB_MODULE(_flashtq, m) {
  m.attr("__version__") = FLASHTQ_VERSION;

  // flashtq::Error becomes FlashTQError (a ValueError: every rejection is about an argument's value)
  // carrying the library's message and its two parts, so callers can tell which argument failed.
  static nb::object error_type = nb::steal(PyErr_NewException("flashtq.FlashTQError", PyExc_ValueError, nullptr));
  m.attr("FlashTQError") = error_type;
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const flashtq::Error& e) {
      nb::object instance = error_type(e.what());
      instance.attr("argument") = e.argument();
      instance.attr("rule") = e.rule();
      PyErr_SetObject(error_type.ptr(), instance.ptr());
    }
  });

  m.def("backends", [] {
    // (name, memory, available, description or why not) for every compiled-in backend.
    std::vector<std::tuple<std::string, std::string, bool, std::string>> list;
    for (flashtq::Backend* b : flashtq::all_backends()) {
      const char* memory = b->memory() == flashtq::Memory::host   ? "host"
                           : b->memory() == flashtq::Memory::cuda ? "cuda"
                                                                  : "webgpu";
      list.emplace_back(b->name(), memory, b->available(), b->available() ? b->description() : b->unavailable_reason());
    }
    return list;
  });
  m.def(
      "set_threads", [](const std::string& backend, int threads) { flashtq::backend(backend).set_threads(threads); },
      nb::arg("backend"), nb::arg("threads"));
  m.def(
      "threads", [](const std::string& backend) { return flashtq::backend(backend).threads(); }, nb::arg("backend"));

  flashtq::python::bind_views(m);
  flashtq::python::bind_dense(m);
  flashtq::python::bind_tq_cache(m);
  flashtq::python::bind_tq_paged_cache(m);
}

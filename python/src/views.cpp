// TensorView from Python: the package builds views from torch tensors (data_ptr, shape, strides),
// so the extension never depends on torch's C++ ABI and the same binary serves every torch version.
#include <nanobind/nanobind.h>
#include <nanobind/stl/array.h>

#include <cstdint>

#include "bindings.hpp"
#include "flashtq/tensor.hpp"

namespace nb = nanobind;

namespace flashtq::python {

void bind_views(nb::module_& m) {
  nb::enum_<DType>(m, "DType").value("f32", DType::f32).value("f16", DType::f16).value("bf16", DType::bf16);
  nb::enum_<Memory>(m, "Memory")
      .value("host", Memory::host)
      .value("cuda", Memory::cuda)
      .value("webgpu", Memory::webgpu);
  nb::class_<TensorView>(m, "TensorView")
      .def(
          "__init__",
          [](TensorView* self, std::uintptr_t data, DType dtype, std::array<std::int64_t, 4> shape,
             std::array<std::int64_t, 4> strides, Memory memory) {
            new (self) TensorView{reinterpret_cast<void*>(data), dtype, shape, strides, memory};
          },
          nb::arg("data"), nb::arg("dtype"), nb::arg("shape"), nb::arg("strides"), nb::arg("memory") = Memory::host)
      .def_prop_ro("data", [](const TensorView& v) { return reinterpret_cast<std::uintptr_t>(v.data); })
      .def_ro("dtype", &TensorView::dtype)
      .def_ro("shape", &TensorView::shape)
      .def_ro("strides", &TensorView::strides)
      .def_ro("memory", &TensorView::memory);
}

}  // namespace flashtq::python

// Dense attention forward and backward on caller-owned memory (pointers come from torch tensors).
// The GIL is released while the backend runs; validation errors surface as FlashTQError.
#include <nanobind/nanobind.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>

#include "bindings.hpp"
#include "flashtq/attention.hpp"
#include "flashtq/backend.hpp"

namespace nb = nanobind;

namespace flashtq::python {
namespace {

// Arguments of AttentionParams, as the Python layer passes them (mask as a pointer, 0 = none).
AttentionParams make_params(std::optional<float> scale, bool causal, std::optional<std::int64_t> causal_offset,
                            std::int64_t window, std::uintptr_t mask, std::array<std::int64_t, 4> mask_strides,
                            std::int64_t mask_elements, float dropout_p, std::uint32_t seed, float softcap,
                            std::uintptr_t sinks) {
  AttentionParams p;
  p.softcap = softcap;
  p.sinks = reinterpret_cast<const float*>(sinks);
  p.scale = scale;
  p.causal = causal;
  p.causal_offset = causal_offset;
  p.window = window;
  p.mask = reinterpret_cast<const float*>(mask);
  p.mask_strides = mask_strides;
  p.mask_elements = mask_elements;
  p.dropout_p = dropout_p;
  p.seed = seed;
  return p;
}

}  // namespace

void bind_dense(nb::module_& m) {
  m.def(
      "forward",
      [](const std::string& backend, const TensorView& q, const TensorView& k, const TensorView& v,
         const TensorView& out, std::uintptr_t lse, std::optional<float> scale, bool causal,
         std::optional<std::int64_t> causal_offset, std::int64_t window, std::uintptr_t mask,
         std::array<std::int64_t, 4> mask_strides, std::int64_t mask_elements, float dropout_p, std::uint32_t seed,
         float softcap, std::uintptr_t sinks, std::uintptr_t stream) {
        Backend& be = flashtq::backend(backend);
        const AttentionParams p = make_params(scale, causal, causal_offset, window, mask, mask_strides, mask_elements,
                                              dropout_p, seed, softcap, sinks);
        nb::gil_scoped_release release;
        attention_forward(be, {q, k, v, out, reinterpret_cast<float*>(lse), reinterpret_cast<void*>(stream)}, p);
      },
      nb::arg("backend"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"),
      nb::arg("scale").none(), nb::arg("causal"), nb::arg("causal_offset").none(), nb::arg("window"), nb::arg("mask"),
      nb::arg("mask_strides"), nb::arg("mask_elements"), nb::arg("dropout_p"), nb::arg("seed"), nb::arg("softcap"),
      nb::arg("sinks"), nb::arg("stream"));
  m.def(
      "backward",
      [](const std::string& backend, const TensorView& q, const TensorView& k, const TensorView& v,
         const TensorView& out, const TensorView& dout, std::uintptr_t lse, const TensorView& dq, const TensorView& dk,
         const TensorView& dv, std::optional<float> scale, bool causal, std::optional<std::int64_t> causal_offset,
         std::int64_t window, std::uintptr_t mask, std::array<std::int64_t, 4> mask_strides, std::int64_t mask_elements,
         float dropout_p, std::uint32_t seed, float softcap, std::uintptr_t sinks, std::uintptr_t dsinks,
         std::uintptr_t stream) {
        Backend& be = flashtq::backend(backend);
        const AttentionParams p = make_params(scale, causal, causal_offset, window, mask, mask_strides, mask_elements,
                                              dropout_p, seed, softcap, sinks);
        nb::gil_scoped_release release;
        attention_backward(be,
                           {q, k, v, out, dout, reinterpret_cast<const float*>(lse), dq, dk, dv,
                            reinterpret_cast<void*>(stream), reinterpret_cast<float*>(dsinks)},
                           p);
      },
      nb::arg("backend"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("dout"), nb::arg("lse"),
      nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("scale").none(), nb::arg("causal"),
      nb::arg("causal_offset").none(), nb::arg("window"), nb::arg("mask"), nb::arg("mask_strides"),
      nb::arg("mask_elements"), nb::arg("dropout_p"), nb::arg("seed"), nb::arg("softcap"), nb::arg("sinks"),
      nb::arg("dsinks"), nb::arg("stream"));
}

}  // namespace flashtq::python

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

// A ragged batch (batch > 0) and paged keys (page_table != 0), as pointers to host int32 arrays.
void add_layout(AttentionParams& p, std::int64_t batch, std::uintptr_t cu_q, std::uintptr_t cu_k, std::int64_t max_q,
                std::int64_t max_k, std::uintptr_t page_table, std::int64_t max_pages, std::uintptr_t seq_lens_k,
                Memory tables = Memory::host) {
  if (batch > 0) {
    p.varlen = Varlen{
        batch,  reinterpret_cast<const std::int32_t*>(cu_q), reinterpret_cast<const std::int32_t*>(cu_k), max_q, max_k,
        nullptr};
  }
  if (page_table != 0) {
    p.paged = PagedKv{reinterpret_cast<const std::int32_t*>(page_table), max_pages,
                      reinterpret_cast<const std::int32_t*>(seq_lens_k), tables};
  }
}

// The workspace a call asks for (`bytes`, from the call's *_workspace_bytes query), from the caller's allocator:
// workspace(n) returns the address of n bytes in the tensors' memory that stay alive until the call has run.
void* allocated(const std::optional<nb::callable>& workspace, std::size_t bytes) {
  return workspace && bytes > 0 ? reinterpret_cast<void*>(nb::cast<std::uintptr_t>((*workspace)(bytes))) : nullptr;
}

}  // namespace

void bind_dense(nb::module_& m) {
  m.def(
      "forward",
      [](const std::string& backend, const TensorView& q, const TensorView& k, const TensorView& v,
         const TensorView& out, std::uintptr_t lse, std::optional<float> scale, bool causal,
         std::optional<std::int64_t> causal_offset, std::int64_t window, std::uintptr_t mask,
         std::array<std::int64_t, 4> mask_strides, std::int64_t mask_elements, float dropout_p, std::uint32_t seed,
         float softcap, std::uintptr_t sinks, std::int64_t batch, std::uintptr_t cu_q, std::uintptr_t cu_k,
         std::int64_t max_q, std::int64_t max_k, std::uintptr_t page_table, std::int64_t max_pages,
         std::uintptr_t seq_lens_k, std::uintptr_t stream, bool tables_on_device,
         std::optional<nb::callable> workspace) {
        Backend& be = flashtq::backend(backend);
        AttentionParams p = make_params(scale, causal, causal_offset, window, mask, mask_strides, mask_elements,
                                        dropout_p, seed, softcap, sinks);
        add_layout(p, batch, cu_q, cu_k, max_q, max_k, page_table, max_pages, seq_lens_k,
                   tables_on_device ? be.memory() : Memory::host);
        ForwardArgs args{q, k, v, out, reinterpret_cast<float*>(lse), reinterpret_cast<void*>(stream)};
        // The workspace the fastest plan asks for (a decode's split keys).
        if (workspace) {
          args.workspace_bytes = attention_forward_workspace_bytes(be, args, p);
          args.workspace = allocated(workspace, args.workspace_bytes);
        }
        nb::gil_scoped_release release;
        attention_forward(be, args, p);
      },
      nb::arg("backend"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"),
      nb::arg("scale").none(), nb::arg("causal"), nb::arg("causal_offset").none(), nb::arg("window"), nb::arg("mask"),
      nb::arg("mask_strides"), nb::arg("mask_elements"), nb::arg("dropout_p"), nb::arg("seed"), nb::arg("softcap"),
      nb::arg("sinks"), nb::arg("batch"), nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k"), nb::arg("max_seqlen_q"),
      nb::arg("max_seqlen_k"), nb::arg("page_table"), nb::arg("max_pages"), nb::arg("seq_lens_k"), nb::arg("stream"),
      nb::arg("tables_on_device") = false, nb::arg("workspace").none() = nb::none());
  m.def(
      "backward",
      [](const std::string& backend, const TensorView& q, const TensorView& k, const TensorView& v,
         const TensorView& out, const TensorView& dout, std::uintptr_t lse, const TensorView& dq, const TensorView& dk,
         const TensorView& dv, std::optional<float> scale, bool causal, std::optional<std::int64_t> causal_offset,
         std::int64_t window, std::uintptr_t mask, std::array<std::int64_t, 4> mask_strides, std::int64_t mask_elements,
         float dropout_p, std::uint32_t seed, float softcap, std::uintptr_t sinks, std::uintptr_t dsinks,
         std::int64_t batch, std::uintptr_t cu_q, std::uintptr_t cu_k, std::int64_t max_q, std::int64_t max_k,
         std::uintptr_t stream, std::optional<nb::callable> workspace) {
        Backend& be = flashtq::backend(backend);
        AttentionParams p = make_params(scale, causal, causal_offset, window, mask, mask_strides, mask_elements,
                                        dropout_p, seed, softcap, sinks);
        add_layout(p, batch, cu_q, cu_k, max_q, max_k, 0, 0, 0);
        BackwardArgs args{q,
                          k,
                          v,
                          out,
                          dout,
                          reinterpret_cast<const float*>(lse),
                          dq,
                          dk,
                          dv,
                          reinterpret_cast<void*>(stream),
                          reinterpret_cast<float*>(dsinks)};
        // The rows' scratch the backend asks for.
        if (workspace) {
          args.workspace_bytes = attention_backward_workspace_bytes(be, args, p);
          args.workspace = allocated(workspace, args.workspace_bytes);
        }
        nb::gil_scoped_release release;
        attention_backward(be, args, p);
      },
      nb::arg("backend"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("dout"), nb::arg("lse"),
      nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("scale").none(), nb::arg("causal"),
      nb::arg("causal_offset").none(), nb::arg("window"), nb::arg("mask"), nb::arg("mask_strides"),
      nb::arg("mask_elements"), nb::arg("dropout_p"), nb::arg("seed"), nb::arg("softcap"), nb::arg("sinks"),
      nb::arg("dsinks"), nb::arg("batch"), nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k"), nb::arg("max_seqlen_q"),
      nb::arg("max_seqlen_k"), nb::arg("stream"), nb::arg("workspace").none() = nb::none());
  m.def(
      "paged_kv_append",
      [](const std::string& backend, const TensorView& k_pages, const TensorView& v_pages, std::uintptr_t page_table,
         std::int64_t max_pages, std::uintptr_t seq_lens_k, const TensorView& k, const TensorView& v,
         std::uintptr_t stream, bool tables_on_device) {
        Backend& be = flashtq::backend(backend);
        const PagedKv pages{reinterpret_cast<const std::int32_t*>(page_table), max_pages,
                            reinterpret_cast<const std::int32_t*>(seq_lens_k),
                            tables_on_device ? be.memory() : Memory::host};
        nb::gil_scoped_release release;
        paged_kv_append(be, {k_pages, v_pages, pages, k, v, reinterpret_cast<void*>(stream)});
      },
      nb::arg("backend"), nb::arg("k_pages"), nb::arg("v_pages"), nb::arg("page_table"), nb::arg("max_pages"),
      nb::arg("seq_lens_k"), nb::arg("k"), nb::arg("v"), nb::arg("stream"), nb::arg("tables_on_device") = false);
}

}  // namespace flashtq::python

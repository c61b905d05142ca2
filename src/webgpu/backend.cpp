// The `webgpu` backend: the WGSL kernels of src/webgpu/shaders on a WebGPU device (Vulkan here,
// Metal or D3D12 elsewhere), through wgpu-native. Memory is the backend's own (allocate/upload/
// download); every operation validates where its views lie and passes element offsets and strides
// to the kernels. Calls are queued in order; download() and synchronize() wait for them.
#include "webgpu/backend.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <optional>

#include "core/tq_norm_rule.hpp"
#include "core/tq_outliers.hpp"
#include "core/tq_rows.hpp"
#include "core/validate.hpp"
#include "flashtq/error.hpp"
#include "webgpu/context.hpp"

namespace flashtq::webgpu {
namespace {

// The uniform block of a dispatch, field by field (every field 4 bytes, in declaration order).
class Params {
 public:
  Params& u(std::int64_t x, const char* what = "value") {
    if (x < 0 || x > std::int64_t(std::numeric_limits<std::uint32_t>::max())) {
      throw Error(what, std::to_string(x) + " does not fit the webgpu kernels' 32-bit indices");
    }
    words_.push_back(std::uint32_t(x));
    return *this;
  }
  Params& i(std::int64_t x, const char* what = "value") {
    if (x < std::numeric_limits<std::int32_t>::min() || x > std::numeric_limits<std::int32_t>::max()) {
      throw Error(what, std::to_string(x) + " does not fit in 32 bits");
    }
    words_.push_back(std::uint32_t(std::int32_t(x)));
    return *this;
  }
  Params& f(float x) {
    words_.push_back(std::bit_cast<std::uint32_t>(x));
    return *this;
  }
  const std::vector<std::uint32_t>& words() const { return words_; }
  std::size_t size() const { return words_.size(); }
  void set(std::size_t at, std::uint32_t x) { words_[at] = x; }

 private:
  std::vector<std::uint32_t> words_;
};

// A strided view in device memory: its buffer and element offset.
struct Placed {
  void* buffer = nullptr;
  std::int64_t offset = 0;  // elements from the start of the buffer
};

std::int64_t extent_elements(const TensorView& t) {
  std::int64_t last = 0;
  for (int d = 0; d < 4; ++d) last += (t.shape[std::size_t(d)] - 1) * t.strides[std::size_t(d)];
  return last + 1;
}

Placed place(const void* data, std::int64_t elements, std::size_t element_bytes, const char* what) {
  const Location at = Context::get().locate(data, std::uint64_t(elements) * element_bytes, what);
  if (at.offset % element_bytes != 0) throw Error(what, "is not aligned to its element size");
  return {at.buffer, std::int64_t(at.offset / element_bytes)};
}

Placed place(const TensorView& t, const char* what) {
  return place(t.data, extent_elements(t), dtype_size(t.dtype), what);
}

// WebGPU lets a writable binding share its buffer with no other binding of a dispatch. An output
// whose buffer also holds an input, or an earlier output (tensors packed in one allocation), is
// computed in a scratch copy of its byte range (copied in first, so the bytes between a strided
// view's elements keep their values) and copied back after the dispatch.
class Outputs {
 public:
  explicit Outputs(std::vector<void*> inputs) : taken_(std::move(inputs)) {}
  Placed add(const Placed& out, std::int64_t elements, std::size_t element_bytes) {
    const bool shared = std::find(taken_.begin(), taken_.end(), out.buffer) != taken_.end();
    taken_.push_back(out.buffer);
    if (!shared) return out;
    Context& ctx = Context::get();
    const std::uint64_t first = std::uint64_t(out.offset) * element_bytes;
    const std::uint64_t begin = first & ~std::uint64_t(3);
    const std::uint64_t end = (first + std::uint64_t(elements) * element_bytes + 3) & ~std::uint64_t(3);
    void* scratch = ctx.scratch(kFirstSlot + int(back_.size()), end - begin);
    ctx.copy(out.buffer, begin, scratch, 0, end - begin);
    back_.push_back({scratch, out.buffer, begin, end - begin});
    return {scratch, std::int64_t((first - begin) / element_bytes)};
  }
  // After the dispatches: the redirected outputs back into place.
  void finish() {
    for (const auto& b : back_) Context::get().copy(b.scratch, 0, b.buffer, b.offset, b.bytes);
  }

 private:
  static constexpr int kFirstSlot = 8;  // scratch slots below are the operations' own
  struct Back {
    void* scratch;
    void* buffer;
    std::uint64_t offset, bytes;
  };
  std::vector<void*> taken_;
  std::vector<Back> back_;
};

int dtype_code(DType t) { return t == DType::f32 ? 0 : t == DType::f16 ? 1 : 2; }

std::uint32_t groups(std::int64_t n, std::int64_t per) { return std::uint32_t((n + per - 1) / per); }

// Dispatches `total` workgroups along dimension `dim` (0, 1 or 2) in chunks the adapter allows,
// telling the kernel each chunk's first index in parameter word `first_at`.
void dispatch_chunked(const std::string& kernel, Params P, std::size_t first_at, const std::vector<Binding>& buffers,
                      std::array<std::int64_t, 3> grid, int dim) {
  Context& ctx = Context::get();
  const std::int64_t total = grid[std::size_t(dim)], step = ctx.max_groups_per_dimension();
  for (std::int64_t first = 0; first < total; first += step) {
    std::array<std::int64_t, 3> g = grid;
    g[std::size_t(dim)] = std::min(step, total - first);
    P.set(first_at, std::uint32_t(first));
    ctx.dispatch(kernel, P.words(), buffers, std::uint32_t(g[0]), std::uint32_t(g[1]), std::uint32_t(g[2]));
  }
}

// The dense kernel `shader` for a problem: the variant built for its head_dim where there is one (the common
// sizes), else the generic one, wide past head_dim 256 (each thread holds up to 512 of a row).
std::string dense_variant(const std::string& shader, const DenseProblem& p) {
  if (p.D == 64 || p.D == 128 || p.D == 256) return shader + "@d" + std::to_string(p.D);
  return p.D > 256 ? shader + "@wide" : shader;
}

// The forward's kernels (dense_forward.wgsl): `tiled` (32 rows of a workgroup against tiles of 32 keys, 16-bit
// elements in workgroup memory) for 16-bit inputs at head_dim 64 and 128, else `main` (64 rows, one a thread).
enum class ForwardKernel { tiled, rows };

// Whether the kernels' subgroup variants can run: the device has subgroups of at least `lanes` invocations (the
// kernels reduce over `lanes` neighbouring invocations by shuffles, taking a subgroup's lanes in invocation order,
// as Vulkan, Metal and D3D12 drivers lay out a one-dimensional workgroup).
bool subgroups_of_at_least(std::uint32_t lanes) { return Context::get().subgroup_lanes() >= lanes; }

ForwardKernel choose_forward(const DenseProblem& p) {
  const bool half = p.dtype == DType::f16 || p.dtype == DType::bf16;
  return half && (p.D == 64 || p.D == 128) ? ForwardKernel::tiled : ForwardKernel::rows;
}

// Keys (or query rows) per workgroup-memory tile: 512 vec4 per operand.
std::int64_t tile_rows(std::int64_t D) { return std::min<std::int64_t>(64, 2048 / D); }

// The dense kernels' common fields: shapes and flags, then q, k, v (offset and three strides each).
Params dense_params(const DenseProblem& p) {
  Params P;
  P.u(p.B).u(p.Sq).u(p.Sk).u(p.H).u(p.Hkv).u(p.D).u(dtype_code(p.dtype)).u(p.causal ? 1 : 0);
  P.f(p.scale).i(p.causal_offset, "causal_offset").i(p.window, "window").u(p.mask ? 1 : 0);
  P.f(p.dropout_p).u(p.seed);
  return P;
}

void add_view(Params& P, const Placed& at, const TensorView& t, const char* what) {
  P.u(at.offset, what).u(t.strides[0], what).u(t.strides[1], what).u(t.strides[2], what);
}

// The sinks (docs/spec.md §1.9), H logits; without them the read-only dummy (shared with a missing mask's).
Placed place_sinks(const DenseProblem& p) {
  if (!p.sinks) return {Context::get().dummy_buffer(0), 0};
  return place(p.sinks, p.H, 4, "sinks");
}

Placed place_mask(const DenseProblem& p, const RaggedTable& r) {
  if (!p.mask) return {Context::get().dummy_buffer(0), 0};
  if (p.packed) return place(p.mask, r.mask_elements, 4, "mask");  // each sequence's reach was checked
  std::int64_t last = 0;
  const std::int64_t dims[4] = {p.B, p.H, p.Sq, p.Sk};
  for (int d = 0; d < 4; ++d) last += (dims[d] - 1) * p.mask_strides[std::size_t(d)];
  return place(p.mask, last + 1, 4, "mask");
}

// Where the dense kernels find each sequence (binding TABLE, docs/spec.md §1.6-§1.7): layout 0 is the padded
// [B, S, heads, D] batch (no table); 1 a ragged batch, words [cu_seqlens_q | cu_seqlens_k | mask offsets]; 2 paged
// keys, words [page_table | seq_lens_k]. The host tables were checked whole by the validator.
struct SequenceTable {
  std::uint32_t layout = 0;
  std::vector<std::uint32_t> words;
};

// The paged layout's words for B sequences (the forward's and the append's).
SequenceTable paged_table(std::int64_t B, const PagedTable& t) {
  SequenceTable s{2, {}};
  for (std::int64_t e = 0; e < B * t.max_pages; ++e) s.words.push_back(std::uint32_t(t.page_table[e]));
  for (std::int64_t b = 0; b < B; ++b) s.words.push_back(std::uint32_t(t.seq_lens_k[b]));
  return s;
}

SequenceTable sequence_table(const DenseProblem& p, const RaggedTable& r, const PagedTable& t) {
  SequenceTable s;
  if (p.packed) {
    s.layout = 1;
    for (const std::int32_t* cu : {r.cu_seqlens_q, r.cu_seqlens_k})
      for (std::int64_t b = 0; b <= p.B; ++b) s.words.push_back(std::uint32_t(cu[b]));
    for (std::int64_t b = 0; b < p.B; ++b) {
      const std::int64_t at = r.mask_offsets != nullptr ? r.mask_offsets[b] : 0;
      if (at > std::int64_t(std::numeric_limits<std::uint32_t>::max()))
        throw Error("mask_offsets", std::to_string(at) + " does not fit the webgpu kernels' 32-bit indices");
      s.words.push_back(std::uint32_t(at));
    }
  } else if (p.paged) {
    s = paged_table(p.B, t);
  }
  return s;
}

// The table's buffer (scratch slot 2), or the read-only dummy without one.
void* place_table(const SequenceTable& s) {
  return s.layout == 0 ? Context::get().dummy_buffer(0) : Context::get().scratch_holding(2, s.words);
}

// The table's fields of the dense kernels' parameters: layout, whether causal offsets count from each sequence's
// end, page size, the table's row length (max_pages), and the packed rows (lse is [H, Tq] in a ragged batch).
void add_table(Params& P, const SequenceTable& s, const DenseProblem& p, const RaggedTable& r, const PagedTable& t) {
  P.u(s.layout)
      .u(p.packed  ? r.offset_from_end
         : p.paged ? t.offset_from_end
                   : false)
      .u(p.paged ? t.page_size : 1, "page_size")
      .u(p.paged ? t.max_pages : 0, "max_pages")
      .u(p.packed ? r.total_q : 0, "cu_seqlens_q");
}

// Elements of the lse: [B, H, Sq], or [H, Tq] for a ragged batch.
std::int64_t lse_elements(const DenseProblem& p, const RaggedTable& r) {
  return p.packed ? p.H * r.total_q : p.B * p.H * p.Sq;
}

void add_mask(Params& P, const DenseProblem& p, const Placed& mask) {
  P.u(mask.offset, "mask")
      .u(p.mask_strides[0], "mask_strides")
      .u(p.mask_strides[1], "mask_strides")
      .u(p.mask_strides[2], "mask_strides")
      .u(p.mask_strides[3], "mask_strides");
}

class WebGpuBackend final : public Backend {
 public:
  std::string name() const override { return "webgpu"; }
  std::string description() const override {
    return Context::usable() ? Context::get().adapter_description() : "no adapter";
  }
  Memory memory() const override { return Memory::webgpu; }
  std::string last_kernel() const override { return last_kernel_; }
  Memory page_table_memory() const override { return Memory::host; }
  bool available() const override { return Context::usable(); }
  std::string unavailable_reason() const override { return Context::unusable_reason(); }
  std::optional<std::string> unsupported(const DenseProblem& p) const override {
    if (p.D % 4 != 0) return "the webgpu kernels need head_dim a multiple of 4";
    // Mesa's llvmpipe (lavapipe) ends every loop of a shader invocation once that invocation has run
    // 65535 loop iterations in all (gallivm's loop limiter): past it the dense kernels would leave
    // outputs silently unwritten, so such problems are refused there. An invocation walks one query
    // row's keys (forward, dq) or one key's rows of every head of its group (dk, dv), about 2 D/4 + 4
    // iterations each, plus its tiles' loads.
    // A ragged batch's sequences were each checked as a call of their own (core/varlen.cpp).
    if (!p.packed && Context::usable() && Context::get().adapter_description().find("llvmpipe") != std::string::npos) {
      const std::int64_t iterations = std::max(p.Sk, p.group() * p.Sq) * (2 * (p.D / 4) + 4) + 4096;
      if (iterations > 65535) {
        return "on llvmpipe (lavapipe), which stops a shader invocation's loops after 65535 iterations, the dense "
               "kernels take at most about " +
               std::to_string(61439 / (2 * (p.D / 4) + 4)) +
               " keys per query row and query rows (times the GQA group) per key at this head_dim";
      }
    }
    return std::nullopt;
  }
  std::optional<std::string> unsupported(const TqLayout& l) const override {
    if (l.head_dim > 256) return "the webgpu TurboQuant kernels take head_dim up to 256";
    return std::nullopt;
  }

  void* allocate(std::size_t bytes) override { return Context::get().allocate(bytes); }
  void release(void* ptr) override {
    if (Context::usable()) Context::get().release(ptr);
  }
  void upload(void* dst, const void* src, std::size_t bytes) override { Context::get().upload(dst, src, bytes); }
  void download(void* dst, const void* src, std::size_t bytes) override { Context::get().download(dst, src, bytes); }
  void synchronize() override { Context::get().wait_idle(); }

  void forward(const ForwardCall& c) override {
    const DenseProblem& p = c.p;
    Context& ctx = Context::get();
    const Placed q = place(c.q, "q"), k = place(c.k, "k"), v = place(c.v, "v"), mask = place_mask(p, c.ragged),
                 sinks = place_sinks(p);
    const SequenceTable table = sequence_table(p, c.ragged, c.table);
    void* table_buffer = place_table(table);
    Outputs outputs({q.buffer, k.buffer, v.buffer, mask.buffer, sinks.buffer, table_buffer});
    const Placed out = outputs.add(place(c.out, "out"), extent_elements(c.out), dtype_size(c.out.dtype));
    Placed lse{ctx.dummy_buffer(1), 0};
    const std::int64_t lse_n = lse_elements(p, c.ragged);
    if (c.lse) lse = outputs.add(place(c.lse, lse_n, 4, "lse"), lse_n, 4);
    Params P = dense_params(p);
    P.u(c.lse ? 1 : 0).u(tile_rows(p.D));
    add_view(P, q, c.q, "q");
    add_view(P, k, c.k, "k");
    add_view(P, v, c.v, "v");
    add_view(P, out, c.out, "out");
    add_mask(P, p, mask);
    P.u(lse.offset, "lse").f(p.softcap).u(p.sinks ? 1 : 0).u(sinks.offset, "sinks");
    const std::size_t y0 = P.size();
    P.u(0);
    add_table(P, table, p, c.ragged, c.table);
    const ForwardKernel kernel = choose_forward(p);
    const bool tiled = kernel == ForwardKernel::tiled;
    last_kernel_ = !tiled                     ? "dense_forward_rows"
                   : subgroups_of_at_least(8) ? "dense_forward_tiled_subgroups"
                                              : "dense_forward_tiled";
    const std::string shader =
        dense_variant("dense_forward", p) + (tiled ? std::string(p.dtype == DType::f16 ? "+f16" : "+bf16") +
                                                         (subgroups_of_at_least(8) ? "+subgroups" : "") + "#tiled"
                                                   : "");
    dispatch_chunked(
        shader, P, y0,
        {{q.buffer}, {k.buffer}, {v.buffer}, {mask.buffer}, {out.buffer}, {lse.buffer}, {sinks.buffer}, {table_buffer}},
        {groups(p.Sq, tiled ? 32 : 64), p.B * p.H, 1}, 1);
    outputs.finish();
  }

  void backward(const BackwardCall& c) override {
    const DenseProblem& p = c.p;
    Context& ctx = Context::get();
    const Placed q = place(c.q, "q"), k = place(c.k, "k"), v = place(c.v, "v"), out = place(c.out, "out"),
                 dout = place(c.dout, "dout"), mask = place_mask(p, c.ragged), sinks = place_sinks(p);
    const std::int64_t lse_n = lse_elements(p, c.ragged);
    const Placed lse = place(c.lse, lse_n, 4, "lse");
    // delta_i = <dout_i, out_i> per row (laid out as lse), computed by the dq kernel for the dk/dv kernel.
    void* delta = ctx.scratch(0, std::uint64_t(lse_n) * 4);
    const SequenceTable table = sequence_table(p, c.ragged, PagedTable{});
    void* table_buffer = place_table(table);
    Outputs outputs({q.buffer, k.buffer, v.buffer, out.buffer, dout.buffer, lse.buffer, mask.buffer, delta,
                     sinks.buffer, table_buffer});
    const Placed dq = outputs.add(place(c.dq, "dq"), extent_elements(c.dq), dtype_size(c.dq.dtype));
    const Placed dk = outputs.add(place(c.dk, "dk"), extent_elements(c.dk), dtype_size(c.dk.dtype));
    const Placed dv = outputs.add(place(c.dv, "dv"), extent_elements(c.dv), dtype_size(c.dv.dtype));
    Params P = dense_params(p);
    P.u(tile_rows(p.D)).u(lse.offset, "lse");
    add_view(P, q, c.q, "q");
    add_view(P, k, c.k, "k");
    add_view(P, v, c.v, "v");
    add_view(P, out, c.out, "out");
    add_view(P, dout, c.dout, "dout");
    add_view(P, dq, c.dq, "dq");
    add_view(P, dk, c.dk, "dk");
    add_view(P, dv, c.dv, "dv");
    add_mask(P, p, mask);
    const std::size_t y0 = P.size();
    P.u(0).f(p.softcap);
    add_table(P, table, p, c.ragged, PagedTable{});
    // Both entry points bind the same inputs (bindings 1-8), then their own outputs (9, 10), then the table (11).
    const std::vector<Binding> inputs = {{q.buffer},    {k.buffer},   {v.buffer},    {out.buffer},
                                         {dout.buffer}, {lse.buffer}, {mask.buffer}, {delta}};
    auto with = [&](std::initializer_list<Binding> outs) {
      std::vector<Binding> all = inputs;
      all.insert(all.end(), outs);
      if (all.size() == inputs.size() + 1) all.push_back({nullptr});  // dq leaves binding 10 out
      all.push_back({table_buffer});
      return all;
    };
    // The tiled kernels for 16-bit inputs at head_dim 64 and 128 (dq: 32 rows a workgroup; dk, dv: 16 keys), else a
    // row (a key) a thread.
    const bool tiled = choose_forward(p) == ForwardKernel::tiled;  // the same dtypes and head_dims
    last_kernel_ = tiled ? "dense_backward_tiled" : "dense_backward_rows";
    const std::string shader =
        dense_variant("dense_backward", p) + (tiled ? (p.dtype == DType::f16 ? "+f16" : "+bf16") : "");
    dispatch_chunked(shader + (tiled ? "#dq_tiled" : "#dq"), P, y0, with({{dq.buffer}}),
                     {groups(p.Sq, tiled ? 32 : 64), p.B * p.H, 1}, 1);
    dispatch_chunked(shader + (tiled ? "#dkdv_tiled" : "#dkdv"), P, y0, with({{dk.buffer}, {dv.buffer}}),
                     {groups(p.Sk, tiled ? 16 : 64), p.B * p.Hkv, 1}, 1);
    if (c.dsinks) {  // from the delta the dq kernel wrote; a ragged batch's [H, Tq] rows as one sequence
      const Placed dsinks = outputs.add(place(c.dsinks, p.H, 4, "dsinks"), p.H, 4);
      Params S;
      S.u(p.packed ? 1 : p.B)
          .u(p.packed ? c.ragged.total_q : p.Sq)
          .u(p.H)
          .u(lse.offset, "lse")
          .u(sinks.offset, "sinks")
          .u(dsinks.offset, "dsinks");
      const std::size_t h0 = S.size();
      S.u(0).u(0);
      dispatch_chunked("dense_sinks_grad", S, h0, {{lse.buffer}, {delta}, {sinks.buffer}, {dsinks.buffer}}, {p.H, 1, 1},
                       0);
    }
    outputs.finish();
  }

  bool appends_pages() const override { return true; }
  void paged_append(const PagedAppendCall& c) override {
    const PagedTable& t = c.table;
    const std::int64_t B = c.k.shape[0], T = c.k.shape[1], Hkv = c.k.shape[2];
    const Placed k = place(c.k, "k"), v = place(c.v, "v");
    void* table = place_table(paged_table(B, t));
    Outputs outputs({k.buffer, v.buffer, table});
    const Placed kp = outputs.add(place(c.k_pages, "k_pages"), extent_elements(c.k_pages), dtype_size(c.k.dtype));
    const Placed vp = outputs.add(place(c.v_pages, "v_pages"), extent_elements(c.v_pages), dtype_size(c.k.dtype));
    Params P;
    P.u(B).u(T).u(Hkv).u(c.k.shape[3]).u(dtype_code(c.k.dtype)).u(t.page_size).u(t.max_pages, "max_pages");
    const std::size_t y0 = P.size();
    P.u(0);
    add_view(P, kp, c.k_pages, "k_pages");
    add_view(P, vp, c.v_pages, "v_pages");
    add_view(P, k, c.k, "k");
    add_view(P, v, c.v, "v");
    dispatch_chunked("paged_append", P, y0, {{k.buffer}, {v.buffer}, {table}, {kp.buffer}, {vp.buffer}},
                     {B * T * Hkv, 1, 1}, 0);
    outputs.finish();
  }

  void tq_encode(const TqEncodeCall& c) override;
  std::optional<TqRowNorm> tq_unstorable_row(const TqEncodeCall& c) const override;
  void tq_rotate_queries(const TqRotateCall& c) override;
  void tq_attend(const TqAttendCall& c) override;
  std::size_t tq_attend_workspace(const TqAttendCall& c) const override;

 private:
  static thread_local const char* last_kernel_;  // of this thread's last forward, backward or tq_attend
  // The chunked prefill's dense output (bf16 [rows, H, D], rotated space): an allocation of its own, so that the
  // dense forward writes no buffer it reads; grown as needed, one prefill at a time.
  std::mutex prefill_mutex_;
  void* prefill_out_ = nullptr;
  std::size_t prefill_out_bytes_ = 0;
};

thread_local const char* WebGpuBackend::last_kernel_ = "";

// ---- TurboQuant ----

// A double as two floats (hi + lo), for the encoder's double-float arithmetic.
void add_double(Params& P, double x) {
  const float hi = float(x);
  P.f(hi).f(float(x - double(hi)));
}

// The parts a side is coded in (_tq_parts.wgsl): keys with outlier channels have TqLayout's, every other
// side one part of head_dim coordinates at its width.
std::vector<TqLayout::KeyPart> coded_parts(const TqLayout& l, bool keys) {
  if (!keys) return {{0, std::int32_t(l.head_dim), l.value_bits, 0}};
  std::vector<TqLayout::KeyPart> parts;
  for (int p = 0; p < l.key_parts(); ++p) parts.push_back(l.key_part(p));
  return parts;
}

// The kernels' part table: core::kMaxKeyParts entries (offset, size, bits, bit_offset), zeros after the last.
void add_parts(Params& P, const std::vector<TqLayout::KeyPart>& parts) {
  for (std::size_t p = 0; p < std::size_t(core::kMaxKeyParts); ++p) {
    const TqLayout::KeyPart kp = p < parts.size() ? parts[p] : TqLayout::KeyPart{0, 0, 0, 0};
    P.u(kp.offset).u(kp.size).u(kp.bits).u(kp.bit_offset);
  }
}

// Centroids and boundaries in double-float (16 + 16 entries, the unused ones zero).
void add_codebook(Params& P, const TqCodebook& cb) {
  for (int i = 0; i < 16; ++i) add_double(P, i < cb.levels ? cb.centroids[std::size_t(i)] : 0.0);
  for (int i = 0; i < 16; ++i) add_double(P, i < cb.levels - 1 ? cb.boundaries[std::size_t(i)] : 0.0);
}

constexpr std::int64_t kSplitTokens = 256;  // timesteps per workgroup of the attention kernel, at least
constexpr std::int64_t kHeadsPerGroup = 4;  // query heads of one kv head a workgroup serves (tq_attend.wgsl)
constexpr std::int64_t kPrefillSteps = 8;   // timesteps a prefill_rows workgroup decodes (PREFILL_STEPS)
// The split-K parts' workspace, at most: many rows fill the GPU with few splits each, and a part per 256
// timesteps of 2048 rows over 32k would be 4 GB, past what adapters bind. FLASHTQ_WEBGPU_SPLIT_WORKSPACE_BYTES
// sets another bound (tests reach the longer splits with small problems through it).
std::int64_t split_workspace_bytes() {
  const char* env = std::getenv("FLASHTQ_WEBGPU_SPLIT_WORKSPACE_BYTES");
  return env != nullptr ? std::max<std::int64_t>(1, std::atoll(env)) : std::int64_t(128) << 20;
}

// The attention kernel's split of each row's timesteps: 256 a workgroup, doubled while the parts would
// exceed split_workspace_bytes() and a split's key blocks fit the kernel's 33 block-mean dots (tq_attend.wgsl).
struct SplitPlan {
  std::int64_t splits, tokens;
};
SplitPlan split_plan(const TqAttendCall& c) {
  const TqLayout& l = c.layout();
  const std::int64_t part_bytes = c.rows() * c.n_heads * (l.head_dim + 2) * 4;
  const std::int64_t longest_split = l.key_block > 0 ? 32 * std::int64_t(l.key_block) : c.longest_row;
  std::int64_t tokens = kSplitTokens;
  auto splits = [&] { return std::max<std::int64_t>(1, (c.longest_row + tokens - 1) / tokens); };
  while (2 * tokens <= longest_split && tokens < c.longest_row && splits() * part_bytes > split_workspace_bytes())
    tokens *= 2;
  return {splits(), tokens};
}

// The encoder's modes (tq_encode.wgsl): rows of x into their slots; rows of x into the exact rows of a
// side with block means (the `rows` scratch); residuals of those rows minus their block means.
enum class EncodeMode { rows = 0, exact_rows = 1, residuals = 2 };

// What one encode call's dispatches share: its views, and with block means the exact rows of timesteps
// [first, first + n_rows) of each kv head (head-major, bf16), which the means and residuals read.
struct EncodeSpan {
  Placed x, cache;
  void* rows = nullptr;
  std::int64_t first = 0, n_rows = 0;
};

// A pool's encode (docs/turboquant_layout.md, "Pages"; the table is on the host, checked by core): the sequence's
// exact set's first row, relative to the exact region, and how far timestep u's slot is from u (mod 2^32).
std::int64_t exact_set_words(const TqEncodeCall& c) {
  if (!c.layout().paged()) return 0;
  return c.layout().exact_row_at(c.pages.exact_sets ? c.pages.exact_sets[0] : 0, 0, 0);
}
std::uint32_t moved(const TqEncodeCall& c, std::int64_t u) { return std::uint32_t(c.sequence().timestep(u) - u); }

// Runs of consecutive indices [from, from + count) that lie in one page of `page` of them (the whole range for
// page 0): f(first, n) for each.
template <typename F>
void by_page(std::int64_t page, std::int64_t from, std::int64_t count, F&& f) {
  for (std::int64_t u = from, n = 0; u < from + count; u += n) {
    n = from + count - u;
    if (page > 0) n = std::min<std::int64_t>(n, page - u % page);
    f(u, n);
  }
}

// The encoder over `count` rows in `mode`: rows of x (from row 0) or residuals of `rows` rows (from row 0); in a
// pool, one dispatch per page the rows' timesteps lie in.
void dispatch_encode(const TqEncodeCall& c, const EncodeSpan& s, EncodeMode mode, std::int64_t count) {
  const bool keys = c.keys;
  const TqLayout& l = c.layout();
  const std::int64_t D = l.head_dim;
  const std::int32_t g = l.mean_block(keys);
  const std::vector<TqLayout::KeyPart> parts = coded_parts(l, keys);
  Params P;
  // `qjl` means keys with the QJL sketch: MSE-only keys are coded as values are, with their own codebook.
  P.u(D).u(l.n_kv_heads).u(l.capacity).u(keys && l.qjl ? 1 : 0);
  P.u(dtype_code(c.x.dtype)).u(c.start_pos).u(c.tokens());
  const std::size_t t0 = P.size();
  P.u(0);
  add_view(P, s.x, c.x, "x");
  P.u(s.cache.offset, "cache")
      .u(keys ? l.key_code_words() : l.value_code_words())
      .u(l.key_jl_offset(), "cache")
      .u(keys ? l.key_norm_offset() : l.value_norm_offset(), "cache");
  P.u((keys ? l.key_exact_offset() : l.value_exact_offset()) + exact_set_words(c), "cache")
      .u(l.sink_tokens)
      .u(l.recent_tokens)
      .u(l.norm_correction ? 1 : 0);
  P.u(int(mode)).u(std::int64_t(parts.size())).u(keys ? l.key_outliers : 0).u(l.key_mask_offset(), "cache");
  P.u(keys ? l.key_norm_words() : 1)
      .u(keys ? l.key_mean_offset() : l.value_mean_offset(), "cache")
      .u(l.mean_blocks(g), "cache")
      .u(g);
  P.u(c.start_pos - s.first, "rows").u(s.n_rows, "rows").f(1.0f).u(0);  // the kernel's opaque 1.0
  const std::size_t page_at = P.size();
  P.u(0).u(0).u(0).u(0);  // row_base, moved: per dispatch below
  for (int i = 0; i < 8; ++i) P.u(c.tables.polar_sign_bits[std::size_t(i)]);
  for (int i = 0; i < 8; ++i) P.u(c.tables.jl_sign_bits[std::size_t(i)]);
  add_parts(P, parts);
  for (std::size_t p = 0; p < std::size_t(core::kMaxKeyParts); ++p) {  // 1 / sqrt(size), sqrt(size / D)
    const double size = p < parts.size() ? double(parts[p].size) : 0.0;
    add_double(P, size > 0 ? 1.0 / std::sqrt(size) : 0.0);
    add_double(P, std::sqrt(size / double(D)));
  }
  add_codebook(P, keys ? c.tables.key_codebook : c.tables.value_codebook);
  add_codebook(P, c.tables.outlier_codebook);
  void* rows = s.rows ? s.rows : Context::get().dummy_buffer(1);
  // Row t's timestep: start_pos + t, or first + t for residuals; the exact rows of mode 1 go to `rows` alone.
  const std::int64_t first = mode == EncodeMode::residuals ? s.first : c.start_pos;
  by_page(mode == EncodeMode::exact_rows ? 0 : l.page_size, first, count, [&](std::int64_t u, std::int64_t n) {
    P.set(page_at, std::uint32_t(u - first));
    P.set(page_at + 1, moved(c, u));
    dispatch_chunked("tq_encode", P, t0, {{s.x.buffer}, {s.cache.buffer}, {rows}}, {n, l.n_kv_heads, 1}, 0);
  });
}

// Block means (core::tq_encode_head_with_means, docs/turboquant_layout.md): the exact rows of the timesteps
// that leave the recent window in this call, [first, stop), and of the call's own rows are gathered in a
// scratch (the old ones copied from the exact region, the new ones computed by the encoder); then the means
// of the blocks that start there, the residuals' codes, and last the new rows' exact copies, after the codes
// have read the rows they replace.
void encode_with_means(const TqEncodeCall& c, EncodeSpan s) {
  Context& ctx = Context::get();
  const TqLayout& l = c.layout();
  const std::int64_t g = l.mean_block(c.keys), w = l.recent_tokens, L = c.start_pos, end = L + c.tokens();
  const std::int64_t H = l.n_kv_heads, row_words = l.exact_row_words();
  s.first = std::max<std::int64_t>(0, L - w);
  s.n_rows = end - s.first;
  const std::int64_t stop = std::max(s.first, end - w);
  s.rows = ctx.scratch(1, std::uint64_t(H * s.n_rows * row_words) * 4);
  const std::int64_t exact =
      s.cache.offset + (c.keys ? l.key_exact_offset() : l.value_exact_offset()) + exact_set_words(c);
  // Copies the exact rows of timesteps [from, to) of a sequence of `seq_end` between the exact region and
  // the scratch, run by run of consecutive rows.
  auto copy_rows = [&](std::int64_t from, std::int64_t to, std::int64_t seq_end, bool into_scratch) {
    for (std::int64_t h = 0; h < H; ++h) {
      for (std::int64_t u = from, n = 1; u < to; u += n) {
        const std::int64_t row = l.exact_row(u, seq_end);
        n = 1;
        if (row < 0) continue;
        while (u + n < to && l.exact_row(u + n, seq_end) == row + n) ++n;
        const std::uint64_t region = std::uint64_t(exact + l.exact_row_at(0, h, row)) * 4;
        const std::uint64_t scratch = std::uint64_t((h * s.n_rows + u - s.first) * row_words) * 4;
        const std::uint64_t bytes = std::uint64_t(n * row_words) * 4;
        if (into_scratch) {
          ctx.copy(s.cache.buffer, region, s.rows, scratch, bytes);
        } else {
          ctx.copy(s.rows, scratch, s.cache.buffer, region, bytes);
        }
      }
    }
  };
  copy_rows(s.first, L, L, true);
  dispatch_encode(c, s, EncodeMode::exact_rows, c.tokens());
  const std::int64_t first_block = (s.first + g - 1) / g, end_block = (stop + g - 1) / g;
  if (end_block > first_block) {  // in a pool, one dispatch per page the blocks lie in (a block lies in one)
    by_page(l.page_size / g, first_block, end_block - first_block, [&](std::int64_t b, std::int64_t n) {
      Params P;
      P.u(l.head_dim).u(s.n_rows, "rows").u(g).u(s.first, "rows");
      P.u(b, "blocks");
      const std::size_t b0 = P.size();
      P.u(0).u(s.cache.offset, "cache").u(c.keys ? l.key_mean_offset() : l.value_mean_offset(), "cache");
      const std::int64_t blocks_moved = (c.sequence().timestep(b * g) - b * g) / g;  // a page holds whole blocks
      P.u(l.mean_blocks(std::int32_t(g)), "cache").f(1.0f).u(std::uint32_t(blocks_moved)).u(0);
      dispatch_chunked("tq_means", P, b0, {{s.rows}, {s.cache.buffer}}, {n, H, 1}, 0);
    });
  }
  if (stop > s.first) dispatch_encode(c, s, EncodeMode::residuals, stop - s.first);
  copy_rows(L, end, end, false);
}

void WebGpuBackend::tq_encode(const TqEncodeCall& c) {
  const TqLayout& l = c.layout();
  const Placed x = place(c.x, "x");
  Outputs outputs({x.buffer});
  const std::int64_t cache_words = c.keys ? l.key_words() : l.value_words();
  const Placed cache = outputs.add(place(c.cache, cache_words, 4, "cache"), cache_words, 4);
  const EncodeSpan span{x, cache};
  if (core::tq_encode_uses_block_means(c)) {
    encode_with_means(c, span);
  } else {
    dispatch_encode(c, span, EncodeMode::rows, c.tokens());
  }
  outputs.finish();
}

// The rows are read back and checked on the host, with the oracle's arithmetic (the norm rule's
// margin absorbs what the encoder's double-float rounds differently): a wait for the queue and a copy
// of x, where a check shader would copy one word; encodes are rarer than attention, and this keeps
// one implementation of the rule.
std::optional<TqRowNorm> WebGpuBackend::tq_unstorable_row(const TqEncodeCall& c) const {
  const std::int64_t elements = extent_elements(c.x);
  place(c.x, "x");  // an x that is not this backend's memory is named as such, not as download's src
  const std::size_t bytes = std::size_t(elements) * dtype_size(c.x.dtype);
  std::vector<std::uint32_t> host((bytes + 3) / 4);
  Context::get().download(host.data(), c.x.data, bytes);
  TqEncodeCall on_host = c;
  on_host.x.data = host.data();
  on_host.x.memory = Memory::host;
  // Keys with outlier channels: each part's half must fit, which depends on the heads' masks.
  std::vector<std::uint32_t> masks(std::size_t(c.keys ? c.layout().key_mask_words() : 0));
  if (!masks.empty()) {
    Context::get().download(masks.data(), c.cache + c.layout().key_mask_offset(), masks.size() * 4);
  }
  return core::first_unstorable_row(on_host, masks.empty() ? nullptr : masks.data());
}

void WebGpuBackend::tq_rotate_queries(const TqRotateCall& c) {
  const TqScratchLayout& s = c.scratch_layout;
  const TqLayout& l = c.tables.layout;
  const std::int64_t D = s.head_dim, B = c.q.shape[0], nq = c.q.shape[1], H = s.n_heads;
  const Placed q = place(c.q, "q");
  // With outlier channels the kv heads' masks in the keys order the channels; else no keys are read.
  Placed keys{Context::get().dummy_buffer(0), 0};
  const std::int64_t key_stride = l.paged() ? 0 : l.key_words();  // a pool's masks are the pool's, shared
  if (l.key_outliers) keys = place(c.k_cache, (l.paged() ? 1 : B) * l.key_words(), 4, "k_cache");
  Outputs outputs({q.buffer, keys.buffer});
  const std::int64_t scratch_floats = s.floats();
  const Placed scratch = outputs.add(place(c.scratch, scratch_floats, 4, "scratch"), scratch_floats, 4);
  Params P;
  P.u(D).u(nq).u(H).u(dtype_code(c.q.dtype)).u(s.region(), "q_cap").u(scratch.offset, "scratch");
  const std::size_t row0 = P.size();
  P.u(0).u(l.n_kv_heads);
  add_view(P, q, c.q, "q");
  P.u(l.key_parts()).u(l.key_outliers).u(keys.offset, "k_cache").u(key_stride, "k_cache");
  P.u(l.key_mask_offset(), "k_cache").u(0).u(0).u(0);
  for (int i = 0; i < 8; ++i) P.u(c.tables.polar_sign_bits[std::size_t(i)]);
  for (int i = 0; i < 8; ++i) P.u(c.tables.jl_sign_bits[std::size_t(i)]);
  add_parts(P, coded_parts(l, true));
  dispatch_chunked("tq_rotate", P, row0, {{q.buffer}, {scratch.buffer}, {keys.buffer}}, {B * nq, H, 1}, 0);
  outputs.finish();
}

// The chunked prefill (TurboQuant attention's bf16-class path for many query rows, docs/spec.md §3): the rows'
// rotated queries and every timestep they see turned into bf16 rows once (tq_attend.wgsl's prefill_* entries),
// the dense forward over them (causal, its offset and window placing row j at start_pos + j), each output row
// rotated back. It serves calls of at least kPrefillMinRows rows of one start position whose rows the cache does
// not clamp, and not an exact call; the dense problem must be one the backend takes (llvmpipe's loop limit).
constexpr std::int64_t kPrefillMinRows = 64;

struct PrefillPlan {
  DenseProblem p;
  std::int64_t first = 0;                       // the first timestep any row sees
  std::int64_t q = 0, k = 0, v = 0, words = 0;  // the workspace's pieces (words): queries, keys, values; in all
};

std::optional<PrefillPlan> prefill_plan(const Backend& b, const TqAttendCall& c) {
  if (c.exact || c.start_positions != nullptr || c.n_queries < kPrefillMinRows) return std::nullopt;
  if (c.sequence_end(c.start_pos) != c.start_pos + c.n_queries) return std::nullopt;
  const TqLayout& l = c.layout();
  PrefillPlan plan;
  plan.first = c.first_visible(c.start_pos);
  DenseProblem& p = plan.p;
  p.B = c.batch, p.Sq = c.n_queries, p.Sk = c.start_pos + c.n_queries - plan.first;
  p.H = c.n_heads, p.Hkv = l.n_kv_heads, p.D = l.head_dim;
  p.dtype = DType::bf16;
  p.scale = c.scale;
  p.causal = true;
  p.causal_offset = c.start_pos - plan.first;
  p.window = c.window;
  p.softcap = c.softcap;  // the rotation keeps every <q, k>: the dense kernels cap and sink the same scores
  p.sinks = c.sinks;
  if (b.unsupported(p)) return std::nullopt;
  const std::int64_t pair_rows = c.rows() * p.H * p.D / 2, pair_keys = p.B * p.Sk * p.Hkv * p.D / 2;
  plan.q = 0, plan.k = pair_rows, plan.v = plan.k + pair_keys, plan.words = plan.v + pair_keys;
  return plan;
}

std::size_t WebGpuBackend::tq_attend_workspace(const TqAttendCall& c) const {
  const std::size_t split_k = std::size_t(c.rows() * c.n_heads * split_plan(c).splits * (c.layout().head_dim + 2));
  const std::optional<PrefillPlan> plan = prefill_plan(*this, c);
  return std::max<std::size_t>(split_k, plan ? std::size_t(plan->words) : 0) * sizeof(float);
}

void WebGpuBackend::tq_attend(const TqAttendCall& c) {
  last_kernel_ = subgroups_of_at_least(32) ? "tq_attend_grouped_subgroups" : "tq_attend_grouped";
  Context& ctx = Context::get();
  const TqLayout& l = c.layout();
  const std::int64_t D = l.head_dim, rows = c.rows();
  const auto [splits, split_tokens] = split_plan(c);
  const Placed scratch = place(c.scratch, c.scratch_layout.floats(), 4, "scratch");
  const std::int64_t images = l.paged() ? 1 : c.batch;  // a pool is one image, shared
  const Placed keys = place(c.k_cache, images * l.key_words(), 4, "k_cache");
  const Placed values = place(c.v_cache, images * l.value_words(), 4, "v_cache");
  // A pool's table (on the host, checked by core): each sequence's pages, then its exact set.
  void* pages = ctx.dummy_buffer(1);
  if (l.paged()) {
    std::vector<std::uint32_t> words(std::size_t(c.batch * c.pages.max_pages), 0u);
    std::copy(c.pages.pages, c.pages.pages + words.size(), words.begin());
    for (std::int64_t b = 0; b < c.batch; ++b) words.push_back(std::uint32_t(c.sequence(b).exact_set));
    pages = ctx.scratch_holding(3, words);
  }
  Placed starts{ctx.dummy_buffer(0), 0}, sinks{ctx.dummy_buffer(0), 0};
  if (c.start_positions) starts = place(c.start_positions, c.batch, 4, "start_positions");
  if (c.sinks) sinks = place(c.sinks, c.n_heads, 4, "sinks");
  Outputs outputs({scratch.buffer, keys.buffer, values.buffer, starts.buffer, sinks.buffer});
  const std::int64_t ws_floats = std::int64_t(tq_attend_workspace(c) / 4);
  const Placed ws = outputs.add(place(c.workspace, ws_floats, 4, "workspace"), ws_floats, 4);
  const Placed out = outputs.add(place(c.out, "out"), extent_elements(c.out), 4);
  Params P;
  P.u(D).u(l.n_kv_heads).u(l.capacity).u(l.key_bits).u(l.value_bits).u(c.n_heads).u(c.n_queries).u(c.batch);
  P.i(c.start_pos, "start_pos")
      .i(std::min<std::int64_t>(c.max_seq, std::numeric_limits<std::int32_t>::max()), "max_seq")
      .u(c.start_positions ? 1 : 0)
      .u(starts.offset, "start_positions");
  P.f(c.scale).f(c.qjl_scale).u(splits).u(split_tokens);
  P.u(scratch.offset, "scratch")
      .u(c.scratch_layout.region(), "q_cap")
      .u(keys.offset, "k_cache")
      .u(values.offset, "v_cache");
  P.u(l.paged() ? 0 : l.key_words(), "k_cache")
      .u(l.paged() ? 0 : l.value_words(), "v_cache")
      .u(l.key_jl_offset(), "k_cache")
      .u(l.key_norm_offset(), "k_cache");
  P.u(l.value_norm_offset(), "v_cache").u(ws.offset, "workspace").u(out.offset, "out").u(c.out.strides[0], "out");
  P.u(c.out.strides[1], "out").u(c.out.strides[2], "out");
  const std::size_t row0 = P.size();
  P.u(0).u(c.window, "window");
  P.u(l.qjl ? 1 : 0).u(l.sink_tokens).u(l.recent_tokens).u(l.exact_rows(), "exact rows");
  P.u(l.key_exact_offset(), "k_cache").u(l.value_exact_offset(), "v_cache").u(l.key_code_words()).u(l.key_norm_words());
  P.u(l.key_parts()).u(l.key_outliers ? 1 : 0).u(l.key_block).u(l.value_block);
  P.u(l.key_mean_offset(), "k_cache")
      .u(l.value_mean_offset(), "v_cache")
      .u(l.mean_blocks(l.key_block), "k_cache")
      .u(l.mean_blocks(l.value_block), "v_cache");
  P.f(c.softcap).u(c.sinks ? 1 : 0).u(sinks.offset, "sinks").u(l.exact_sets, "exact_sets");
  std::uint32_t page_shift = 0;
  while (l.paged() && (std::int64_t(1) << page_shift) < l.page_size) ++page_shift;
  P.u(l.paged() ? 1 : 0).u(page_shift).u(l.paged() ? c.pages.max_pages : 0, "max_pages").u(c.reach, "reach");
  const std::int64_t group = c.n_heads / l.n_kv_heads, head_chunks = (group + kHeadsPerGroup - 1) / kHeadsPerGroup;
  // The prefill, where it serves and its workspace shares no buffer with the call's other views (its rows are read
  // back by the dense forward from where they lie).
  const std::optional<PrefillPlan> plan = prefill_plan(*this, c);
  const bool prefill = plan && ws.buffer == place(c.workspace, 1, 4, "workspace").buffer;
  const std::size_t pf_at = P.size();
  P.u(group).u(head_chunks).u(prefill ? plan->first : 0, "start_pos").u(prefill ? plan->p.Sk : 0, "start_pos");
  P.u(prefill ? ws.offset + plan->q : 0, "workspace").u(0);
  P.u(prefill ? ws.offset + plan->k : 0, "workspace").u(prefill ? ws.offset + plan->v : 0, "workspace");
  for (int i = 0; i < 8; ++i) P.u(c.tables.polar_sign_bits[std::size_t(i)]);
  for (int i = 0; i < 8; ++i) P.u(c.tables.jl_sign_bits[std::size_t(i)]);
  add_parts(P, coded_parts(l, true));
  for (int i = 0; i < 16; ++i) P.f(c.tables.key_centroids[std::size_t(i)]);
  for (int i = 0; i < 16; ++i) P.f(c.tables.value_centroids[std::size_t(i)]);
  for (int i = 0; i < 16; ++i) P.f(c.tables.outlier_centroids[std::size_t(i)]);
  if (prefill) {
    last_kernel_ = "tq_attend_prefill";
    const std::int64_t pairs = rows * c.n_heads * D / 2;
    dispatch_chunked(
        "tq_attend#prefill_queries", P, row0,
        {{scratch.buffer}, {nullptr}, {nullptr}, {nullptr}, {nullptr}, {nullptr}, {nullptr}, {nullptr}, {ws.buffer}},
        {groups(pairs, 128), 1, 1}, 0);
    dispatch_chunked(
        "tq_attend#prefill_rows", P, row0,
        {{nullptr}, {keys.buffer}, {values.buffer}, {nullptr}, {nullptr}, {nullptr}, {nullptr}, {pages}, {ws.buffer}},
        {groups(plan->p.Sk, kPrefillSteps), c.batch * l.n_kv_heads, 1}, 0);
    std::lock_guard<std::mutex> lock(prefill_mutex_);
    const std::size_t o_bytes = std::size_t(pairs) * 4;
    if (prefill_out_bytes_ < o_bytes) {
      if (prefill_out_) ctx.release(prefill_out_);
      prefill_out_ = ctx.allocate(o_bytes);
      prefill_out_bytes_ = o_bytes;
    }
    ForwardCall f(core::Validator::stamp());
    f.p = plan->p;
    auto* rows_at = static_cast<std::uint32_t*>(c.workspace);
    f.q = TensorView::bshd(rows_at + plan->q, DType::bf16, f.p.B, f.p.Sq, f.p.H, f.p.D, Memory::webgpu);
    f.k = TensorView::bshd(rows_at + plan->k, DType::bf16, f.p.B, f.p.Sk, f.p.Hkv, f.p.D, Memory::webgpu);
    f.v = TensorView::bshd(rows_at + plan->v, DType::bf16, f.p.B, f.p.Sk, f.p.Hkv, f.p.D, Memory::webgpu);
    f.out = TensorView::bshd(prefill_out_, DType::bf16, f.p.B, f.p.Sq, f.p.H, f.p.D, Memory::webgpu);
    forward(f);
    last_kernel_ = "tq_attend_prefill";
    const Placed o = place(f.out, "prefill output");
    P.set(pf_at + 5, std::uint32_t(o.offset / 2));  // pf_o: words (the allocation's rows start on a word)
    dispatch_chunked(
        "tq_attend#prefill_finish", P, row0,
        {{nullptr}, {nullptr}, {nullptr}, {nullptr}, {nullptr}, {out.buffer}, {nullptr}, {nullptr}, {o.buffer}},
        {c.n_heads, rows, 1}, 1);
    outputs.finish();
    return;
  }
  dispatch_chunked(
      subgroups_of_at_least(32) ? "tq_attend@subgroups#partial" : "tq_attend#partial", P, row0,
      {{scratch.buffer}, {keys.buffer}, {values.buffer}, {starts.buffer}, {ws.buffer}, {nullptr}, {nullptr}, {pages}},
      {splits, l.n_kv_heads * head_chunks, rows}, 2);
  dispatch_chunked("tq_attend#merge", P, row0,
                   {{nullptr}, {nullptr}, {nullptr}, {nullptr}, {ws.buffer}, {out.buffer}, {sinks.buffer}},
                   {c.n_heads, rows, 1}, 1);
  outputs.finish();
}

}  // namespace

std::unique_ptr<Backend> make_backend() { return std::make_unique<WebGpuBackend>(); }

}  // namespace flashtq::webgpu

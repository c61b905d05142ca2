#include "core/validate.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "core/checked.hpp"
#include "core/tq_norm_rule.hpp"
#include "flashtq/error.hpp"

namespace flashtq {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
  }
  return "?";
}

namespace core {
namespace {

constexpr std::int64_t kInt32Max = std::numeric_limits<std::int32_t>::max();
constexpr std::int64_t kInt32Min = std::numeric_limits<std::int32_t>::min();
constexpr std::int64_t kMaxHeadDim = 512;        // dense attention (docs/spec.md §1)
constexpr std::int64_t kMaxTqHeadDim = 256;      // TurboQuant: the kernels' tables and shared arrays
constexpr std::int64_t kMaxExactTokens = 65536;  // sink or recent timesteps kept exact

const char* memory_name(Memory m) {
  switch (m) {
    case Memory::host: return "host";
    case Memory::cuda: return "cuda";
    case Memory::webgpu: return "webgpu";
  }
  return "?";
}

std::string shape_text(const std::array<std::int64_t, 4>& s) {
  return "[" + std::to_string(s[0]) + ", " + std::to_string(s[1]) + ", " + std::to_string(s[2]) + ", " +
         std::to_string(s[3]) + "]";
}

}  // namespace

void check_pointer(const std::string& name, const void* ptr, std::size_t alignment) {
  if (ptr == nullptr) throw Error(name, "must not be null");
  if (reinterpret_cast<std::uintptr_t>(ptr) % alignment != 0) {
    throw Error(name, "must be aligned to " + std::to_string(alignment) + " bytes");
  }
}

// Checks one view: memory kind, pointer, dims, strides, and that its extent fits in 64 bits.
void check_view(const std::string& name, const TensorView& t, const Backend& backend) {
  if (t.memory != backend.memory()) {
    throw Error(name, std::string("lives in ") + memory_name(t.memory) + " memory but backend '" + backend.name() +
                          "' works on " + memory_name(backend.memory()) + " memory");
  }
  if (t.dtype != DType::f32 && t.dtype != DType::f16 && t.dtype != DType::bf16) {
    throw Error(name, "dtype " + std::to_string(int(t.dtype)) + " is not a DType (f32, f16 or bf16)");
  }
  check_pointer(name, t.data, dtype_size(t.dtype));
  if (auto why = backend.foreign_pointer(t.data)) throw Error(name, *why);
  for (int d = 0; d < 4; ++d) {
    if (t.shape[d] < 1) throw Error(name, "every dimension must be >= 1, got shape " + shape_text(t.shape));
  }
  if (t.strides[3] != 1) throw Error(name, "the last (head_dim) stride must be 1");
  std::int64_t last = 0;
  for (int d = 0; d < 3; ++d) {
    if (t.strides[d] < 0 || (t.strides[d] == 0 && t.shape[d] > 1)) {
      throw Error(name, "strides must be positive (0 only for a dimension of size 1)");
    }
    last = checked_add(last, checked_mul(t.shape[d] - 1, t.strides[d], name), name);
  }
  last = checked_add(last, t.shape[3], name);
  checked_mul(last, std::int64_t(dtype_size(t.dtype)), name);
}

namespace {

// docs/spec.md §1.8: 0 turns it off; a negative, infinite or NaN cap has no meaning.
float checked_softcap(float softcap) {
  if (!(softcap >= 0.0f && std::isfinite(softcap))) throw Error("softcap", "must be finite and >= 0 (0 = no softcap)");
  return softcap;
}

// docs/spec.md §1.9: `heads` (named `heads_name`) f32 sink logits, each finite or -inf (no sink).
const float* checked_sinks(const Backend& backend, const float* sinks, std::int64_t heads, const char* heads_name) {
  if (sinks == nullptr) return nullptr;
  check_pointer("sinks", sinks, alignof(float));
  if (auto why = backend.foreign_pointer(sinks)) throw Error("sinks", *why);
  // Host memory is read here; a device backend's sinks are the caller's to keep in range.
  if (backend.memory() == Memory::host) {
    for (std::int64_t h = 0; h < heads; ++h) {
      const float s = sinks[h];
      if (std::isnan(s) || s == std::numeric_limits<float>::infinity()) {
        throw Error("sinks", "sinks[" + std::to_string(h) + "] is " + std::to_string(s) + ": each of the " +
                                 heads_name + " sink logits must be finite or -inf (no sink)");
      }
    }
  }
  return sinks;
}

void check_shape(const std::string& name, const TensorView& t, const std::array<std::int64_t, 4>& want,
                 const std::string& why) {
  if (t.shape != want) {
    throw Error(name, "shape " + shape_text(t.shape) + " must be " + shape_text(want) + " (" + why + ")");
  }
}

void check_dtype(const std::string& name, const TensorView& t, DType want) {
  if (t.dtype != want) {
    throw Error(name, std::string("dtype ") + dtype_name(t.dtype) + " must equal q's dtype " + dtype_name(want));
  }
}

DenseProblem resolve_problem(const Backend& backend, const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& out, const AttentionParams& params) {
  check_view("q", q, backend);
  check_view("k", k, backend);
  check_view("v", v, backend);
  check_view("out", out, backend);
  DenseProblem p;
  p.B = q.shape[0];
  p.Sq = q.shape[1];
  p.H = q.shape[2];
  p.D = q.shape[3];
  p.Sk = k.shape[1];
  p.Hkv = k.shape[2];
  p.dtype = q.dtype;
  check_shape("k", k, {p.B, p.Sk, p.Hkv, p.D}, "batch and head_dim of q");
  check_shape("v", v, k.shape, "same as k");
  check_shape("out", out, q.shape, "same as q");
  check_dtype("k", k, q.dtype);
  check_dtype("v", v, q.dtype);
  check_dtype("out", out, q.dtype);
  if (p.D > kMaxHeadDim) throw Error("q", "head_dim " + std::to_string(p.D) + " must be in [1, 512]");
  if (p.H % p.Hkv != 0) {
    throw Error("k", "query heads (" + std::to_string(p.H) + ") must be a multiple of kv heads (" +
                         std::to_string(p.Hkv) + ")");
  }
  if (p.Sq > kInt32Max || p.Sk > kInt32Max) throw Error("q", "sequence lengths must fit in int32");
  if (checked_mul(p.B, p.H, "q") > kInt32Max) throw Error("q", "batch * heads must fit in int32");

  p.scale = params.scale.value_or(float(1.0 / std::sqrt(double(p.D))));
  if (!std::isfinite(p.scale)) throw Error("scale", "must be finite");
  p.causal = params.causal;
  p.causal_offset = params.causal_offset.value_or(p.Sk - p.Sq);
  // Positions i + causal_offset, i in [0, Sq), must be int32s: the first is causal_offset and the last
  // causal_offset + Sq - 1, written so that neither bound overflows (Sq is at most 2^31 - 1 here).
  if (p.causal_offset < kInt32Min || p.causal_offset > kInt32Max - (p.Sq - 1)) {
    throw Error("causal_offset", "query positions row + causal_offset (row in [0, Sq)) must lie in [-2^31, 2^31 - 1]");
  }
  if (params.window < 0 || params.window > kInt32Max) {
    throw Error("window", "must be in [0, 2^31 - 1] (0 = no window)");
  }
  p.window = params.window;
  if (!(params.dropout_p >= 0.0f && params.dropout_p < 1.0f)) {
    throw Error("dropout_p", "must be in [0, 1)");
  }
  p.dropout_p = params.dropout_p;
  p.seed = params.seed;
  p.tf32 = params.allow_tf32 && p.dtype == DType::f32;
  p.pedantic = params.pedantic_f32 && !p.tf32 && p.dtype == DType::f32;

  if (params.mask != nullptr) {
    check_pointer("mask", params.mask, alignof(float));
    const std::array<std::int64_t, 4> extent{p.B, p.H, p.Sq, p.Sk};
    std::int64_t last = 0;
    for (int d = 0; d < 4; ++d) {
      if (params.mask_strides[d] < 0) throw Error("mask_strides", "must be >= 0 (0 broadcasts)");
      last = checked_add(last, checked_mul(extent[d] - 1, params.mask_strides[d], "mask_strides"), "mask_strides");
    }
    if (params.mask_elements <= last) {
      throw Error("mask_elements", "mask of " + std::to_string(params.mask_elements) +
                                       " elements is too small for its strides (needs " +
                                       std::to_string(std::uint64_t(last) + 1) + ")");
    }
    p.mask = params.mask;
    p.mask_strides = params.mask_strides;
  }
  p.paged = params.paged.has_value();
  p.packed = params.varlen.has_value();  // the ragged batch as one call (core/varlen.cpp, device backends)
  p.softcap = checked_softcap(params.softcap);
  p.sinks = checked_sinks(backend, params.sinks, p.H, "H");
  if (auto why = backend.unsupported(p)) throw Error("backend", backend.name() + ": " + *why);
  return p;
}

// An optional scratch of the caller's (ForwardArgs or BackwardArgs::workspace) into the call: 16-byte aligned, in the
// backend's memory. Its size is the backend's to weigh (a smaller one means a plan that needs less).
template <typename Args, typename Call>
void take_workspace(const Backend& backend, const Args& a, Call& c) {
  if (a.workspace == nullptr) return;
  check_pointer("workspace", a.workspace, 16);
  if (auto why = backend.foreign_pointer(a.workspace)) throw Error("workspace", *why);
  c.workspace = a.workspace;
  c.workspace_bytes = a.workspace_bytes;
}

}  // namespace

ForwardCall validate_forward(const Backend& backend, const ForwardArgs& a, const AttentionParams& params) {
  ForwardCall c(Validator::stamp());
  c.p = resolve_problem(backend, a.q, a.k, a.v, a.out, params);
  if (a.lse != nullptr) {
    check_pointer("lse", a.lse, alignof(float));
    checked_mul(checked_mul(c.p.B, c.p.H, "lse"), c.p.Sq, "lse");
  }
  c.q = a.q;
  c.k = a.k;
  c.v = a.v;
  c.out = a.out;
  c.lse = a.lse;
  c.stream = a.stream;
  take_workspace(backend, a, c);
  return c;
}

BackwardCall validate_backward(const Backend& backend, const BackwardArgs& a, const AttentionParams& params) {
  BackwardCall c(Validator::stamp());
  c.p = resolve_problem(backend, a.q, a.k, a.v, a.out, params);
  const std::pair<const char*, const TensorView*> grads[] = {
      {"dout", &a.dout}, {"dq", &a.dq}, {"dk", &a.dk}, {"dv", &a.dv}};
  const TensorView* like[] = {&a.out, &a.q, &a.k, &a.v};
  for (int i = 0; i < 4; ++i) {
    check_view(grads[i].first, *grads[i].second, backend);
    check_shape(grads[i].first, *grads[i].second, like[i]->shape, "gradient shaped like its tensor");
    check_dtype(grads[i].first, *grads[i].second, a.q.dtype);
  }
  check_pointer("lse", a.lse, alignof(float));
  if (a.dsinks != nullptr) {
    if (c.p.sinks == nullptr) throw Error("dsinks", "is the gradient of params.sinks, which is not given");
    check_pointer("dsinks", a.dsinks, alignof(float));
    if (auto why = backend.foreign_pointer(a.dsinks)) throw Error("dsinks", *why);
  }
  c.dsinks = a.dsinks;
  c.q = a.q;
  c.k = a.k;
  c.v = a.v;
  c.out = a.out;
  c.dout = a.dout;
  c.dq = a.dq;
  c.dk = a.dk;
  c.dv = a.dv;
  c.lse = a.lse;
  c.stream = a.stream;
  take_workspace(backend, a, c);
  return c;
}

std::int64_t check_tq_page_table(const Backend& backend, const TqLayout& l, const TqPageTable& t, std::int64_t batch) {
  if (!l.paged()) {
    if (t.pages != nullptr || t.exact_sets != nullptr) {
      throw Error("pages", "a page table needs a pooled layout (page_size > 0); this one is contiguous");
    }
    return l.capacity;
  }
  check_pointer("pages", t.pages, alignof(std::int32_t));
  if (t.tables != backend.page_table_memory()) {
    throw Error("pages", backend.name() + " reads page tables in " +
                             (backend.page_table_memory() == Memory::host ? "host memory" : "its own memory") +
                             " (TqPageTable::tables)");
  }
  if (t.max_pages < 1 || t.max_pages > l.pages()) {
    throw Error("max_pages",
                std::to_string(t.max_pages) + " must be in [1, the pool's pages " + std::to_string(l.pages()) + "]");
  }
  if (t.exact_sets != nullptr) check_pointer("exact_sets", t.exact_sets, alignof(std::int32_t));
  if (backend.page_table_memory() == Memory::host) {
    for (std::int64_t b = 0; b < batch; ++b) {
      const std::int64_t e = t.exact_sets != nullptr ? std::int64_t(t.exact_sets[b]) : b;
      if (e < 0 || e >= l.exact_sets) {
        throw Error("exact_sets", "sequence " + std::to_string(b) + "'s exact set " + std::to_string(e) +
                                      " must lie in [0, layout.exact_sets = " + std::to_string(l.exact_sets) + ")" +
                                      (t.exact_sets ? "" : " (no exact_sets: sequence b uses set b)"));
      }
    }
  }
  return t.max_pages * l.page_size;
}

void check_tq_pages_read(const Backend& backend, const TqLayout& l, const TqPageTable& t, std::int64_t b,
                         std::int64_t end) {
  if (!l.paged() || backend.page_table_memory() != Memory::host) return;
  for (std::int64_t p = 0; p * l.page_size < end; ++p) {
    const std::int64_t page = t.pages[b * t.max_pages + p];
    if (page < 0 || page >= l.pages()) {
      throw Error("pages", "entry [" + std::to_string(b) + ", " + std::to_string(p) + "] = " + std::to_string(page) +
                               " must lie in [0, the pool's pages " + std::to_string(l.pages()) + ")");
    }
  }
}

void validate_tq_layout(const TqLayout& l) {
  const std::int64_t d = l.head_dim;
  if (d < 32 || d > kMaxTqHeadDim || (d & (d - 1)) != 0 || d % 32 != 0) {
    throw Error("head_dim", std::to_string(d) + " must be a power of two, a multiple of 32, and <= 256");
  }
  if (l.qjl && (l.key_bits < 1 || l.key_bits > 3)) throw Error("key_bits", "must be 1, 2 or 3 (plus the QJL bit)");
  if (!l.qjl && (l.key_bits < 1 || l.key_bits > 4)) throw Error("key_bits", "must be 1 to 4 for keys without QJL");
  if (l.value_bits < 2 || l.value_bits > 4) throw Error("value_bits", "must be 2, 3 or 4");
  if (l.n_kv_heads < 1) throw Error("n_kv_heads", "must be >= 1");
  if (l.capacity < 1) throw Error("capacity", "must be >= 1");
  if (l.norm_correction && l.qjl) {
    throw Error("norm_correction",
                "needs keys without QJL (qjl = false): the sketch estimates the uncorrected residual");
  }
  if (l.sink_tokens < 0 || l.sink_tokens > kMaxExactTokens) {
    throw Error("sink_tokens", "must be in [0, " + std::to_string(kMaxExactTokens) + "]");
  }
  if (l.recent_tokens < 0 || l.recent_tokens > kMaxExactTokens) {
    throw Error("recent_tokens", "must be in [0, " + std::to_string(kMaxExactTokens) + "]");
  }
  if (l.exact_rows() > l.capacity) {
    throw Error("recent_tokens", "sink_tokens + recent_tokens (" + std::to_string(l.exact_rows()) +
                                     ") must not exceed capacity " + std::to_string(l.capacity));
  }
  if (l.key_outliers != 0) {
    const std::int64_t n = l.key_outliers;
    if (n < 16 || n > d / 2 || (n & (n - 1)) != 0) {
      throw Error("key_outliers", std::to_string(n) + " must be 0 or a power of two in [16, head_dim / 2 = " +
                                      std::to_string(d / 2) + "]");
    }
    if (l.qjl) throw Error("key_outliers", "needs keys without QJL (qjl = false)");
    if (l.key_outlier_bits < l.key_bits || l.key_outlier_bits > 4) {
      throw Error("key_outlier_bits", "must be in [key_bits = " + std::to_string(l.key_bits) + ", 4]");
    }
  } else if (l.key_outlier_bits != 0) {
    throw Error("key_outlier_bits", "must be 0 without outlier channels (key_outliers = 0)");
  }
  for (const bool keys : {true, false}) {
    const std::int64_t g = l.mean_block(keys);
    const char* name = keys ? "key_block" : "value_block";
    if (g == 0) continue;
    if (g < 8 || g > 2 * d || (g & (g - 1)) != 0) {
      throw Error(name, std::to_string(g) + " must be 0 or a power of two in [8, 2 head_dim = " +
                            std::to_string(2 * d) + "] (a block's mean then costs whole bytes per timestep)");
    }
    if (g > l.recent_tokens) {
      throw Error(name, std::to_string(g) + " must not exceed recent_tokens = " + std::to_string(l.recent_tokens) +
                            " (a timestep is coded as it leaves the recent window, when its whole block is there)");
    }
    if (keys && l.qjl) throw Error(name, "needs keys without QJL (qjl = false)");
  }
  if (l.page_size != 0) {
    const std::int64_t P = l.page_size;
    if (P < 16 || P > 256 || (P & (P - 1)) != 0) {
      throw Error("page_size", std::to_string(P) + " must be 0 (contiguous) or a power of two in [16, 256]");
    }
    if (l.capacity % P != 0) {
      throw Error("capacity", "a pool's capacity " + std::to_string(l.capacity) +
                                  " must be a whole number of pages of page_size " + std::to_string(P));
    }
    for (const bool keys : {true, false}) {
      if (l.mean_block(keys) > P) {
        throw Error(keys ? "key_block" : "value_block", std::to_string(l.mean_block(keys)) +
                                                            " must not exceed page_size " + std::to_string(P) +
                                                            " (a page holds whole blocks of means)");
      }
    }
  }
  if (l.exact_sets < 1) throw Error("exact_sets", "must be >= 1");
  if (!l.paged() && l.exact_sets != 1) {
    throw Error("exact_sets", "must be 1 for a contiguous image (page_size 0): it holds one sequence's exact rows");
  }
  const std::int64_t exact_words = checked_mul(checked_mul(l.exact_sets, l.n_kv_heads, "exact_sets"),
                                               l.exact_rows() * l.exact_row_words(), "exact_sets");
  if (exact_words > std::int64_t(std::numeric_limits<std::uint32_t>::max())) {
    throw Error("exact_sets", "the exact regions must hold fewer than 2^32 words (32-bit word indices)");
  }
  const std::int64_t slots = checked_mul(l.n_kv_heads, l.capacity, "capacity");
  // The widest slot (up to 5 key parts' norms), with an exact row's share and both block means' (8 timesteps
  // to a block at least).
  const std::int64_t words_per_slot = d * 4 / 32 + d / 32 + 3 + d / 2 + d / 8;
  if (checked_mul(slots, words_per_slot, "capacity") + exact_words >
      std::int64_t(std::numeric_limits<std::uint32_t>::max())) {
    throw Error("capacity", "the packed cache must hold fewer than 2^32 words (32-bit word indices)");
  }
}

TqEncodeCall validate_tq_encode(const Backend& backend, const TqEncodeArgs& a, bool keys, const char* view) {
  const TqEncodeCall c = validate_tq_encode_views(backend, a, keys, view);
  check_tq_rows_storable(backend, c, view);
  return c;
}

TqEncodeCall validate_tq_encode_views(const Backend& backend, const TqEncodeArgs& a, bool keys, const char* view) {
  const TqLayout& l = a.tables.layout;
  validate_tq_layout(l);
  check_view(view, a.x, backend);
  const std::int64_t T = a.x.shape[1];
  check_shape(view, a.x, {1, T, l.n_kv_heads, l.head_dim}, "[1, T, n_kv_heads, head_dim]");
  if (a.start_pos < 0) throw Error("start_pos", "must be >= 0");
  const std::int64_t reach = check_tq_page_table(backend, l, a.pages, 1);
  if (a.start_pos > reach - T) {  // no sum: start_pos may be anything up to INT64_MAX here
    throw Error("start_pos", "cache full: " + std::to_string(T) + " timesteps from " + std::to_string(a.start_pos) +
                                 " pass " + (l.paged() ? "max_pages * page_size " : "capacity ") +
                                 std::to_string(reach));
  }
  check_pointer("cache", a.cache, alignof(std::uint32_t));
  if (auto why = backend.unsupported(l)) throw Error("backend", backend.name() + ": " + *why);
  check_tq_pages_read(backend, l, a.pages, 0, a.start_pos + T);
  TqEncodeCall c(Validator::stamp());
  c.tables = a.tables;
  c.keys = keys;
  c.x = a.x;
  c.start_pos = a.start_pos;
  c.cache = a.cache;
  c.stream = a.stream;
  c.pages = a.pages;
  return c;
}

void check_tq_rows_storable(const Backend& backend, const TqEncodeCall& c, const char* view) {
  // A norm f16 cannot hold would be stored as an inf (the oracle then gives NaN or drops the key), so
  // it is refused before any word is written.
  const std::optional<TqRowNorm> bad =
      c.x.memory == Memory::host ? first_unstorable_row(c) : backend.tq_unstorable_row(c);
  if (bad) throw Error(view, unstorable_rule(*bad, c));
}

void validate_tq_calibration(const Backend& backend, const TqLayout& l, const TensorView& keys) {
  if (!l.key_outliers) {
    throw Error("layout", "calibrate() chooses outlier channels, and this layout has none (key_outliers = 0)");
  }
  check_view("keys", keys, backend);
  check_shape("keys", keys, {1, keys.shape[1], l.n_kv_heads, l.head_dim}, "[1, T, n_kv_heads, head_dim]");
}

TqRotateCall validate_tq_rotate(const Backend& backend, const TqRotateArgs& a) {
  const TqLayout& l = a.tables.layout;
  validate_tq_layout(l);
  check_view("q", a.q, backend);
  check_shape("q", a.q, {a.q.shape[0], a.q.shape[1], a.q.shape[2], l.head_dim},
              "[batch, n_queries, n_heads, head_dim]");
  const std::int64_t rows = checked_mul(a.q.shape[0], a.q.shape[1], "q");
  const std::int64_t q_cap = a.q_cap == 0 ? rows : a.q_cap;
  if (q_cap < rows) throw Error("q_cap", "must be >= batch * n_queries");
  checked_mul(checked_mul(q_cap, a.q.shape[2], "q_cap"), 2 * l.head_dim + 1, "q_cap");
  check_pointer("scratch", a.scratch, alignof(float));
  if (l.key_outliers) check_pointer("k_cache", a.k_cache, alignof(std::uint32_t));
  if (auto why = backend.unsupported(l)) throw Error("backend", backend.name() + ": " + *why);
  TqRotateCall c(Validator::stamp());
  c.k_cache = a.k_cache;
  c.tables = a.tables;
  c.q = a.q;
  c.scratch_layout = {q_cap, a.q.shape[2], l.head_dim};
  c.scratch = a.scratch;
  c.stream = a.stream;
  return c;
}

TqAttendCall validate_tq_attend(const Backend& backend, const TqAttendArgs& a, bool check_workspace) {
  const TqLayout& l = a.tables.layout;
  validate_tq_layout(l);
  if (a.n_heads < 1 || a.n_heads % l.n_kv_heads != 0) {
    throw Error("n_heads", "must be a positive multiple of n_kv_heads (" + std::to_string(l.n_kv_heads) + ")");
  }
  if (a.batch < 1) throw Error("batch", "must be >= 1");
  // What positions are checked against: a sequence's own image, or its row of a pool's table.
  const std::int64_t reach = check_tq_page_table(backend, l, a.pages, a.batch);
  const std::string limit = (l.paged() ? "max_pages * page_size " : "capacity ") + std::to_string(reach);
  // First, so that every sum of a position and n_queries below is small (reach < 2^32).
  if (a.n_queries < 1 || a.n_queries > reach) throw Error("n_queries", "must be in [1, " + limit + "]");
  const std::int64_t rows = checked_mul(a.batch, a.n_queries, "batch");
  const std::int64_t q_cap = a.q_cap == 0 ? rows : a.q_cap;
  if (q_cap < rows) throw Error("q_cap", "must be >= batch * n_queries");
  checked_mul(checked_mul(q_cap, a.n_heads, "q_cap"), 2 * l.head_dim + 1, "q_cap");
  if (!l.paged()) checked_mul(a.batch, l.key_words() + l.value_words(), "batch");
  std::int64_t max_seq = 0;
  if (a.start_positions != nullptr) {
    check_pointer("start_positions", a.start_positions, alignof(std::int32_t));
    max_seq = a.max_seq.value_or(reach);
  } else {
    if (a.start_pos < 0 || a.start_pos >= reach) throw Error("start_pos", "must be in [0, " + limit + ")");
    if (!a.max_seq && a.n_queries > reach - a.start_pos) {
      throw Error("start_pos", "query rows " + std::to_string(a.start_pos) + ".." +
                                   std::to_string(a.start_pos + a.n_queries - 1) + " pass " + limit);
    }
    max_seq = a.max_seq ? *a.max_seq : a.start_pos + a.n_queries;
  }
  if (max_seq < 0 || max_seq > reach) throw Error("max_seq", "must be in [0, " + limit + "]");
  TqAttendCall c(Validator::stamp());
  c.tables = a.tables;
  c.scratch_layout = {q_cap, a.n_heads, l.head_dim};
  c.scratch = a.scratch;
  c.n_heads = a.n_heads;
  c.n_queries = a.n_queries;
  c.start_pos = a.start_pos;
  c.batch = a.batch;
  c.max_seq = max_seq;
  // With per-sequence starts any row may see up to max_seq timesteps; else the last row's limit.
  c.longest_row = a.start_positions ? max_seq : std::min(a.start_pos + a.n_queries, max_seq);
  c.start_positions = a.start_positions;
  // As the dense window (docs/spec.md §4): positions are int32, so a longer window is no window, and
  // p - window + 1 stays far from overflowing for any int32 p.
  if (a.window < 0 || a.window > kInt32Max) throw Error("window", "must be in [0, 2^31 - 1] (0 = no window)");
  c.window = a.window;
  c.exact = a.exact;
  c.softcap = checked_softcap(a.softcap);
  c.sinks = checked_sinks(backend, a.sinks, a.n_heads, "n_heads");
  const float inv_sqrt_d = float(1.0 / std::sqrt(double(l.head_dim)));
  c.scale = a.scale.value_or(inv_sqrt_d);
  c.qjl_scale = a.qjl_scale.value_or(float(std::sqrt(std::acos(-1.0) / 2.0) / std::sqrt(double(l.head_dim))));
  if (!std::isfinite(c.scale)) throw Error("scale", "must be finite");
  if (!std::isfinite(c.qjl_scale)) throw Error("qjl_scale", "must be finite");
  check_pointer("scratch", a.scratch, alignof(float));
  check_pointer("k_cache", a.k_cache, alignof(std::uint32_t));
  check_pointer("v_cache", a.v_cache, alignof(std::uint32_t));
  check_view("out", a.out, backend);
  check_shape("out", a.out, {a.batch, a.n_queries, a.n_heads, l.head_dim}, "[batch, n_queries, n_heads, head_dim]");
  if (a.out.dtype != DType::f32) throw Error("out", "must be f32");
  if (auto why = backend.unsupported(l)) throw Error("backend", backend.name() + ": " + *why);
  c.k_cache = a.k_cache;
  c.v_cache = a.v_cache;
  c.out = a.out;
  c.stream = a.stream;
  c.pages = a.pages;
  c.reach = reach;
  // The pages each sequence's rows read (host tables; device kernels clamp): up to where its sequence ends, or
  // where start positions live in a device's memory (webgpu's tables are on the host, its positions are not), up to
  // max_seq.
  const bool starts_here = a.start_positions == nullptr || backend.memory() == Memory::host;
  for (std::int64_t b = 0; l.paged() && backend.page_table_memory() == Memory::host && b < a.batch; ++b) {
    const std::int64_t start = a.start_positions == nullptr ? a.start_pos
                               : starts_here                ? std::int64_t(a.start_positions[b])
                                                            : max_seq;
    check_tq_pages_read(backend, l, a.pages, b, std::max<std::int64_t>(0, c.sequence_end(start)));
  }
  if (check_workspace) {
    const std::size_t need = backend.tq_attend_workspace(c);
    if (need > 0 && (a.workspace == nullptr || a.workspace_bytes < need)) {
      throw Error("workspace", "needs " + std::to_string(need) + " bytes (tq_attend_workspace_bytes), got " +
                                   std::to_string(a.workspace == nullptr ? 0 : a.workspace_bytes));
    }
    if (need > 0) check_pointer("workspace", a.workspace, 16);  // the kernels read it in 16-byte pieces
    c.workspace = a.workspace;
    c.workspace_bytes = a.workspace_bytes;
  }
  return c;
}

}  // namespace core
}  // namespace flashtq

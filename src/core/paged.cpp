#include "core/paged.hpp"

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/sequence_rows.hpp"
#include "core/validate.hpp"
#include "flashtq/error.hpp"

namespace flashtq::core {
namespace {

// The pages' views, their size and the table's pointers: what both paths check.
void check_pages(const PagedKv& t, const TensorView& k_pages, const TensorView& v_pages, const Backend& backend,
                 const char* k_name, const char* v_name, std::int64_t& num_pages, std::int64_t& page_size) {
  check_view(k_name, k_pages, backend);
  check_view(v_name, v_pages, backend);
  if (v_pages.shape != k_pages.shape || v_pages.dtype != k_pages.dtype) {
    throw Error(v_name, std::string("must have the shape and dtype of ") + k_name);
  }
  num_pages = k_pages.shape[0];
  page_size = k_pages.shape[1];
  if (page_size < 16 || page_size > 256 || (page_size & (page_size - 1)) != 0) {
    throw Error(k_name,
                "page_size (dimension 1) " + std::to_string(page_size) + " must be a power of two in [16, 256]");
  }
  if (num_pages > std::numeric_limits<std::int32_t>::max()) throw Error(k_name, "num_pages must fit in int32");
  if (t.max_pages < 1 || t.max_pages > std::numeric_limits<std::int32_t>::max())
    throw Error("max_pages", "must be in [1, 2^31 - 1]");
  check_pointer("page_table", t.page_table, alignof(std::int32_t));
  check_pointer("seq_lens_k", t.seq_lens_k, alignof(std::int32_t));
}

// The checked table: each sequence's length and the page of each of its blocks of page_size keys.
struct Pages {
  std::int64_t batch = 0, page_size = 0, num_pages = 0;
  std::vector<std::int64_t> length;

  // `extra`: rows an append adds to each sequence (0 for a forward).
  Pages(const PagedKv& t, const TensorView& k_pages, const TensorView& v_pages, std::int64_t batch_size,
        std::int64_t extra, const Backend& backend, const char* k_name, const char* v_name)
      : batch(batch_size) {
    if (t.tables != Memory::host)
      throw Error("page_table",
                  backend.name() + " reads the page table and seq_lens_k in host memory (PagedKv::tables)");
    check_pages(t, k_pages, v_pages, backend, k_name, v_name, num_pages, page_size);
    length.resize(std::size_t(batch));
    for (std::int64_t b = 0; b < batch; ++b) {
      const std::int64_t n = t.seq_lens_k[b];
      if (n < 0 || n + extra > t.max_pages * page_size) {
        throw Error("seq_lens_k",
                    "sequence " + std::to_string(b) + " has " + std::to_string(n) + " keys" +
                        (extra ? " before an append of " + std::to_string(extra) : std::string()) +
                        ": must lie in [0, max_pages * page_size = " + std::to_string(t.max_pages * page_size) + "]");
      }
      // The pages its keys use (after the append, for one) must exist.
      for (std::int64_t p = 0; p * page_size < n + extra; ++p) {
        const std::int64_t page = t.page_table[b * t.max_pages + p];
        if (page < 0 || page >= num_pages) {
          throw Error("page_table", "entry [" + std::to_string(b) + ", " + std::to_string(p) +
                                        "] = " + std::to_string(page) +
                                        " must lie in [0, num_pages = " + std::to_string(num_pages) + ")");
        }
      }
      length[std::size_t(b)] = n;
    }
  }
};

// Key j of sequence b in a page view: its element offset.
std::int64_t key_at(const PagedKv& t, const TensorView& pages, std::int64_t page_size, std::int64_t b, std::int64_t j,
                    std::int64_t h) {
  const std::int64_t page = t.page_table[b * t.max_pages + j / page_size];
  return offset(pages, page, j % page_size, h);
}

// Sequence b's keys (or values) copied from its pages into a contiguous [1, n, Hkv, D] block.
struct Gathered {
  std::vector<unsigned char> bytes;
  TensorView view;
  Gathered(const PagedKv& t, const TensorView& pages, std::int64_t page_size, std::int64_t b, std::int64_t n) {
    const std::int64_t Hkv = pages.shape[2], D = pages.shape[3];
    const std::size_t row = std::size_t(D) * dtype_size(pages.dtype);
    bytes.resize(std::size_t(n * Hkv) * row);
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t h = 0; h < Hkv; ++h)
        std::memcpy(bytes.data() + std::size_t(j * Hkv + h) * row,
                    static_cast<const char*>(pages.data) +
                        key_at(t, pages, page_size, b, j, h) * std::int64_t(dtype_size(pages.dtype)),
                    row);
    view = TensorView::bshd(bytes.data(), pages.dtype, 1, n, Hkv, D);
  }
};

// A device backend's table where it reads it (Backend::page_table_memory): in host memory checked whole (for `batch`
// sequences growing by `extra` rows), in its own memory only known to be its own. Returns {num_pages, page_size}.
std::pair<std::int64_t, std::int64_t> check_device_table(const Backend& backend, const PagedKv& t,
                                                         const TensorView& k_pages, const TensorView& v_pages,
                                                         std::int64_t batch, std::int64_t extra, const char* k_name,
                                                         const char* v_name) {
  const Memory tables = backend.page_table_memory();
  if (t.tables != tables) {
    throw Error("page_table",
                backend.name() + " reads the page table and seq_lens_k in " +
                    (tables == Memory::host ? "host memory" : "its own memory: put them there and say so") +
                    " (PagedKv::tables)");
  }
  if (tables == Memory::host) {
    const Pages whole(t, k_pages, v_pages, batch, extra, backend, k_name, v_name);
    return {whole.num_pages, whole.page_size};
  }
  std::int64_t num_pages = 0, page_size = 0;
  check_pages(t, k_pages, v_pages, backend, k_name, v_name, num_pages, page_size);
  for (const auto& [name, ptr] : {std::pair{"page_table", t.page_table}, std::pair{"seq_lens_k", t.seq_lens_k}})
    if (auto why = backend.foreign_pointer(ptr)) throw Error(name, *why);
  return {num_pages, page_size};
}

}  // namespace

// A table in the backend's memory: one call whose k and v are the pages, validated as a contiguous call of the
// longest length the table allows (the kernel reads each sequence's own).
ForwardCall validate_on_device(const Backend& backend, const ForwardArgs& a, const AttentionParams& params) {
  const PagedKv& t = *params.paged;
  const auto [num_pages, page_size] = check_device_table(backend, t, a.k, a.v, a.q.shape[0], 0, "k", "v");
  const std::int64_t longest = t.max_pages * page_size;
  if (longest > std::numeric_limits<std::int32_t>::max())
    throw Error("max_pages", "max_pages * page_size must fit in int32");
  const std::int64_t B = a.q.shape[0], Hkv = a.k.shape[2], D = a.k.shape[3];
  ForwardArgs longest_call = a;
  for (TensorView* x : {&longest_call.k, &longest_call.v}) {
    x->shape = {B, longest, Hkv, D};
    x->strides = {longest * Hkv * D, Hkv * D, D, 1};
  }
  ForwardCall c = validate_forward(backend, longest_call, params);
  c.k = a.k;
  c.v = a.v;
  c.table = {t.page_table, t.seq_lens_k, t.max_pages, page_size, num_pages, !params.causal_offset.has_value()};
  return c;
}

void paged_forward(Backend& backend, const ForwardArgs& a, const AttentionParams& params) {
  const PagedKv& t = *params.paged;
  if (params.varlen) throw Error("paged", "paged keys with a ragged batch of queries are not implemented yet");
  if (backend.memory() != Memory::host) {
    backend.forward(validate_on_device(backend, a, params));
    return;
  }
  if (t.tables != Memory::host)
    throw Error("page_table", backend.name() + " reads the page table and seq_lens_k in host memory (PagedKv::tables)");
  check_view("q", a.q, backend);
  check_view("out", a.out, backend);
  const std::int64_t B = a.q.shape[0], H = a.q.shape[2], Sq = a.q.shape[1];
  const Pages pages(t, a.k, a.v, B, 0, backend, "k", "v");
  // What the per-sequence calls cannot see (they get batch b alone), and what no call checks when no
  // sequence has keys.
  if (a.out.shape != a.q.shape || a.out.dtype != a.q.dtype) throw Error("out", "must have q's shape and dtype");
  if (a.k.dtype != a.q.dtype) throw Error("k", "the pages must have q's dtype");
  if (a.k.shape[3] != a.q.shape[3]) throw Error("k", "the pages' head_dim must be q's");
  if (H % a.k.shape[2] != 0) throw Error("k", "query heads must be a multiple of the pages' kv heads");
  if (a.lse != nullptr) check_pointer("lse", a.lse, alignof(float));
  // One call per sequence on its gathered keys: batch b of q, out and the mask, lse's [H, Sq] block b.
  std::vector<Gathered> keys, values;
  keys.reserve(std::size_t(B));
  values.reserve(std::size_t(B));
  std::vector<ForwardCall> calls;
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t n = pages.length[std::size_t(b)];
    if (n == 0) continue;
    keys.emplace_back(t, a.k, pages.page_size, b, n);
    values.emplace_back(t, a.v, pages.page_size, b, n);
    AttentionParams p = params;
    p.paged.reset();
    if (p.mask != nullptr) {
      const std::int64_t skip = b * p.mask_strides[0];
      if (skip >= p.mask_elements) throw Error("mask_elements", "too small for batch " + std::to_string(b));
      p.mask += skip;
      p.mask_elements -= skip;
    }
    const ForwardArgs s{batch_of(a.q, b),
                        keys.back().view,
                        values.back().view,
                        batch_of(a.out, b),
                        a.lse != nullptr ? a.lse + b * H * Sq : nullptr,
                        a.stream};
    calls.push_back(validate_forward(backend, s, p));
    calls.back().p.batch0 = b;
  }
  for (const ForwardCall& c : calls) backend.forward(c);
  for (std::int64_t b = 0; b < B; ++b) {  // sequences without keys: out = 0, lse = the sink or -inf
    if (pages.length[std::size_t(b)] != 0) continue;
    write_rows_without_keys(a.out, b, 0, Sq, params, a.lse != nullptr ? a.lse + b * H * Sq : nullptr, Sq);
  }
}

namespace {

// The rows' views against the pages' (checked after the pages).
void check_appended_rows(const PagedAppendArgs& a) {
  for (const auto* x : {&a.k, &a.v}) {
    const char* name = x == &a.k ? "k" : "v";
    if (x->dtype != a.k_pages.dtype) throw Error(name, "must have the pages' dtype");
    if (x->shape[2] != a.k_pages.shape[2] || x->shape[3] != a.k_pages.shape[3])
      throw Error(name, "kv heads and head_dim must be the pages'");
  }
}

// A device backend's append: one call its kernel runs, the table checked whole first where it is host memory.
void append_on_device(Backend& backend, const PagedAppendArgs& a) {
  if (!backend.appends_pages()) {
    throw Error("paged", backend.name() +
                             ": appending rows to pages is not implemented on this backend yet (host "
                             "backends and cuda have it)");
  }
  const PagedKv& t = a.pages;
  const auto [num_pages, page_size] =
      check_device_table(backend, t, a.k_pages, a.v_pages, a.k.shape[0], a.k.shape[1], "k_pages", "v_pages");
  check_appended_rows(a);
  PagedAppendCall c(Validator::stamp());
  c.k_pages = a.k_pages;
  c.v_pages = a.v_pages;
  c.k = a.k;
  c.v = a.v;
  c.table = {t.page_table, t.seq_lens_k, t.max_pages, page_size, num_pages, true};
  c.stream = a.stream;
  backend.paged_append(c);
}

}  // namespace

void paged_append(Backend& backend, const PagedAppendArgs& a) {
  check_view("k", a.k, backend);
  check_view("v", a.v, backend);
  const std::int64_t B = a.k.shape[0], T = a.k.shape[1];
  if (a.v.shape != a.k.shape) throw Error("v", "must have the shape of k");
  if (backend.memory() != Memory::host) return append_on_device(backend, a);
  const Pages pages(a.pages, a.k_pages, a.v_pages, B, T, backend, "k_pages", "v_pages");
  check_appended_rows(a);
  const std::size_t row = std::size_t(a.k.shape[3]) * dtype_size(a.k.dtype);
  const std::int64_t esize = std::int64_t(dtype_size(a.k.dtype));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t h = 0; h < a.k.shape[2]; ++h) {
        const std::int64_t j = pages.length[std::size_t(b)] + t;
        std::memcpy(static_cast<char*>(a.k_pages.data) + key_at(a.pages, a.k_pages, pages.page_size, b, j, h) * esize,
                    static_cast<const char*>(a.k.data) + offset(a.k, b, t, h) * esize, row);
        std::memcpy(static_cast<char*>(a.v_pages.data) + key_at(a.pages, a.v_pages, pages.page_size, b, j, h) * esize,
                    static_cast<const char*>(a.v.data) + offset(a.v, b, t, h) * esize, row);
      }
}

}  // namespace flashtq::core

// Paged TurboQuant caches (docs/spec.md §2.7, docs/turboquant_layout.md "Pages"): sequences encoded into a
// shared pool of pages through a page table hold, timestep by timestep, the words their own contiguous images
// hold, and attention through the table (decode and chunks) equals the oracle over those contiguous images; on
// every backend that serves pools (reference, cpu, cuda where it runs), and bad tables and layouts are refused
// naming the argument before any word is written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend_mirror.hpp"
#include "conformance/host_tensor.hpp"
#include "flashtq/flashtq.hpp"
#include "seeded.hpp"
#include "tq_test_support.hpp"

namespace flashtq {
namespace {

using conformance::HostTensor;
using testing::Mirror;
using testing_tq::chunks;
using testing_tq::expect_error;
using testing_tq::rows_of;

// One case: a layout (as a pool of pages of page_size) and the sequences it serves.
struct Case {
  std::string name;
  TqLayout pool;        // page_size > 0, exact_sets = sequences
  TqLayout contiguous;  // the same configuration, one sequence per image of max_pages * page_size timesteps
  std::int64_t max_pages = 0;
  std::vector<std::int64_t> lengths;
  std::vector<std::int32_t> table, exact_sets;
};

Case make_case(const std::string& preset, std::int64_t D, std::int32_t page_size, std::mt19937_64& rng) {
  Case c;
  c.name = preset + " D=" + std::to_string(D) + " page_size=" + std::to_string(page_size);
  const std::int64_t Hkv = 2, B = 3;
  c.max_pages = std::uniform_int_distribution<std::int64_t>(3, 6)(rng);
  const std::int64_t reach = c.max_pages * page_size;
  std::uniform_int_distribution<std::int64_t> length(16, reach);  // a chunk of 16 query rows fits in any
  for (std::int64_t b = 0; b < B; ++b) c.lengths.push_back(length(rng));
  c.lengths[0] = reach;  // one sequence fills its table
  c.contiguous = tq_preset_layout(preset, D, Hkv, reach);
  // The pool: every sequence's pages and a few spare ones, handed out in a shuffled order.
  const std::int64_t pages = B * c.max_pages + 3;
  c.pool = c.contiguous;
  c.pool.capacity = pages * page_size;
  c.pool.page_size = page_size;
  c.pool.exact_sets = B + 1;
  std::vector<std::int32_t> order(static_cast<std::size_t>(pages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  c.table.assign(order.begin(), order.begin() + B * c.max_pages);
  c.exact_sets = {3, 0, 2};  // not the batch order
  return c;
}

// The words of sequence b's timestep t of kv head h in an image (codes, QJL bits, norms), keys or values.
std::vector<std::uint32_t> slot_words(const TqLayout& l, const std::vector<std::uint32_t>& w, bool keys,
                                      std::int64_t image, std::int64_t h, std::int64_t t) {
  const std::int64_t base = image * (keys ? l.key_words() : l.value_words()), slot = h * l.capacity + t;
  std::vector<std::uint32_t> out;
  const std::int64_t code_words = keys ? l.key_code_words() : l.value_code_words();
  for (std::int64_t i = 0; i < code_words; ++i) out.push_back(w[std::size_t(base + slot * code_words + i)]);
  if (keys) {
    for (std::int64_t i = 0; i < l.jl_words(); ++i)
      out.push_back(w[std::size_t(base + l.key_jl_offset() + slot * l.jl_words() + i)]);
    for (std::int64_t i = 0; i < l.key_norm_words(); ++i)
      out.push_back(w[std::size_t(base + l.key_norm_offset() + slot * l.key_norm_words() + i)]);
  } else {
    out.push_back(w[std::size_t(base + l.value_norm_offset() + slot)]);
  }
  const std::int32_t g = l.mean_block(keys);
  if (g > 0) {
    const std::int64_t at = base + (keys ? l.key_mean(h, t) : l.value_mean(h, t));
    for (std::int64_t i = 0; i < l.head_dim / 2; ++i) out.push_back(w[std::size_t(at + i)]);
  }
  return out;
}

std::vector<std::uint32_t> exact_words(const TqLayout& l, const std::vector<std::uint32_t>& w, bool keys,
                                       std::int64_t image, std::int64_t set, std::int64_t h, std::int64_t row) {
  const std::int64_t at = image * (keys ? l.key_words() : l.value_words()) +
                          (keys ? l.key_exact_offset() : l.value_exact_offset()) + l.exact_row_at(set, h, row);
  return {w.begin() + at, w.begin() + at + l.exact_row_words()};
}

class TqPagedOn : public ::testing::TestWithParam<const char*> {};

// Encodes every sequence of the case into the pool (through its table row) and into its own contiguous image
// (sequence b's image at b * key_words()), on `be`, in the same random chunks; returns the four word arrays
// (pool keys, pool values, images' keys, images' values) in host memory.
struct Encoded {
  std::vector<std::uint32_t> pool_k, pool_v, image_k, image_v;
  std::vector<HostTensor> k, v;
};

Encoded encode_both(Backend& be, const Case& c, const TqTables& pool_tables, const TqTables& image_tables,
                    std::mt19937_64& rng) {
  const TqLayout& pl = c.pool;
  const TqLayout& cl = c.contiguous;
  const std::int64_t B = std::int64_t(c.lengths.size());
  Encoded e;
  e.k.reserve(std::size_t(B));
  e.v.reserve(std::size_t(B));
  // Poisoned: a word the encoders should have written and did not shows.
  e.pool_k.assign(std::size_t(pl.key_words()), 0xDEADBEEFu);
  e.pool_v.assign(std::size_t(pl.value_words()), 0xDEADBEEFu);
  e.image_k.assign(std::size_t(B * cl.key_words()), 0xDEADBEEFu);
  e.image_v.assign(std::size_t(B * cl.value_words()), 0xDEADBEEFu);
  if (pl.key_outliers) {  // uncalibrated masks: zero words (channels [0, key_outliers)), in both
    for (std::int64_t i = 0; i < pl.key_mask_words(); ++i) e.pool_k[std::size_t(pl.key_mask_offset() + i)] = 0;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t i = 0; i < cl.key_mask_words(); ++i)
        e.image_k[std::size_t(b * cl.key_words() + cl.key_mask_offset() + i)] = 0;
  }
  Mirror m(be);
  std::uint32_t* pool_k = m.out(e.pool_k);
  std::uint32_t* pool_v = m.out(e.pool_v);
  std::uint32_t* image_k = m.out(e.image_k);
  std::uint32_t* image_v = m.out(e.image_v);
  // The tables where the backend reads them (webgpu: on the host, uploaded with each call).
  const bool host_tables = be.page_table_memory() == Memory::host;
  const std::int32_t* table = host_tables ? c.table.data() : m.in(c.table);
  const std::int32_t* sets = host_tables ? c.exact_sets.data() : m.in(c.exact_sets);
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t T = c.lengths[std::size_t(b)];
    e.k.emplace_back(std::array<std::int64_t, 4>{1, T, pl.n_kv_heads, pl.head_dim}, DType::f32, false);
    e.v.emplace_back(std::array<std::int64_t, 4>{1, T, pl.n_kv_heads, pl.head_dim}, DType::f32, false);
    e.k.back().fill_normal(rng);
    e.v.back().fill_normal(rng);
    const TensorView k = m.in(e.k.back()), v = m.in(e.v.back());
    std::int64_t start = 0;
    for (const std::int64_t n : chunks(T, rng)) {
      TqEncodeArgs a;
      a.start_pos = start;
      a.tables = pool_tables;
      a.pages = {table + b * c.max_pages, c.max_pages, sets + b, be.page_table_memory()};
      a.x = rows_of(k, start, n), a.cache = pool_k;
      tq_encode_keys(be, a);
      a.x = rows_of(v, start, n), a.cache = pool_v;
      tq_encode_values(be, a);
      TqEncodeArgs i;
      i.start_pos = start;
      i.tables = image_tables;
      i.x = rows_of(k, start, n), i.cache = image_k + b * cl.key_words();
      tq_encode_keys(be, i);
      i.x = rows_of(v, start, n), i.cache = image_v + b * cl.value_words();
      tq_encode_values(be, i);
      start += n;
    }
  }
  m.read_back();
  return e;
}

TEST_P(TqPagedOn, EachSequenceHoldsTheWordsOfItsOwnImage) {
  std::string why;
  Backend* found = testing::usable(GetParam(), why);
  if (found == nullptr) GTEST_SKIP() << why;
  std::mt19937_64 rng = test_rng();
  for (const auto& [preset, D, P] : {std::tuple{"seed", 128, 16}, std::tuple{"default", 128, 64},
                                     std::tuple{"small", 64, 32}, std::tuple{"quality", 64, 128}}) {
    const Case c = make_case(preset, D, P, rng);
    SCOPED_TRACE(c.name);
    const std::uint64_t seed = rng();
    const Encoded e =
        encode_both(*found, c, make_tq_tables(c.pool, seed, 0), make_tq_tables(c.contiguous, seed, 0), rng);
    for (std::int64_t b = 0; b < std::int64_t(c.lengths.size()); ++b) {
      const std::int64_t L = c.lengths[std::size_t(b)];
      for (std::int64_t h = 0; h < c.pool.n_kv_heads; ++h) {
        for (std::int64_t t = 0; t < L; ++t) {
          const std::int64_t page = c.table[std::size_t(b * c.max_pages + t / P)], at = page * P + t % P;
          // (With block means, a timestep still in the recent window has no codes yet: poison in both.)
          for (const bool keys : {true, false}) {
            ASSERT_EQ(slot_words(c.pool, keys ? e.pool_k : e.pool_v, keys, 0, h, at),
                      slot_words(c.contiguous, keys ? e.image_k : e.image_v, keys, b, h, t))
                << (keys ? "keys" : "values") << " of sequence " << b << " head " << h << " timestep " << t;
          }
          const std::int64_t row = c.pool.exact_row(t, L);
          if (row < 0) continue;
          for (const bool keys : {true, false})
            ASSERT_EQ(exact_words(c.pool, keys ? e.pool_k : e.pool_v, keys, 0, c.exact_sets[std::size_t(b)], h, row),
                      exact_words(c.contiguous, keys ? e.image_k : e.image_v, keys, b, 0, h, row))
                << (keys ? "keys'" : "values'") << " exact row " << row << " of sequence " << b << " head " << h;
        }
      }
    }
  }
}

// The call's TqAttendArgs on `be` (scratch rotated there), its output in host memory, and the kernel that ran.
struct Attended {
  HostTensor out;
  std::string kernel;
};

Attended attend_on(Backend& be, const TqTables& tables, const std::vector<std::uint32_t>& keys,
                   const std::vector<std::uint32_t>& values, const HostTensor& q,
                   const std::vector<std::int32_t>& starts, std::int64_t start_pos, const std::vector<float>& sinks,
                   bool exact, const Case* paged) {
  const auto [B, nq, Hq, D] = q.view.shape;
  Attended r{HostTensor({B, nq, Hq, D}, DType::f32, false), {}};
  std::fill(r.out.bytes.begin(), r.out.bytes.end(), std::uint8_t(0xFF));  // NaN poison
  Mirror m(be);
  std::vector<float> scratch(std::size_t(tq_scratch_floats(B * nq, Hq, D)));
  TqRotateArgs rot;
  rot.tables = tables, rot.q = m.in(q), rot.scratch = m.out(scratch), rot.k_cache = m.in(keys);
  tq_rotate_queries(be, rot);
  TqAttendArgs a;
  a.tables = tables, a.scratch = rot.scratch, a.n_heads = Hq, a.n_queries = nq, a.batch = B;
  a.start_positions = starts.empty() ? nullptr : m.in(starts), a.start_pos = start_pos;
  a.k_cache = rot.k_cache, a.v_cache = m.in(values);
  a.out = m.out(r.out), a.sinks = m.in(sinks), a.softcap = 30.0f, a.exact = exact;
  if (paged) {
    const bool host_tables = be.page_table_memory() == Memory::host;
    a.pages = {host_tables ? paged->table.data() : m.in(paged->table), paged->max_pages,
               host_tables ? paged->exact_sets.data() : m.in(paged->exact_sets), be.page_table_memory()};
  }
  std::vector<std::uint8_t> workspace(std::max<std::size_t>(16, tq_attend_workspace_bytes(be, a)));
  a.workspace = m.out(workspace), a.workspace_bytes = workspace.size();
  tq_attend(be, a);
  r.kernel = be.last_kernel();
  m.read_back();
  return r;
}

// Attention of `nq` query rows per sequence through the table on `be`, against the oracle over the contiguous
// images: rows ending at each sequence's length (per-sequence starts), or with `uniform`, rows from one start
// for all (the shortest sequence's last nq positions). Returns the largest relative error of a (sequence, row,
// head), and checks that the pool's call ran the kernel the same call over the images runs on `be`.
double attention_error(Backend& be, const Case& c, const Encoded& e, const TqTables& pool_tables,
                       const TqTables& image_tables, std::int64_t nq, bool uniform, bool exact, std::mt19937_64& rng) {
  const std::int64_t B = std::int64_t(c.lengths.size()), Hq = 2 * c.pool.n_kv_heads, D = c.pool.head_dim;
  HostTensor q({B, nq, Hq, D}, DType::f32, false);
  q.fill_normal(rng);
  std::vector<std::int32_t> starts;
  const std::int64_t shortest = *std::min_element(c.lengths.begin(), c.lengths.end());
  if (!uniform)
    for (const std::int64_t L : c.lengths) starts.push_back(std::int32_t(L - nq));
  std::vector<float> sinks(static_cast<std::size_t>(Hq));
  for (float& s : sinks) s = std::normal_distribution<float>(0.0f, 1.0f)(rng);
  const Attended want = attend_on(backend("reference"), image_tables, e.image_k, e.image_v, q, starts, shortest - nq,
                                  sinks, true, nullptr);
  const Attended got = attend_on(be, pool_tables, e.pool_k, e.pool_v, q, starts, shortest - nq, sinks, exact, &c);
  const Attended same =
      attend_on(be, image_tables, e.image_k, e.image_v, q, starts, shortest - nq, sinks, exact, nullptr);
  EXPECT_EQ(got.kernel, same.kernel) << "the pool's call fell back from the contiguous call's kernel";
  const std::vector<double> w = want.out.values(), g = got.out.values();
  double worst = 0;
  for (std::int64_t row = 0; row < B * nq * Hq; ++row) {
    const std::vector<double> gr(g.begin() + row * D, g.begin() + (row + 1) * D);
    const std::vector<double> wr(w.begin() + row * D, w.begin() + (row + 1) * D);
    const double err = testing_tq::relative_error(gr, wr);
    worst = std::max(worst, std::isnan(err) ? 1e30 : err);
  }
  return worst;
}

TEST_P(TqPagedOn, AttentionThroughTheTableEqualsTheOracleOverEachImage) {
  std::string why;
  Backend* found = testing::usable(GetParam(), why);
  if (found == nullptr) GTEST_SKIP() << why;
  std::mt19937_64 rng = test_rng();
  // Host backends are exact (docs/spec.md §3: 1e-5); a device's default path is bf16-class (1e-2).
  const bool host = found->memory() == Memory::host;
  for (const auto& [preset, D, P] : {std::tuple{"seed", 128, 16}, std::tuple{"default", 128, 64},
                                     std::tuple{"small", 64, 32}, std::tuple{"quality", 128, 256}}) {
    const Case c = make_case(preset, D, P, rng);
    SCOPED_TRACE(c.name);
    const std::uint64_t seed = rng();
    const TqTables pt = make_tq_tables(c.pool, seed, 0), it = make_tq_tables(c.contiguous, seed, 0);
    const Encoded e = encode_both(*found, c, pt, it, rng);
    // Decode, a chunk at each sequence's end, a chunk from one start for all (cuda's tensor-core prefill).
    for (const auto& [nq, uniform] : {std::pair{1, false}, std::pair{7, false}, std::pair{16, true}}) {
      EXPECT_LT(attention_error(*found, c, e, pt, it, nq, uniform, false, rng), host ? 1e-5 : 1e-2)
          << nq << " query rows" << (uniform ? " from one start" : "");
      if (!host) {
        EXPECT_LT(attention_error(*found, c, e, pt, it, nq, uniform, true, rng), 1e-5)
            << nq << " query rows" << (uniform ? " from one start" : "") << ", exact";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, TqPagedOn,
                         ::testing::ValuesIn(testing::compiled({"reference", "cpu", "webgpu", "cuda"})));

// A small pool and a host table on the oracle, for the refusals.
struct Refusals {
  TqLayout pool = tq_preset_layout("default", 64, 2, 4 * 64);
  std::vector<std::uint32_t> keys, values;
  std::vector<std::int32_t> table{2, 0};
  std::vector<std::int32_t> sets{1};
  HostTensor x{{1, 8, 2, 64}, DType::f32, false};
  Refusals() {
    pool.page_size = 64;
    pool.exact_sets = 2;
    keys.assign(std::size_t(pool.key_words()), 7u);
    values.assign(std::size_t(pool.value_words()), 7u);
    std::mt19937_64 rng(1);
    x.fill_normal(rng);
  }
  TqEncodeArgs encode() {
    TqEncodeArgs a;
    a.tables = make_tq_tables(pool, 5, 0);
    a.x = x.view;
    a.cache = keys.data();
    a.pages = {table.data(), 2, sets.data(), Memory::host};
    return a;
  }
};

TEST(TqPagedBadInput, LayoutsRefusedNamingTheRule) {
  Backend& ref = backend("reference");
  const auto encode_with = [&](const TqLayout& l) {
    Refusals r;
    TqEncodeArgs a = r.encode();
    a.tables = make_tq_tables(l, 5, 0);
    tq_encode_keys(ref, a);
  };
  Refusals r;
  TqLayout l = r.pool;
  l.page_size = 48;
  expect_error([&] { encode_with(l); }, "page_size", "power of two in [16, 256]");
  l = r.pool, l.page_size = 512;
  expect_error([&] { encode_with(l); }, "page_size", "power of two in [16, 256]");
  l = r.pool, l.capacity = 4 * 64 + 16;
  expect_error([&] { encode_with(l); }, "capacity", "whole number of pages");
  l = r.pool, l.page_size = 32;  // the default preset's blocks are 64 timesteps
  expect_error([&] { encode_with(l); }, "key_block", "must not exceed page_size 32");
  l = r.pool, l.exact_sets = 0;
  expect_error([&] { encode_with(l); }, "exact_sets", ">= 1");
  l = r.pool, l.page_size = 0;  // contiguous with two exact sets
  expect_error([&] { encode_with(l); }, "exact_sets", "must be 1 for a contiguous image");
  l = r.pool, l.page_size = 0, l.exact_sets = 1;  // a table for a contiguous image
  expect_error([&] { encode_with(l); }, "pages", "needs a pooled layout");
  expect_error([&] { TqKvCache({1, r.pool, 0}, &ref); }, "layout", "TqKvCache holds one sequence per layer");
}

TEST(TqPagedBadInput, TablesRefusedBeforeAnyWordIsWritten) {
  Backend& ref = backend("reference");
  const std::vector<std::uint32_t> untouched(Refusals().keys);
  const auto refused = [&](auto&& change, const std::string& argument, const std::string& rule) {
    Refusals r;
    TqEncodeArgs a = r.encode();
    change(r, a);
    expect_error([&] { tq_encode_keys(ref, a); }, argument, rule);
    EXPECT_EQ(r.keys, untouched) << "a refused encode wrote words (" << argument << ")";
  };
  refused([](Refusals&, TqEncodeArgs& a) { a.pages.pages = nullptr; }, "pages", "");
  refused([](Refusals&, TqEncodeArgs& a) { a.pages.tables = Memory::cuda; }, "pages",
          "reads page tables in host memory (TqPageTable::tables)");
  refused([](Refusals&, TqEncodeArgs& a) { a.pages.max_pages = 0; }, "max_pages", "must be in [1, the pool's pages 4]");
  refused([](Refusals&, TqEncodeArgs& a) { a.pages.max_pages = 5; }, "max_pages", "must be in [1, the pool's pages 4]");
  refused([](Refusals& r, TqEncodeArgs&) { r.table[0] = 4; }, "pages",
          "entry [0, 0] = 4 must lie in [0, the pool's pages 4)");
  refused([](Refusals& r, TqEncodeArgs&) { r.table[0] = -1; }, "pages", "entry [0, 0] = -1");
  refused([](Refusals& r, TqEncodeArgs& a) { r.table[1] = 9, a.start_pos = 64; }, "pages", "entry [0, 1] = 9");
  refused([](Refusals& r, TqEncodeArgs&) { r.sets[0] = 2; }, "exact_sets",
          "exact set 2 must lie in [0, layout.exact_sets = 2)");
  refused([](Refusals&, TqEncodeArgs& a) { a.start_pos = 2 * 64 - 4; }, "start_pos", "pass max_pages * page_size 128");
  // Attention: a query row past the table's reach, a bad entry in the pages a row reads.
  Refusals r;
  std::vector<float> scratch(std::size_t(tq_scratch_floats(1, 4, 64))), out(4 * 64);
  TqAttendArgs a;
  a.tables = make_tq_tables(r.pool, 5, 0), a.scratch = scratch.data(), a.n_heads = 4;
  a.k_cache = r.keys.data(), a.v_cache = r.values.data();
  a.out = TensorView::bshd(out.data(), DType::f32, 1, 1, 4, 64);
  a.pages = {r.table.data(), 2, r.sets.data(), Memory::host};
  a.start_pos = 128;
  expect_error([&] { tq_attend(ref, a); }, "start_pos", "must be in [0, max_pages * page_size 128)");
  a.start_pos = 100, r.table[1] = 17;
  expect_error([&] { tq_attend(ref, a); }, "pages", "entry [0, 1] = 17");
  a.start_pos = 10;  // reads page 0 only: the bad second entry is never read
  r.keys.assign(r.keys.size(), 0u), r.values.assign(r.values.size(), 0u);
  tq_attend(ref, a);
}

}  // namespace
}  // namespace flashtq

// TqPagedCache (docs/spec.md §2.7): sequences appended in interleaved chunks into pages handed out in a shuffled
// order attend as each would through its own TqKvCache of the same configuration, on every backend that serves
// pools (reference, cpu; cuda where it runs); a fork shares its parent's pages and, after copy_page, diverges from
// it; and freeing a mapped page, writing into a shared one, running out of pages or sequences are refused naming
// the argument, leaving the words as they were.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
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
using testing_tq::expect_error;
using testing_tq::rows_of;

constexpr std::int64_t kHkv = 2, kHeads = 4, kD = 64, kReach = 256;

TqLayout pool_layout(const std::string& preset, std::int32_t page_size, std::int64_t pages, std::int64_t sequences) {
  TqLayout l = tq_preset_layout(preset, kD, kHkv, pages * page_size);
  l.page_size = page_size;
  l.exact_sets = sequences;
  return l;
}

HostTensor random_rows(std::int64_t T, std::mt19937_64& rng) {
  HostTensor x({1, T, kHkv, kD}, DType::f32, false);
  x.fill_normal(rng);
  return x;
}

// One sequence's history: its rows, and the contiguous cache that holds the same timesteps.
struct Twin {
  std::int64_t id;
  HostTensor k, v;
  TqKvCache alone;
  std::int64_t length = 0;
};

// Appends rows [length, length + n) of the twin's k, v to both caches (pages mapped as needed, from `pages`).
void append_both(TqPagedCache& cache, Twin& twin, std::int64_t n, std::vector<std::int32_t>& pages, const TensorView& k,
                 const TensorView& v) {
  const std::int64_t P = cache.layout().page_size;
  while (std::int64_t(cache.pages_of(twin.id).size()) * P < twin.length + n) {
    cache.map_pages(twin.id, {pages.back()});
    pages.pop_back();
  }
  cache.append(0, twin.id, rows_of(k, twin.length, n), rows_of(v, twin.length, n));
  twin.alone.append(0, rows_of(k, twin.length, n), rows_of(v, twin.length, n), twin.length);
  twin.length += n;
}

// The largest relative error of a (sequence, row, head) of the pool's batched attention against each twin's own.
double batch_error(TqPagedCache& cache, std::vector<Twin*> twins, std::int64_t n, std::mt19937_64& rng) {
  Backend& be = cache.backend();
  const std::int64_t B = std::int64_t(twins.size());
  HostTensor q({B, n, kHeads, kD}, DType::f32, false), got({B, n, kHeads, kD}, DType::f32, false);
  q.fill_normal(rng);
  std::fill(got.bytes.begin(), got.bytes.end(), std::uint8_t(0xFF));
  std::vector<std::int64_t> ids;
  for (const Twin* t : twins) ids.push_back(t->id);
  {
    Mirror m(be);
    cache.attend(0, ids, m.in(q), m.out(got));
    m.read_back();
  }
  double worst = 0;
  const std::vector<double> g = got.values(), all_q = q.values();
  for (std::int64_t b = 0; b < B; ++b) {
    HostTensor qb({1, n, kHeads, kD}, DType::f32, false), want({1, n, kHeads, kD}, DType::f32, false);
    qb.fill(std::vector<double>(all_q.begin() + b * n * kHeads * kD, all_q.begin() + (b + 1) * n * kHeads * kD));
    {
      Mirror m(be);
      twins[std::size_t(b)]->alone.attend(0, m.in(qb), twins[std::size_t(b)]->length - n, m.out(want));
      m.read_back();
    }
    const std::vector<double> w = want.values();
    for (std::int64_t r = 0; r < n * kHeads; ++r) {
      const std::vector<double> gr(g.begin() + (b * n * kHeads + r) * kD, g.begin() + (b * n * kHeads + r + 1) * kD);
      const std::vector<double> wr(w.begin() + r * kD, w.begin() + (r + 1) * kD);
      const double e = testing_tq::relative_error(gr, wr);
      worst = std::max(worst, std::isnan(e) ? 1e30 : e);
    }
  }
  return worst;
}

class TqPagedCacheOn : public ::testing::TestWithParam<const char*> {};

TEST_P(TqPagedCacheOn, SequencesAttendAsTheirOwnCachesAndForksDiverge) {
  std::string why;
  Backend* found = testing::usable(GetParam(), why);
  if (found == nullptr) GTEST_SKIP() << why;
  std::mt19937_64 rng = test_rng();
  for (const auto& [preset, P] : {std::pair{"default", 64}, std::pair{"seed", 16}, std::pair{"small", 32}}) {
    SCOPED_TRACE(std::string(preset) + " page_size " + std::to_string(P));
    const std::uint64_t seed = rng();
    const TqLayout pool = pool_layout(preset, P, 3 * kReach / P + 2, 4);
    TqPagedCache cache({1, pool, seed}, found);
    TqLayout alone_layout = tq_preset_layout(preset, kD, kHkv, kReach);
    std::vector<std::int32_t> pages;
    for (std::int64_t i = 0; i < pool.pages(); ++i) pages.push_back(cache.allocate_page());
    std::shuffle(pages.begin(), pages.end(), rng);
    Mirror m(*found);
    std::vector<Twin> twins;
    twins.reserve(3);
    for (int i = 0; i < 2; ++i)
      twins.push_back({cache.add_sequence(), random_rows(kReach, rng), random_rows(kReach, rng),
                       TqKvCache({1, alone_layout, seed}, found)});
    std::vector<TensorView> ks, vs;
    for (Twin& t : twins) ks.push_back(m.in(t.k)), vs.push_back(m.in(t.v));
    // Interleaved chunks, each sequence to a length of its own.
    std::uniform_int_distribution<std::int64_t> chunk(1, 40);
    const std::int64_t target[2] = {150, 97};
    for (bool more = true; more;) {
      more = false;
      for (std::size_t i = 0; i < 2; ++i) {
        const std::int64_t n = std::min(chunk(rng), target[i] - twins[i].length);
        if (n > 0) append_both(cache, twins[i], n, pages, ks[i], vs[i]);
        more = more || twins[i].length < target[i];
      }
    }
    // The same arithmetic over the same words; only the split of the timesteps into steps differs (a pool's
    // steps stop at page ends; a batch's split plan follows its longest row).
    const double host_bound = found->memory() == Memory::host ? 1e-6 : 1e-4;
    for (const std::int64_t n : {1, 5}) EXPECT_LT(batch_error(cache, {&twins[0], &twins[1]}, n, rng), host_bound);

    // A fork of sequence 0: the same timesteps and pages; after copying the shared last page it takes rows of
    // its own, and both continue.
    const std::int64_t child = cache.fork(twins[0].id);
    EXPECT_EQ(cache.pages_of(child), cache.pages_of(twins[0].id));
    EXPECT_EQ(cache.length(0, child), twins[0].length);
    HostTensor child_k = twins[0].k, child_v = twins[0].v;  // rows [0, 150) shared; later ones its own
    {
      HostTensor fresh_k = random_rows(kReach, rng), fresh_v = random_rows(kReach, rng);
      std::vector<double> ck = child_k.values(), cv = child_v.values();
      const std::vector<double> fk = fresh_k.values(), fv = fresh_v.values();
      std::copy(fk.begin() + 150 * kHkv * kD, fk.end(), ck.begin() + 150 * kHkv * kD);
      std::copy(fv.begin() + 150 * kHkv * kD, fv.end(), cv.begin() + 150 * kHkv * kD);
      child_k.fill(ck), child_v.fill(cv);
    }
    twins.push_back({child, child_k, child_v, TqKvCache({1, alone_layout, seed}, found)});
    const TensorView child_kv = m.in(twins[2].k), child_vv = m.in(twins[2].v);
    twins[2].alone.append(0, rows_of(child_kv, 0, 150), rows_of(child_vv, 0, 150), 0);
    twins[2].length = 150;
    // Writing now would touch pages both map (the partial last page, and with block means the window's).
    expect_error([&] { cache.append(0, child, rows_of(child_kv, 150, 3), rows_of(child_vv, 150, 3)); }, "pages",
                 "copy it (copy_page)");
    const std::int64_t first_written = std::max<std::int64_t>(0, 150 - (pool.key_block ? pool.recent_tokens : 0));
    for (std::int64_t i = first_written / P; i < std::int64_t(cache.pages_of(child).size()); ++i) {
      cache.copy_page(child, i, pages.back());
      pages.pop_back();
    }
    for (int step = 0; step < 3; ++step) {
      append_both(cache, twins[2], 7, pages, child_kv, child_vv);
      append_both(cache, twins[0], 5, pages, ks[0], vs[0]);
    }
    EXPECT_LT(batch_error(cache, {&twins[2], &twins[0], &twins[1]}, 1, rng), host_bound) << "after the fork";
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, TqPagedCacheOn,
                         ::testing::ValuesIn(testing::compiled({"reference", "cpu", "webgpu", "cuda"})));

TEST(TqPagedCacheBadInput, RefusedNamingTheArgumentWithTheWordsUnchanged) {
  Backend& ref = backend("reference");
  const TqLayout pool = pool_layout("default", 64, 3, 2);
  TqPagedCache cache({1, pool, 3}, &ref);
  std::mt19937_64 rng(5);
  const HostTensor k = random_rows(100, rng), v = random_rows(100, rng);
  const std::int64_t a = cache.add_sequence(), b = cache.add_sequence();
  expect_error([&] { cache.add_sequence(); }, "sequence", "every one of the layout's exact_sets (2)");
  const std::int32_t p0 = cache.allocate_page(), p1 = cache.allocate_page(), p2 = cache.allocate_page();
  EXPECT_EQ(cache.free_pages(), 0);
  expect_error([&] { cache.allocate_page(); }, "pages", "all 3 pages are allocated");
  expect_error([&] { cache.map_pages(a, {7}); }, "pages", "page 7 is not allocated");
  expect_error([&] { cache.map_pages(a, {p0, p0}); }, "pages", "mapped twice");
  cache.map_pages(a, {p0});
  expect_error([&] { cache.append(0, a, rows_of(k.view, 0, 70), rows_of(v.view, 0, 70)); }, "pages",
               "maps 1 pages; its timesteps 0..69 need 2 (map_pages)");
  cache.append(0, a, rows_of(k.view, 0, 60), rows_of(v.view, 0, 60));
  expect_error([&] { cache.free_page(p0); }, "pages", "page 0 is mapped by 1 sequence(s)");
  cache.remove_sequence(b);
  const std::int64_t child = cache.fork(a);
  const std::vector<std::uint32_t> before = cache.key_words(0);
  EXPECT_EQ(std::int64_t(before.size()), pool.key_words());
  expect_error([&] { cache.append(0, child, rows_of(k.view, 60, 2), rows_of(v.view, 60, 2)); }, "pages",
               "is shared with another sequence");
  expect_error([&] { cache.append(0, a, rows_of(k.view, 60, 2), rows_of(v.view, 60, 2)); }, "pages",
               "is shared with another sequence");
  EXPECT_EQ(cache.key_words(0), before) << "a refused append wrote words";
  expect_error([&] { cache.copy_page(child, 1, p1); }, "index", "must be in [0, the sequence's 1 pages)");
  cache.map_pages(a, {p1});
  expect_error([&] { cache.copy_page(child, 0, p1); }, "fresh", "is mapped by a sequence");
  expect_error([&] { cache.length(0, 7); }, "sequence", "is not a live sequence");
  expect_error([&] { cache.attend(0, {a, a}, k.view, k.view); }, "sequences", "one sequence per batch row");
  cache.free_page(p2);
  EXPECT_EQ(cache.free_pages(), 1);
  expect_error([&] { cache.free_page(p2); }, "pages", "not allocated");
  expect_error(
      [&] {
        TqPagedCache({1, tq_preset_layout("default", kD, kHkv, 256), 0}, &ref);
      },
      "layout", "needs a pool (page_size > 0)");
}

}  // namespace
}  // namespace flashtq

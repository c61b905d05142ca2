// Paged keys and values (docs/spec.md §1.7) through the public API on the host backends and webgpu: each sequence's
// output against the brute-force formula on its keys gathered by plain loops, with every feature drawn; a
// decode loop of appends and paged forwards against the contiguous forward; bad tables refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "backend_mirror.hpp"
#include "brute_force.hpp"
#include "conformance/device_buffer.hpp"
#include "conformance/host_tensor.hpp"
#include "forward_refusal.hpp"
#include "flashtq/flashtq.hpp"
#include "seeded.hpp"

namespace flashtq {
namespace {

using conformance::HostTensor;
using conformance::relative_error;

struct Table {
  std::int64_t page_size, num_pages, max_pages;
  std::vector<std::int32_t> pages, lengths;
  PagedKv kv() const { return {pages.data(), max_pages, lengths.data()}; }
};

// Every sequence's pages drawn without repetition from a shuffled pool (pages shared by nobody else).
Table draw_table(std::mt19937_64& rng, std::int64_t B, std::int64_t page_size, std::int64_t max_len) {
  Table t{page_size, 0, (max_len + page_size - 1) / page_size, {}, {}};
  t.num_pages = B * t.max_pages + 3;
  std::vector<std::int32_t> pool(std::size_t(t.num_pages));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  t.pages.assign(pool.begin(), pool.begin() + B * t.max_pages);
  for (std::int64_t b = 0; b < B; ++b)
    t.lengths.push_back(std::int32_t(std::uniform_int_distribution<std::int64_t>(b == 0 ? 1 : 0, max_len)(rng)));
  return t;
}

// Sequence b's keys from the pages, by plain loops, as batch b of a zero-padded [b + 1, n, Hkv, D] array.
std::vector<double> gathered(const HostTensor& pages, const Table& t, std::int64_t b) {
  const std::int64_t n = t.lengths[std::size_t(b)], Hkv = pages.view.shape[2], D = pages.view.shape[3];
  const std::vector<double> all = pages.values();
  std::vector<double> x(std::size_t((b + 1) * n * Hkv * D), 0.0);
  for (std::int64_t j = 0; j < n; ++j) {
    const std::int64_t page = t.pages[std::size_t(b * t.max_pages + j / t.page_size)];
    for (std::int64_t e = 0; e < Hkv * D; ++e)
      x[std::size_t(((b * n + j) * Hkv) * D + e)] =
          all[std::size_t(((page * t.page_size + j % t.page_size) * Hkv) * D + e)];
  }
  return x;
}

class PagedOn : public ::testing::TestWithParam<const char*> {};

TEST_P(PagedOn, EverySequenceEqualsTheFormulaOnItsGatheredKeys) {
  std::string why;
  Backend* found = testing::usable(GetParam(), why);
  if (found == nullptr) GTEST_SKIP() << why;
  Backend& be = *found;
  std::mt19937_64 rng = test_rng();
  auto range = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  for (int index = 0; index < 12; ++index) {
    const std::int64_t B = range(1, 4), Hkv = range(1, 2), H = Hkv * range(1, 2), D = 32, Sq = range(1, 5);
    const DType dtype = std::array<DType, 3>{DType::f32, DType::f16, DType::bf16}[std::size_t(index % 3)];
    const Table t = draw_table(rng, B, index % 2 ? 16 : 32, 70);
    SCOPED_TRACE("case " + std::to_string(index) + ": B " + std::to_string(B) + ", page_size " +
                 std::to_string(t.page_size) + ", " + dtype_name(dtype));
    HostTensor q({B, Sq, H, D}, dtype, index % 2 == 0), kp({t.num_pages, t.page_size, Hkv, D}, dtype, false), vp(kp);
    q.fill_normal(rng);
    kp.fill_normal(rng);
    vp.fill_normal(rng);
    AttentionParams params;
    params.causal = range(0, 1) == 1;
    if (range(0, 2) == 0) params.window = range(1, 20);
    if (range(0, 2) == 0) {
      params.dropout_p = 0.2f;
      params.seed = std::uint32_t(rng());
    }
    if (range(0, 2) == 0) params.softcap = 3.0f;
    std::vector<float> sinks;
    if (range(0, 1) == 0) {
      for (std::int64_t h = 0; h < H; ++h) sinks.push_back(float(h) - 0.5f);
      params.sinks = sinks.data();
    }
    params.paged = t.kv();
    HostTensor out(q);
    out.poison();
    std::vector<float> lse(std::size_t(B * H * Sq), std::numeric_limits<float>::quiet_NaN());
    testing::Mirror on(be);  // the table stays on the host (every backend here reads it there)
    params.sinks = on.in(sinks);
    attention_forward(be, {on.in(q), on.in(kp), on.in(vp), on.out(out), on.out(lse), nullptr}, params);
    on.read_back();
    params.sinks = sinks.empty() ? nullptr : sinks.data();

    const std::vector<double> qd = q.values();
    std::vector<double> want_out(qd.size(), 0.0), want_lse(lse.size());
    for (std::int64_t b = 0; b < B; ++b) {
      DenseProblem p;
      p.B = b + 1;
      p.Sq = Sq;
      p.Sk = t.lengths[std::size_t(b)];
      p.H = H;
      p.Hkv = Hkv;
      p.D = D;
      p.scale = float(1.0 / std::sqrt(double(D)));
      p.causal = params.causal;
      p.causal_offset = p.Sk - Sq;  // each sequence's own bottom-right alignment
      p.window = params.window;
      p.dropout_p = params.dropout_p;
      p.seed = params.seed;
      p.softcap = params.softcap;
      p.sinks = params.sinks;
      std::vector<double> qb(std::size_t((b + 1) * Sq * H * D), 0.0);
      std::copy(qd.begin() + b * Sq * H * D, qd.begin() + (b + 1) * Sq * H * D, qb.begin() + b * Sq * H * D);
      const auto f = testing::brute_force_attention(p, qb, gathered(kp, t, b), gathered(vp, t, b));
      std::copy(f.out.begin() + b * Sq * H * D, f.out.end(), want_out.begin() + b * Sq * H * D);
      std::copy(f.lse.begin() + b * H * Sq, f.lse.end(), want_lse.begin() + b * H * Sq);
    }
    std::string detail;
    const double tol = dtype == DType::f32 ? 2e-5 : dtype == DType::f16 ? 4e-3 : 2e-2;
    EXPECT_LE(relative_error(want_out, out.values(), detail), tol) << "out " << detail;
    EXPECT_LE(relative_error(want_lse, std::vector<double>(lse.begin(), lse.end()), detail, 1.0), 2e-5)
        << "lse " << detail;
  }
}

// Prefill of 37 rows, then decode steps of one, each an append and a paged forward: the same outputs as the
// forward over the contiguous keys so far. On a device backend the pages live there through the whole loop.
TEST_P(PagedOn, ADecodeLoopOfAppendsEqualsTheContiguousForward) {
  std::string why;
  Backend* found = testing::usable(GetParam(), why);
  if (found == nullptr) GTEST_SKIP() << why;
  Backend& be = *found;
  std::mt19937_64 rng = test_rng();
  const std::int64_t B = 2, H = 4, Hkv = 2, D = 32, steps = 6, prefill = 37, total = prefill + steps;
  Table t = draw_table(rng, B, 16, total);
  std::fill(t.lengths.begin(), t.lengths.end(), 0);
  HostTensor kp({t.num_pages, t.page_size, Hkv, D}, DType::f32, false), vp(kp),
      k({B, total, Hkv, D}, DType::f32, false), v(k);
  kp.poison();
  vp.poison();
  k.fill_normal(rng);
  v.fill_normal(rng);
  auto rows = [](TensorView s, std::int64_t first, std::int64_t n) {
    s.data = static_cast<char*>(s.data) + first * s.strides[1] * 4;
    s.shape[1] = n;
    return s;
  };
  testing::Mirror on(be);
  const TensorView k_pages = on.in(kp), v_pages = on.in(vp), keys = on.in(k), values = on.in(v);
  paged_kv_append(be, {k_pages, v_pages, t.kv(), rows(keys, 0, prefill), rows(values, 0, prefill), nullptr});
  for (auto& n : t.lengths) n = prefill;
  for (std::int64_t s = 0; s < steps; ++s) {
    paged_kv_append(be, {k_pages, v_pages, t.kv(), rows(keys, prefill + s, 1), rows(values, prefill + s, 1), nullptr});
    for (auto& n : t.lengths) n += 1;
    HostTensor q({B, 1, H, D}, DType::f32, false);
    q.fill_normal(rng);
    HostTensor got(q), want(q);
    got.poison();
    want.poison();
    testing::Mirror step(be);
    const TensorView q_on = step.in(q);
    AttentionParams params;
    params.causal = true;
    attention_forward(
        be, {q_on, rows(keys, 0, prefill + s + 1), rows(values, 0, prefill + s + 1), step.out(want), nullptr, nullptr},
        params);
    params.paged = t.kv();
    attention_forward(be, {q_on, k_pages, v_pages, step.out(got), nullptr, nullptr}, params);
    step.read_back();
    std::string detail;  // the same keys, perhaps split across threads differently: f32 rounding apart
    EXPECT_LE(relative_error(want.values(), got.values(), detail), 1e-6) << "step " << s << ": " << detail;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, PagedOn, ::testing::ValuesIn(testing::compiled({"reference", "cpu", "webgpu"})));

Backend* cuda_gpu() {
  for (Backend* b : all_backends())
    if (b->name() == "cuda" && b->available()) return b;
  return nullptr;
}

// cuda reads the table in device memory (PagedKv::tables) with its decode kernel: every sequence's output and
// lse against the reference backend's paging of the same pages through the same table in host memory; the
// workspace it asks for is passed, poisoned. The last cases hold a device table's entries out of range, which the
// kernel clamps (a length to max_pages * page_size, a page index into [0, num_pages)): the same numbers as the
// clamped table on the host. The two after them have scores past f32's range (bf16 queries and keys of about
// 1e19), rows the kernel cannot finish and the repair recomputes: it must read the keys through the table too.
TEST(PagedOnCuda, DecodeThroughADeviceTableEqualsTheReference) {
  Backend* gpu = cuda_gpu();
  if (!gpu) GTEST_SKIP() << "no CUDA device here: paged decode on cuda is checked on the GPU machine";
  std::mt19937_64 rng = test_rng();
  auto range = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  for (int index = 0; index < 12; ++index) {
    const bool clamped = index == 8 || index == 9, extreme = index >= 10;
    const std::int64_t B = range(1, 5), Hkv = range(1, 2), G = index % 2 ? 4 : 1, H = Hkv * G;
    const std::int64_t D = std::array<std::int64_t, 3>{64, 128, 256}[std::size_t(index % 3)];
    const std::int64_t Sq = range(1, D == 256 ? 8 / G : 16 / G > 3 ? 3 : 16 / G);
    const DType dtype = index % 2 || extreme ? DType::bf16 : DType::f16;
    Table t = draw_table(rng, B, index % 4 < 2 ? 16 : 64, range(20, 700));
    SCOPED_TRACE("case " + std::to_string(index) + ": B " + std::to_string(B) + ", H " + std::to_string(H) + ", Hkv " +
                 std::to_string(Hkv) + ", D " + std::to_string(D) + ", Sq " + std::to_string(Sq) + ", page_size " +
                 std::to_string(t.page_size) + ", " + dtype_name(dtype));
    HostTensor q({B, Sq, H, D}, dtype, false), kp({t.num_pages, t.page_size, Hkv, D}, dtype, false), vp(kp);
    q.fill_normal(rng, extreme ? 1e19 : 1.0);
    kp.fill_normal(rng, extreme ? 1e19 : 1.0);
    vp.fill_normal(rng);
    AttentionParams params;
    params.causal = range(0, 1) == 1;
    if (range(0, 2) == 0) params.window = range(1, 300);
    if (range(0, 2) == 0 && !extreme) params.softcap = 5.0f;
    std::vector<float> sinks;
    if (range(0, 1) == 0)
      for (std::int64_t h = 0; h < H; ++h) sinks.push_back(float(h) - 0.5f);
    Table device_table = t;
    if (clamped) {
      device_table.lengths[0] = std::int32_t(t.max_pages * t.page_size + 1000);
      device_table.pages[0] = -5;
      t.lengths[0] = std::int32_t(t.max_pages * t.page_size);
      t.pages[0] = 0;
    }
    // The oracle: the reference backend, the table on the host.
    HostTensor want(q);
    std::vector<float> want_lse(std::size_t(B * H * Sq));
    AttentionParams host = params;
    host.sinks = sinks.empty() ? nullptr : sinks.data();
    host.paged = t.kv();
    attention_forward(backend("reference"), {q.view, kp.view, vp.view, want.view, want_lse.data(), nullptr}, host);

    conformance::DeviceBuffer dq(*gpu, q.bytes), dk(*gpu, kp.bytes), dv(*gpu, vp.bytes);
    conformance::DeviceBuffer dtable(*gpu, device_table.pages), dlengths(*gpu, device_table.lengths),
        dsinks(*gpu, sinks);
    HostTensor got(q);
    got.poison();
    conformance::DeviceBuffer dout(*gpu, got.bytes),
        dlse(*gpu, std::vector<float>(want_lse.size(), std::numeric_limits<float>::quiet_NaN()));
    AttentionParams device = params;
    device.sinks = sinks.empty() ? nullptr : static_cast<const float*>(dsinks.get());
    device.paged = PagedKv{static_cast<const std::int32_t*>(dtable.get()), t.max_pages,
                           static_cast<const std::int32_t*>(dlengths.get()), Memory::cuda};
    ForwardArgs a{q.on(dq.get(), Memory::cuda),     kp.on(dk.get(), Memory::cuda),   vp.on(dv.get(), Memory::cuda),
                  got.on(dout.get(), Memory::cuda), static_cast<float*>(dlse.get()), nullptr};
    const std::size_t ws = attention_forward_workspace_bytes(*gpu, a, device);
    conformance::DeviceBuffer workspace(*gpu, std::vector<std::uint8_t>(ws, 0xFF));
    a.workspace = ws ? workspace.get() : nullptr;
    a.workspace_bytes = ws;
    attention_forward(*gpu, a, device);
    EXPECT_EQ(gpu->last_kernel(), "dense_forward_decode");
    got.assign(dout.read<std::uint8_t>());
    const std::vector<float> got_lse = dlse.read<float>();
    std::string detail;
    EXPECT_LE(relative_error(want.values(), got.values(), detail), dtype == DType::f16 ? 2e-3 : 1e-2)
        << "out " << detail;
    EXPECT_LE(relative_error(std::vector<double>(want_lse.begin(), want_lse.end()),
                             std::vector<double>(got_lse.begin(), got_lse.end()), detail, 1.0),
              dtype == DType::f16 ? 2e-3 : 1e-2)
        << "lse " << detail;
  }
}

// cuda appends rows through a table in device memory: the pages it writes equal, byte for byte, the pages plain
// loops write through the same table on the host (f32, f16, bf16; other pages' bytes untouched). The last case's
// table holds a length past its reach (the sequence writes nothing) and a page index past num_pages (clamped to the
// last page, which no sequence maps here, so no two rows land in one place).
TEST(PagedOnCuda, AppendThroughADeviceTableEqualsTheHostAppend) {
  Backend* gpu = cuda_gpu();
  if (!gpu) GTEST_SKIP() << "no CUDA device here: the paged append on cuda is checked on the GPU machine";
  std::mt19937_64 rng = test_rng();
  for (int index = 0; index < 4; ++index) {
    const bool clamped = index == 3;
    const std::int64_t B = 3, Hkv = 2, D = index == 1 ? 96 : 64, T = index == 2 ? 20 : 3;
    const DType dtype = std::array<DType, 3>{DType::f32, DType::f16, DType::bf16}[std::size_t(index % 3)];
    Table t = draw_table(rng, B, 16, 60);
    for (auto& n : t.lengths) n = std::min<std::int32_t>(n, std::int32_t(t.max_pages * t.page_size - T));
    SCOPED_TRACE("case " + std::to_string(index) + ", " + dtype_name(dtype) + ", T " + std::to_string(T));
    HostTensor kp({t.num_pages, t.page_size, Hkv, D}, dtype, false), vp(kp), k({B, T, Hkv, D}, dtype, false), v(k);
    kp.fill_normal(rng);
    vp.fill_normal(rng);
    k.fill_normal(rng);
    v.fill_normal(rng);
    std::vector<bool> mapped(std::size_t(t.num_pages), false);
    for (std::int32_t page : t.pages) mapped[std::size_t(page)] = true;
    const auto spare = std::int32_t(std::find(mapped.begin(), mapped.end() - 1, false) - mapped.begin());
    for (std::int32_t& page : t.pages)  // the last page mapped by nobody
      if (page == t.num_pages - 1) page = spare;
    Table device_table = t;
    if (clamped) {
      device_table.lengths[0] = std::int32_t(t.max_pages * t.page_size + 7);
      device_table.pages[std::size_t(1 * t.max_pages + t.lengths[1] / t.page_size)] = std::int32_t(t.num_pages + 5);
    }
    conformance::DeviceBuffer dkp(*gpu, kp.bytes), dvp(*gpu, vp.bytes), dk(*gpu, k.bytes), dv(*gpu, v.bytes),
        dtable(*gpu, device_table.pages), dlengths(*gpu, device_table.lengths);
    const PagedKv device{static_cast<const std::int32_t*>(dtable.get()), t.max_pages,
                         static_cast<const std::int32_t*>(dlengths.get()), Memory::cuda};
    paged_kv_append(*gpu, {kp.on(dkp.get(), Memory::cuda), vp.on(dvp.get(), Memory::cuda), device,
                           k.on(dk.get(), Memory::cuda), v.on(dv.get(), Memory::cuda), nullptr});
    // The host, by plain loops over the device table as the kernel reads it: a length clamped to the reach, a page
    // index to [0, num_pages), a row past the reach not written.
    const std::int64_t reach = t.max_pages * t.page_size, esize = std::int64_t(dtype_size(dtype));
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t r = 0; r < T; ++r)
        for (std::int64_t h = 0; h < Hkv; ++h) {
          const std::int64_t j = std::clamp<std::int64_t>(device_table.lengths[std::size_t(b)], 0, reach) + r;
          if (j >= reach) continue;
          const std::int64_t page = std::clamp<std::int64_t>(
              device_table.pages[std::size_t(b * t.max_pages + j / t.page_size)], 0, t.num_pages - 1);
          for (auto [pages, rows] : {std::pair{&kp, &k}, std::pair{&vp, &v}})
            std::memcpy(pages->bytes.data() + ((page * t.page_size + j % t.page_size) * Hkv + h) * D * esize,
                        rows->bytes.data() + ((b * T + r) * Hkv + h) * D * esize, std::size_t(D * esize));
        }
    EXPECT_EQ(dkp.read<std::uint8_t>(), kp.bytes) << "k_pages";
    EXPECT_EQ(dvp.read<std::uint8_t>(), vp.bytes) << "v_pages";
  }
}

TEST(PagedBadInput, RefusedNamingTheArgument) {
  Table t{16, 4, 2, {0, 1, 2, 3}, {20, 5}};
  HostTensor q({2, 1, 2, 32}, DType::f32, false), kp({4, 16, 1, 32}, DType::f32, false), vp(kp), out(q);
  auto expect = [&](const std::string& argument, auto&& breaker) {
    Table bad = t;
    AttentionParams p;
    ForwardArgs a{q.view, kp.view, vp.view, out.view, nullptr, nullptr};
    breaker(bad, a, p);
    p.paged = bad.kv();
    testing::expect_forward_refused(backend("cpu"), a, p, out, argument);
  };
  using A = ForwardArgs;
  using P = AttentionParams;
  expect("page_table", [](Table& b, A&, P&) { b.pages[1] = 4; });  // past num_pages, in use
  expect("page_table", [](Table& b, A&, P&) { b.pages[2] = -1; });
  expect("seq_lens_k", [](Table& b, A&, P&) { b.lengths[1] = 33; });  // past max_pages * page_size
  expect("seq_lens_k", [](Table& b, A&, P&) { b.lengths[0] = -1; });
  expect("max_pages", [](Table& b, A&, P&) { b.max_pages = 0; });
  HostTensor pages12({4, 12, 1, 32}, DType::f32, false), pages_f16({4, 16, 1, 32}, DType::f16, false);
  expect("k", [&](Table&, A& a, P&) {  // page_size 12 is no power of two
    a.k = pages12.view;
    a.v = pages12.view;
  });
  expect("v", [&](Table&, A& a, P&) { a.v = pages_f16.view; });
  expect("paged", [&](Table&, A&, P& p) { p.varlen = Varlen{}; });
  // A host backend reads the table where it lives: in host memory.
  AttentionParams device_table;
  device_table.paged = t.kv();
  device_table.paged->tables = Memory::cuda;
  testing::expect_forward_refused(backend("cpu"), {q.view, kp.view, vp.view, out.view, nullptr, nullptr}, device_table,
                                  out, "page_table");
  // A table entry past the sequence's pages is never read, so it may hold anything.
  Table loose = t;
  loose.pages[3] = 99;
  AttentionParams ok;
  ok.paged = loose.kv();
  EXPECT_NO_THROW(attention_forward(backend("cpu"), {q.view, kp.view, vp.view, out.view, nullptr, nullptr}, ok));
  // An append past a sequence's pages is refused before any row is written.
  HostTensor new_rows({2, 13, 1, 32}, DType::f32, false), pages_before(kp);
  try {
    paged_kv_append(backend("cpu"), {kp.view, vp.view, t.kv(), new_rows.view, new_rows.view, nullptr});
    ADD_FAILURE() << "an append past max_pages * page_size was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "seq_lens_k") << e.what();
  }
  EXPECT_EQ(kp.bytes, pages_before.bytes);
  // The backward takes no pages.
  HostTensor dq(q);
  std::vector<float> lse(4, 0.0f);
  try {
    attention_backward(backend("cpu"),
                       {q.view, kp.view, vp.view, out.view, q.view, lse.data(), dq.view, kp.view, vp.view}, ok);
    ADD_FAILURE() << "a paged backward was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "paged");
  }
}

// webgpu reads the table in host memory and checks it whole, as the host backends do: a bad entry is refused by
// name before the kernel runs (out stays poisoned), a table said to be in device memory is refused, and an append
// whose page does not exist writes nothing.
TEST(PagedBadInput, RefusedOnWebgpuBeforeAnyWrite) {
  std::string why;
  Backend* found = testing::usable("webgpu", why);
  if (found == nullptr) GTEST_SKIP() << why;
  Backend& be = *found;
  const Table t{16, 4, 2, {0, 1, 2, 3}, {20, 5}};
  HostTensor q({2, 1, 2, 32}, DType::f32, false), kp({4, 16, 1, 32}, DType::f32, false), vp(kp), out(q);
  kp.fill(std::vector<double>(std::size_t(kp.numel()), 0.5));
  vp.fill(std::vector<double>(std::size_t(vp.numel()), 0.5));
  auto expect = [&](const std::string& argument, Table bad, Memory tables) {
    out.poison();
    testing::Mirror on(be);
    AttentionParams p;
    p.paged = bad.kv();
    p.paged->tables = tables;
    try {
      attention_forward(be, {on.in(q), on.in(kp), on.in(vp), on.out(out), nullptr, nullptr}, p);
      ADD_FAILURE() << "accepted: " << argument;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), argument) << e.what();
    }
    on.read_back();
    for (double x : out.values()) ASSERT_TRUE(std::isnan(x)) << argument << ": output written by a refused call";
  };
  Table bad = t;
  bad.pages[1] = 4;  // past num_pages, in use
  expect("page_table", bad, Memory::host);
  bad = t;
  bad.lengths[1] = 33;  // past max_pages * page_size
  expect("seq_lens_k", bad, Memory::host);
  expect("page_table", t, Memory::webgpu);
  // An append past a sequence's pages is refused before any row is written.
  testing::Mirror on(be);
  HostTensor new_rows({2, 13, 1, 32}, DType::f32, false), pages_before(kp);
  const TensorView k_pages = on.out(kp), rows = on.in(new_rows);
  try {
    paged_kv_append(be, {k_pages, on.in(vp), t.kv(), rows, rows, nullptr});
    ADD_FAILURE() << "an append past max_pages * page_size was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "seq_lens_k") << e.what();
  }
  on.read_back();
  EXPECT_EQ(kp.bytes, pages_before.bytes);
}

}  // namespace
}  // namespace flashtq

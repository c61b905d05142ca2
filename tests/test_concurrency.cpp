// What docs/api.md ("Threads") promises, exercised from several threads at once: a TqKvCache used by
// readers and a writer together, and the cpu backend's set_threads changed during calls. The results
// must equal a run on one thread, bit for bit. scripts/test.sh runs these under ThreadSanitizer
// (the tsan preset), which also sees a data race that happens not to change a result.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "conformance/host_tensor.hpp"
#include "flashtq/flashtq.hpp"
#include "seeded.hpp"

namespace flashtq {
namespace {

using conformance::HostTensor;

// Two threads attend one cache while a third appends to it. The attended rows lie within the
// timesteps appended before the threads start, so every result equals the one computed before.
void attend_while_appending(Backend& be) {
  TqKvCache cache({1, {64, 2, 160, 2, 2}, 7}, &be);
  std::mt19937_64 rng = test_rng();
  HostTensor k({1, 16, 2, 64}, DType::bf16, false), v(k);
  k.fill_normal(rng);
  v.fill_normal(rng);
  cache.append(0, k.view, v.view, 0);
  HostTensor q({1, 4, 4, 64}, DType::f32, false), expected(q);
  q.fill_normal(rng);
  cache.attend(0, q.view, 12, expected.view);

  std::atomic<bool> appending{true};
  std::atomic<int> started{0};
  std::thread writer([&] {
    // Only once both readers are attending, so that appends overlap attends however the threads are
    // scheduled (on a loaded machine the appends could otherwise all finish first).
    while (started.load() < 2) std::this_thread::yield();
    HostTensor more(k);
    for (std::int64_t t = 16; t + 16 <= 160; t += 16) {
      more.fill_normal(rng);
      cache.append(0, more.view, more.view, t);
    }
    appending = false;
  });
  auto reader = [&](int* checked) {
    HostTensor out(q);
    do {
      out.poison();
      cache.attend(0, q.view, 12, out.view);
      EXPECT_EQ(out.bytes, expected.bytes);
      if (++*checked == 1) ++started;
    } while (appending);
  };
  int checked[2] = {0, 0};
  std::thread r0(reader, &checked[0]), r1(reader, &checked[1]);
  writer.join();
  r0.join();
  r1.join();
  EXPECT_EQ(cache.length(0), 160);
  EXPECT_GE(checked[0] + checked[1], 2);
}

TEST(Concurrency, TqKvCacheAttendWhileAppendingOnCpu) { attend_while_appending(backend("cpu")); }
TEST(Concurrency, TqKvCacheAttendWhileAppendingOnReference) { attend_while_appending(backend("reference")); }

// set_threads from another thread while dense attention runs on the cpu backend: each call takes the
// count current when it starts, and the result does not depend on it (Sq spans more than four row
// blocks, so no call splits its keys across threads: the same sums in the same order).
TEST(Concurrency, CpuSetThreadsDuringAttention) {
  Backend& cpu = backend("cpu");
  const int saved = cpu.threads();
  std::mt19937_64 rng = test_rng();
  const std::int64_t B = 1, S = 200, H = 2, Hkv = 1, D = 64;
  HostTensor q({B, S, H, D}, DType::f32, false), k({B, S, Hkv, D}, DType::f32, false), v(k), dout(q);
  q.fill_normal(rng);
  k.fill_normal(rng);
  v.fill_normal(rng);
  dout.fill_normal(rng);
  AttentionParams params;
  params.causal = true;
  params.dropout_p = 0.1f;
  params.seed = 5;
  struct Result {
    HostTensor out, dq, dk, dv;
    std::vector<float> lse;
  };
  auto run = [&](Result& r) {
    r.out.poison();
    attention_forward(cpu, {q.view, k.view, v.view, r.out.view, r.lse.data(), nullptr}, params);
    attention_backward(
        cpu, {q.view, k.view, v.view, r.out.view, dout.view, r.lse.data(), r.dq.view, r.dk.view, r.dv.view, nullptr},
        params);
  };
  auto fresh = [&] { return Result{q, q, k, k, std::vector<float>(std::size_t(B * H * S))}; };
  cpu.set_threads(1);
  Result expected = fresh();
  run(expected);

  std::atomic<bool> running{true};
  std::thread setter([&] {
    for (int n = 0; running; n = (n + 1) % 4) cpu.set_threads(n + 1);
  });
  auto worker = [&] {
    Result r = fresh();
    for (int i = 0; i < 6; ++i) {
      run(r);
      EXPECT_EQ(r.out.bytes, expected.out.bytes);
      EXPECT_EQ(r.lse, expected.lse);
      EXPECT_EQ(r.dq.bytes, expected.dq.bytes);
      EXPECT_EQ(r.dk.bytes, expected.dk.bytes);
      EXPECT_EQ(r.dv.bytes, expected.dv.bytes);
    }
  };
  std::thread w0(worker), w1(worker);
  w0.join();
  w1.join();
  running = false;
  setter.join();
  cpu.set_threads(saved);
}

}  // namespace
}  // namespace flashtq

// The cpu backend's TurboQuant attention runs its SIMD path for every layout (every preset, every
// bit width, with and without QJL, exact tokens, windows, GQA groups of any size), held to the
// oracle on the same packed words: no layout falls back to the per-row code.
#include <gtest/gtest.h>

#include <cstdint>

#include "conformance/conformance.hpp"
#include "hwy/targets.h"
#include "flashtq/flashtq.hpp"
#include "seeded.hpp"

namespace flashtq {
namespace {

void expect_simd(const conformance::TqCase& c, const char* kernel = "tq_attend_simd") {
  const conformance::CheckResult r = conformance::check_tq_attend(backend("cpu"), c);
  EXPECT_TRUE(r.passed) << c.describe() << ": error " << r.error << " > " << r.tolerance << " " << r.detail;
  EXPECT_EQ(r.kernel, kernel) << c.describe();
}

conformance::TqCase make_case(const TqLayout& layout, std::int64_t group, std::int64_t window) {
  conformance::TqCase c;
  c.layout = layout;
  c.H = layout.n_kv_heads * group;
  c.tokens = layout.capacity;
  c.n_queries = 3;
  c.start_pos = layout.capacity - 3;
  c.window = window;
  c.zero_rows = true;
  c.seed = fresh_seed();
  c.data_seed = fresh_seed();
  return c;
}

TEST(CpuTqSimd, EveryPresetAtEveryHeadDim) {
  for (const TqPreset& p : tq_presets())
    for (std::int64_t D : {32, 64, 128, 256})
      for (std::int64_t group : {1, 3, 4}) {
        const TqLayout l = tq_preset_layout(p.name, D, 2, D >= 256 ? 90 : 140);
        expect_simd(make_case(l, group, 0));
        expect_simd(make_case(l, group, 50));  // a window that starts inside the coded part
      }
}

TEST(CpuTqSimd, EveryBitWidth) {
  for (bool qjl : {true, false})
    for (int kb = 1; kb <= (qjl ? 3 : 4); ++kb)
      for (int vb = 2; vb <= 4; ++vb)
        for (std::int64_t D : {32, 128}) {
          TqLayout l{D, 1, 70, kb, vb};
          l.qjl = qjl;
          l.norm_correction = !qjl && vb == 3;
          l.sink_tokens = kb == 2 ? 2 : 0;
          l.recent_tokens = vb == 4 ? 9 : 0;
          expect_simd(make_case(l, 2, 0));
        }
}

// The lane counts the machine's best target does not have (4 lanes: a gather for 16 value levels and
// half-window shifts; 16 lanes: two windows per chunk) run on every target this machine supports.
TEST(CpuTqSimd, EverySimdTargetThisMachineRuns) {
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    const char* kernel = target == HWY_SCALAR ? "tq_attend_rows" : "tq_attend_simd";
    for (int vb = 2; vb <= 4; ++vb) {
      TqLayout l{64, 1, 60, vb == 4 ? 4 : 3, vb};
      l.qjl = vb == 2;
      if (l.qjl) l.key_bits = 2;
      l.sink_tokens = 2;
      l.recent_tokens = 5;
      expect_simd(make_case(l, 4, 0), kernel);
    }
    // Every preset (outlier channels, block means, exact tokens): the decoded keys' parts and their reduction
    // across tokens, and the block means, on each lane count.
    for (const TqPreset& p : tq_presets())
      for (std::int64_t D : {64, 128}) expect_simd(make_case(tq_preset_layout(p.name, D, 2, 150), 4, 0), kernel);
  }
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace
}  // namespace flashtq

// Seeds for the running test: the n-th call in test T returns derive_seed(run seed, T, n), so a
// failed test is replayed by FLASHTQ_TEST_SEED=<run seed> --gtest_filter=T (main prints both).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <string>

#include "conformance/seeds.hpp"

namespace flashtq {

inline std::string current_test_name() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return info ? std::string(info->test_suite_name()) + "." + info->name() : std::string("(no test)");
}

inline std::uint64_t fresh_seed() {
  static std::map<std::string, std::uint64_t> calls;
  const std::string name = current_test_name();
  return conformance::derive_seed(conformance::run_seed(), name, calls[name]++);
}

inline std::mt19937_64 test_rng() { return std::mt19937_64(fresh_seed()); }

}  // namespace flashtq

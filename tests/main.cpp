// The tests' main: GoogleTest, plus a line after every failed test with the environment and filter
// that replay it (the run seed every randomised test derives its inputs from).
#include <gtest/gtest.h>

#include <cstdio>

#include "conformance/seeds.hpp"

namespace {

class ReplayPrinter : public ::testing::EmptyTestEventListener {
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (!info.result()->Failed()) return;
    std::printf("[  REPLAY  ] %s ./flashtq_tests --gtest_filter='%s.%s'\n", flashtq::conformance::replay_hint().c_str(),
                info.test_suite_name(), info.name());
  }
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::UnitTest::GetInstance()->listeners().Append(new ReplayPrinter);
  std::printf("run seed: %s\n", flashtq::conformance::replay_hint().c_str());
  return RUN_ALL_TESTS();
}

// A forward that must be refused (docs/spec.md §4): the error names the argument, and the output, poisoned
// first, is not written.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "conformance/host_tensor.hpp"
#include "flashtq/flashtq.hpp"

namespace flashtq::testing {

inline void expect_forward_refused(Backend& backend, const ForwardArgs& args, const AttentionParams& params,
                                   conformance::HostTensor& out, const std::string& argument) {
  out.poison();
  try {
    attention_forward(backend, args, params);
    ADD_FAILURE() << "accepted: " << argument;
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
  }
  for (double x : out.values()) ASSERT_TRUE(std::isnan(x)) << argument << ": output written by a refused call";
}

}  // namespace flashtq::testing

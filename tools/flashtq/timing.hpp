// Timing for the `flashtq bench` commands.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace flashtq::cli {

// Median seconds of `repeats` runs of f after one warm-up.
template <typename F>
double median_s(F&& f, int repeats) {
  f();
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace flashtq::cli

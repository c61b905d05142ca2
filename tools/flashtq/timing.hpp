// Timing for the `flashtq bench` commands.
#pragma once

#include <algorithm>
#include <chrono>
#include <utility>
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

// Median seconds of f and of g over `repeats` rounds of one run of each, after one warm-up each: on a shared
// machine whose speed drifts over minutes, the two are measured in the same minutes.
template <typename F, typename G>
std::pair<double, double> alternating_median_s(F&& f, G&& g, int repeats) {
  f();
  g();
  std::vector<double> tf, tg;
  auto seconds = [](auto&& run) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  for (int i = 0; i < repeats; ++i) {
    tf.push_back(seconds(f));
    tg.push_back(seconds(g));
  }
  std::sort(tf.begin(), tf.end());
  std::sort(tg.begin(), tg.end());
  return {tf[tf.size() / 2], tg[tg.size() / 2]};
}

}  // namespace flashtq::cli

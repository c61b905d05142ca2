// Timing for the `flashtq bench` commands.
#pragma once

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

namespace flashtq::cli {

// Seconds one run of f takes.
template <typename F>
double seconds(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

inline double median(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Median seconds of `repeats` runs of f after one warm-up.
template <typename F>
double median_s(F&& f, int repeats) {
  f();
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) t.push_back(seconds(f));
  return median(std::move(t));
}

// Median seconds of f and of g over `repeats` rounds of one run of each, after one warm-up each: on a shared
// machine whose speed drifts over minutes, the two are measured in the same minutes.
template <typename F, typename G>
std::pair<double, double> alternating_median_s(F&& f, G&& g, int repeats) {
  f();
  g();
  std::vector<double> tf, tg;
  for (int i = 0; i < repeats; ++i) {
    tf.push_back(seconds(f));
    tg.push_back(seconds(g));
  }
  return {median(std::move(tf)), median(std::move(tg))};
}

}  // namespace flashtq::cli

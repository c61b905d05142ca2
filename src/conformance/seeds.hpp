// Replayable randomness for tests and conformance runs: one run seed (FLASHTQ_TEST_SEED when set,
// else fresh per process), from which every test draws its own sequence of seeds by name, so that
// a failure printed with its run seed is replayed by setting the variable.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace flashtq::conformance {

// FLASHTQ_TEST_SEED (decimal) when set and valid; otherwise one fresh seed for the whole process.
std::uint64_t run_seed();
// Seed number `index` of the stream named `name` under `base` (splitmix64 over the three).
std::uint64_t derive_seed(std::uint64_t base, std::string_view name, std::uint64_t index);
// "FLASHTQ_TEST_SEED=<run seed>": the environment that replays this run.
std::string replay_hint();

}  // namespace flashtq::conformance

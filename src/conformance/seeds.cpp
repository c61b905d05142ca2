#include "conformance/seeds.hpp"

#include <cstdlib>
#include <random>

namespace flashtq::conformance {
namespace {

std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

std::uint64_t run_seed() {
  // Read on every call (not cached), so a test of the harness can set it and replay in-process.
  if (const char* text = std::getenv("FLASHTQ_TEST_SEED")) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(text, &end, 10);
    if (end != text && *end == '\0') return v;
  }
  static const std::uint64_t fresh = (std::uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  return fresh;
}

std::uint64_t derive_seed(std::uint64_t base, std::string_view name, std::uint64_t index) {
  std::uint64_t h = splitmix(base);
  for (char c : name) h = splitmix(h ^ std::uint8_t(c));
  return splitmix(h ^ splitmix(index));
}

std::string replay_hint() { return "FLASHTQ_TEST_SEED=" + std::to_string(run_seed()); }

}  // namespace flashtq::conformance

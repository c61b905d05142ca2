// What the libFuzzer harnesses of tests/fuzz/ share: reporting a finding, interesting integers and
// floats, host tensors allocated to exactly what their views claim (so that ASan sees any access
// outside the view), and docs/spec.md §4's rules for a single view, written out independently of
// the validator so that the harnesses can say which calls must be refused.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>

#include "core/half.hpp"
#include "flashtq/error.hpp"
#include "flashtq/tensor.hpp"

namespace fuzz {

using flashtq::DType;
using flashtq::Memory;
using flashtq::TensorView;

// What the harness is doing (the call and its arguments), printed with a finding.
inline std::string context;

// A harness's oracle failed: print why and abort, which libFuzzer reports as a crash and saves the input.
[[noreturn]] inline void finding(const char* format, ...) {
  std::va_list args;
  va_start(args, format);
  std::fputs("\n*** flashtq fuzz finding: ", stderr);
  std::vfprintf(stderr, format, args);
  std::fprintf(stderr, "\n*** during: %s\n", context.c_str());
  va_end(args);
  std::abort();
}

// A float as its shortest exact decimal (std::to_string's six decimals print a tiny value as 0).
inline std::string exact(float x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", double(x));
  return buf;
}

inline std::string describe(const TensorView& t) {
  auto list = [](const std::array<std::int64_t, 4>& a) {
    return std::to_string(a[0]) + ", " + std::to_string(a[1]) + ", " + std::to_string(a[2]) + ", " +
           std::to_string(a[3]);
  };
  return "{dtype " + std::to_string(int(t.dtype)) + ", shape [" + list(t.shape) + "], strides [" + list(t.strides) +
         "], memory " + std::to_string(int(t.memory)) + (t.data ? "" : ", null") +
         (reinterpret_cast<std::uintptr_t>(t.data) % 4
              ? ", offset " + std::to_string(reinterpret_cast<std::uintptr_t>(t.data) % 4)
              : "") +
         "}";
}

// The folder of this process's files (under $TMPDIR: scripts/fuzz.sh points it into build/).
inline const std::string& temp_dir() {
  static const std::string dir = [] {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/flashtq-fuzz-XXXXXX";
    if (!mkdtemp(pattern.data())) finding("cannot make a temporary folder from %s", pattern.c_str());
    return pattern;
  }();
  return dir;
}

// Outcome counts, printed at exit when FLASHTQ_FUZZ_STATS is set (how much of the input space a
// corpus reaches: valid calls, refused ones, skipped ones).
struct Stats {
  std::array<long, 8> counts{};
  std::array<const char*, 8> names{};
  ~Stats() {
    if (!std::getenv("FLASHTQ_FUZZ_STATS")) return;
    for (std::size_t i = 0; i < counts.size(); ++i)
      if (names[i]) std::fprintf(stderr, "%s: %ld\n", names[i], counts[i]);
  }
  void count(std::size_t i, const char* name) {
    names[i] = name;
    ++counts[i];
  }
};
inline Stats stats;

constexpr std::int64_t kInt32Max = std::numeric_limits<std::int32_t>::max();
constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();

// True with probability p; false once the input is used up, so that a short input (a provider
// returns zeros when it is exhausted) draws the sane, valid case.
inline bool rarely(FuzzedDataProvider& fdp, float p) { return fdp.ConsumeProbability<float>() > 1.0f - p; }

// Integers that sit on the validator's limits and the 32- and 64-bit edges, or any integer.
inline std::int64_t interesting_int64(FuzzedDataProvider& fdp) {
  // clang-format off
  static constexpr std::int64_t table[] = {
      0, -1, 1, 2, 3, 31, 32, 33, 255, 256, 257, 65536, 65537,
      kInt32Max, kInt32Max + 1, -kInt32Max, -kInt32Max - 1, -kInt32Max - 2,
      std::int64_t(1) << 32, (std::int64_t(1) << 32) + 1, std::int64_t(1) << 40, std::int64_t(1) << 62,
      3037000500,  // about sqrt(2^63)
      kInt64Max / 2 + 1, kInt64Max, std::numeric_limits<std::int64_t>::min(),
      std::numeric_limits<std::int64_t>::min() + 1};
  // clang-format on
  if (fdp.ConsumeBool()) return fdp.ConsumeIntegral<std::int64_t>();
  return fdp.PickValueInArray(table);
}

inline float interesting_float(FuzzedDataProvider& fdp) {
  // clang-format off
  static constexpr float table[] = {
      0.0f, -0.0f, 1.0f, -1.0f, 0.5f, 0.99999994f, 1.0000001f, 1e-30f, -1e-30f, 1e30f, -1e30f,
      std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max(),
      -std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity(),
      -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
  // clang-format on
  if (fdp.ConsumeBool()) return fdp.ConsumeFloatingPoint<float>();
  return fdp.PickValueInArray(table);
}

// splitmix64: the tensors' contents come from a seed the input gives, not byte by byte from the input.
struct Rng {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform(float lo, float hi) { return lo + (hi - lo) * float(next() >> 40) * 0x1p-24f; }
};

// How a tensor's values are drawn. Only `moderate` and `zeros` promise finite outputs.
enum class Values : std::uint8_t { moderate, zeros, special, large };

inline float draw_value(Rng& rng, Values mode) {
  switch (mode) {
    case Values::moderate: return rng.uniform(-2.0f, 2.0f);
    case Values::zeros: return 0.0f;
    case Values::large: return rng.uniform(-3e4f, 3e4f);
    case Values::special: {
      // clang-format off
      static constexpr float specials[] = {
          std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
          -std::numeric_limits<float>::infinity(), 65504.0f, -65504.0f, 1e30f, -1e30f,
          std::numeric_limits<float>::denorm_min(), 0.0f};
      // clang-format on
      const std::uint64_t r = rng.next();
      return r % 4 == 0 ? specials[(r >> 8) % std::size(specials)] : rng.uniform(-2.0f, 2.0f);
    }
  }
  return 0.0f;
}

inline bool valid_dtype(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16; }

inline std::size_t element_bytes(DType t) { return flashtq::dtype_size(t); }

// One past the last element a view addresses (every index tuple counted, strides taken as they are),
// when its dims are >= 1 and its strides >= 0; empty otherwise. Unsigned 128-bit: cannot overflow.
inline std::optional<unsigned __int128> extent_elements(const TensorView& t) {
  unsigned __int128 last = 0;
  for (int d = 0; d < 4; ++d) {
    if (t.shape[d] < 1 || t.strides[d] < 0) return std::nullopt;
    last += (unsigned __int128)(t.shape[d] - 1) * (unsigned __int128)t.strides[d];
  }
  return last + 1;
}

// Index tuples of a view (what a backend loops over), saturated.
inline std::int64_t tuples(const TensorView& t) {
  unsigned __int128 n = 1;
  for (int d = 0; d < 4; ++d) {
    if (t.shape[d] < 1) return 0;
    n *= (unsigned __int128)t.shape[d];
    if (n > (unsigned __int128)kInt64Max) return kInt64Max;
  }
  return std::int64_t(n);
}

// Whether two index tuples of a view address one element: then what a call writes there
// depends on the order of its writes, and the value checks do not apply.
inline bool overlaps(const TensorView& t) {
  std::array<int, 4> dims{0, 1, 2, 3};
  std::sort(dims.begin(), dims.end(), [&](int a, int b) { return t.strides[a] < t.strides[b]; });
  // Distinct (mixed-radix) offsets when each stride passes the largest offset of the dims before it;
  // a view failing that may still be one-to-one, and merely goes unchecked.
  unsigned __int128 span = 0;
  for (int d : dims) {
    if (t.shape[d] < 1) return true;  // not a valid view: nothing to compare either
    if (t.shape[d] == 1) continue;
    if (t.strides[d] < 1 || (unsigned __int128)t.strides[d] <= span) return true;
    span += (unsigned __int128)(t.shape[d] - 1) * (unsigned __int128)t.strides[d];
  }
  return false;
}

// Why docs/spec.md §4 refuses this view on a host backend; empty when it accepts it.
inline std::string view_invalid(const TensorView& t) {
  if (t.memory != Memory::host) return "memory kind";
  if (!valid_dtype(t.dtype)) return "dtype";
  if (t.data == nullptr) return "null";
  if (reinterpret_cast<std::uintptr_t>(t.data) % element_bytes(t.dtype) != 0) return "misaligned";
  for (int d = 0; d < 4; ++d)
    if (t.shape[d] < 1) return "dimension < 1";
  if (t.strides[3] != 1) return "head_dim stride";
  for (int d = 0; d < 3; ++d)
    if (t.strides[d] < 0 || (t.strides[d] == 0 && t.shape[d] > 1)) return "stride";
  const auto e = extent_elements(t);
  if (!e || *e > (unsigned __int128)kInt64Max || *e * element_bytes(t.dtype) > (unsigned __int128)kInt64Max)
    return "extent overflows 64 bits";
  return {};
}

// A host tensor whose allocation is exactly the bytes its view addresses (plus `misalign` bytes in
// front, the view starting there), when that is at most max_bytes; otherwise a small buffer, and the
// view claims more than it has: only a call that is refused may be given it.
struct Tensor {
  TensorView view;
  std::unique_ptr<unsigned char[]> owner;
  std::size_t bytes = 0;     // the view's extent in bytes when it fits
  std::size_t misalign = 0;  // bytes of the allocation before the view's start
  bool fits = false;

  // `null` leaves data null; `misalign` (bytes) shifts the view off the allocation's alignment.
  void allocate(std::size_t max_bytes, bool null, std::size_t shift) {
    misalign = shift;
    const auto e = extent_elements(view);
    const unsigned __int128 size = valid_dtype(view.dtype) ? element_bytes(view.dtype) : 4;
    fits = e && *e * size <= max_bytes && tuples(view) <= std::int64_t(max_bytes);
    bytes = fits ? std::size_t(*e * size) : 64;
    owner.reset(new unsigned char[bytes + misalign]);
    poison();
    view.data = null ? nullptr : owner.get() + misalign;
  }
  void poison() {
    std::memset(owner.get(), 0xFF, bytes + misalign);
  }  // NaN in every dtype: an output never written stays NaN

  template <typename F>
  void for_each(F&& f) const {  // f(b, s, h, d, element index); only when the view fits
    for (std::int64_t b = 0; b < view.shape[0]; ++b)
      for (std::int64_t s = 0; s < view.shape[1]; ++s)
        for (std::int64_t h = 0; h < view.shape[2]; ++h)
          for (std::int64_t d = 0; d < view.shape[3]; ++d)
            f(b, s, h, d, b * view.strides[0] + s * view.strides[1] + h * view.strides[2] + d * view.strides[3]);
  }

  float get(std::int64_t i) const {
    switch (view.dtype) {
      case DType::f32: {
        float x;
        std::memcpy(&x, static_cast<const unsigned char*>(view.data) + 4 * i, 4);
        return x;
      }
      case DType::f16:
      case DType::bf16: {
        std::uint16_t h;
        std::memcpy(&h, static_cast<const unsigned char*>(view.data) + 2 * i, 2);
        return view.dtype == DType::f16 ? flashtq::core::f16_to_f32(h) : flashtq::core::bf16_to_f32(h);
      }
    }
    return 0.0f;
  }
  void set(std::int64_t i, float x) {
    auto* p = static_cast<unsigned char*>(view.data);
    switch (view.dtype) {
      case DType::f32: std::memcpy(p + 4 * i, &x, 4); break;
      case DType::f16: {
        const std::uint16_t h = flashtq::core::f32_to_f16(x);
        std::memcpy(p + 2 * i, &h, 2);
        break;
      }
      case DType::bf16: {
        const std::uint16_t h = flashtq::core::f32_to_bf16(x);
        std::memcpy(p + 2 * i, &h, 2);
        break;
      }
    }
  }
  // Fills every element the view addresses (a view that does not fit, or is null, is left as it is).
  void fill(Rng& rng, Values mode) {
    if (!fits || view.data == nullptr || !valid_dtype(view.dtype) || view.memory != Memory::host) return;
    if (reinterpret_cast<std::uintptr_t>(view.data) % element_bytes(view.dtype) != 0) return;
    for_each([&](auto, auto, auto, auto, std::int64_t i) { set(i, draw_value(rng, mode)); });
  }
};

// Strides of a [B, S, H, D] view: one of the six orders of B, S and H (D innermost, stride 1) with
// up to 3 elements of padding after each dimension; a dimension of size 1 may get stride 0.
inline std::array<std::int64_t, 4> fuzzed_strides(FuzzedDataProvider& fdp, const std::array<std::int64_t, 4>& shape) {
  static constexpr int orders[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
  const int* order = orders[fdp.ConsumeIntegralInRange(0, 5)];
  std::array<std::int64_t, 4> strides{0, 0, 0, 1};
  std::int64_t inner = shape[3] + fdp.ConsumeIntegralInRange(0, 3);
  for (int k = 2; k >= 0; --k) {
    const int d = order[k];
    strides[d] = inner;
    inner = inner * shape[d] + fdp.ConsumeIntegralInRange(0, 3);
  }
  for (int d = 0; d < 3; ++d)
    if (shape[d] == 1 && fdp.ConsumeBool()) strides[d] = 0;
  return strides;
}

// Runs f, which may throw flashtq::Error only; returns the error's argument, or empty on success.
template <typename F>
std::optional<std::string> refused(F&& f) {
  try {
    f();
  } catch (const flashtq::Error& e) {
    return e.argument();
  } catch (const std::exception& e) {
    finding("an exception other than flashtq::Error: %s", e.what());
  } catch (...) {
    finding("an exception that is not a std::exception");
  }
  return std::nullopt;
}

// `harness --write-corpus=DIR` (libFuzzer ignores arguments that start with two dashes) writes the
// harness's seed corpus into DIR and exits, instead of fuzzing; scripts/make_fuzz_corpus.sh runs it.
template <typename Writer>
void write_corpus_if_asked(int argc, char** argv, Writer&& write) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--write-corpus=", 0) == 0) {
      write(arg.substr(15));
      std::exit(0);
    }
  }
}

// Seeds of fixed pseudo-random bytes, of lengths from empty (every choice at its sane default) to 512.
inline void write_random_corpus(const std::string& dir, std::uint64_t seed) {
  Rng rng{seed};
  int i = 0;
  for (std::size_t n : {0, 16, 48, 96, 160, 256, 384, 512}) {
    std::string bytes(n, '\0');
    for (char& c : bytes) c = char(rng.next());
    const std::string path = dir + "/random-" + std::to_string(i++);
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f || std::fwrite(bytes.data(), 1, n, f) != n || std::fclose(f) != 0) finding("cannot write %s", path.c_str());
  }
}

}  // namespace fuzz

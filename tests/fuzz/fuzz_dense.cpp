// libFuzzer harness: dense attention (attention_forward, attention_backward) on the reference and
// cpu backends, with fuzzed shapes, dtypes, strides, pointers, masks and parameters.
//
// An input describes one problem. Its views get buffers of exactly the bytes they address when that
// is small (the fuzzer's sane case); a view that claims more (a fuzzed huge dimension or stride)
// gets a small buffer, and the call must then be refused. The harness states independently, from
// docs/spec.md §4, whether the call is valid, and then requires:
// - every call returns or throws flashtq::Error, nothing else (no crash, no sanitizer report);
// - a call the spec refuses throws on both backends, one it accepts succeeds on both;
// - with finite, moderate inputs every output element is finite (outputs start as NaN, so one never
//   written shows), a row that sees no key writes out = 0 and lse = -inf, a row that sees one has a
//   finite lse, and the cpu forward agrees with the oracle (reference) within docs/spec.md §3.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "flashtq/attention.hpp"
#include "flashtq/backend.hpp"
#include "fuzz_support.hpp"

namespace {

using namespace flashtq;
using fuzz::finding;
using fuzz::Tensor;
using fuzz::Values;

constexpr std::size_t kMaxViewBytes = 256 * 1024;   // 64k f32 elements
constexpr std::int64_t kMaxElements = 16 * 1024;    // per tensor, in the sane shapes drawn
constexpr std::int64_t kMaxWork = 2 * 1024 * 1024;  // B * H * Sq * Sk * D a call may cost
constexpr float kModerateScale = 4.0f;              // |scale| up to this keeps scores far from overflow

// The tensors of one problem, by name, and which the call writes.
enum Which { Q, K, V, OUT, DOUT, DQ, DK, DV, kTensors };
constexpr const char* kNames[kTensors] = {"q", "k", "v", "out", "dout", "dq", "dk", "dv"};
constexpr bool kOutput[kTensors] = {false, false, false, true, false, true, true, true};

struct Problem {
  std::array<Tensor, kTensors> t;
  AttentionParams params;
  std::unique_ptr<unsigned char[]> mask_owner;  // exactly mask_elements floats (+ 1 byte when shifted)
  std::unique_ptr<float[]> lse_owner;           // B * H * Sq floats and one more, for a shifted pointer
  std::unique_ptr<float[]> sinks_owner;         // H floats and one more, for a shifted pointer (or none)
  std::vector<float> dsinks;                    // the backward's sink gradient, H floats
  float* lse = nullptr;
  bool moderate = true;  // the parameters promise finite outputs for moderate inputs
  // Bounds the gradients' size (for f16, whose range ends at 65504).
  double gradient_bound = 0;
};

float* lse_at(Problem& pr, int kind) {  // 0: none, 1: aligned, 2: misaligned
  if (kind == 0) return nullptr;
  auto* p = reinterpret_cast<unsigned char*>(pr.lse_owner.get());
  return reinterpret_cast<float*>(kind == 1 ? p : p + 1);
}

// One fuzzed change that may make the problem invalid or insane.
void mutate(FuzzedDataProvider& fdp, Problem& pr) {
  const int which = fdp.ConsumeIntegralInRange(0, int(OUT));
  TensorView& v = pr.t[which].view;
  switch (fdp.ConsumeIntegralInRange(0, 4)) {
    case 0: v.dtype = DType(fdp.ConsumeIntegral<std::uint8_t>()); break;
    case 1: v.memory = Memory(fdp.ConsumeIntegralInRange<std::uint8_t>(0, 3)); break;
    case 2: v.shape[fdp.ConsumeIntegralInRange(0, 3)] = fuzz::interesting_int64(fdp); break;
    case 3: v.strides[fdp.ConsumeIntegralInRange(0, 3)] = fuzz::interesting_int64(fdp); break;
    case 4:  // a dimension that stays small: shapes that disagree, H not a multiple of Hkv, D > 512
      v.shape[fdp.ConsumeIntegralInRange(0, 3)] = fdp.ConsumeIntegralInRange<std::int64_t>(0, 600);
      break;
  }
}

// docs/spec.md §4 for a dense call: why it is refused, or empty.
std::string call_invalid(const Problem& pr, bool backward) {
  const auto& t = pr.t;
  for (int i = 0; i <= (backward ? DV : OUT); ++i) {
    if (auto why = fuzz::view_invalid(t[i].view); !why.empty()) return std::string(kNames[i]) + ": " + why;
  }
  const auto& q = t[Q].view.shape;
  const auto& k = t[K].view.shape;
  if (k[0] != q[0] || k[3] != q[3]) return "k: batch or head_dim of q";
  if (t[V].view.shape != k) return "v: shape of k";
  if (t[OUT].view.shape != q) return "out: shape of q";
  for (int i : {K, V, OUT})
    if (t[i].view.dtype != t[Q].view.dtype) return std::string(kNames[i]) + ": dtype of q";
  const std::int64_t B = q[0], Sq = q[1], H = q[2], D = q[3], Sk = k[1], Hkv = k[2];
  if (D > 512) return "head_dim > 512";
  if (H % Hkv != 0) return "H % Hkv";
  if (Sq > fuzz::kInt32Max || Sk > fuzz::kInt32Max) return "sequence beyond int32";
  if ((__int128)B * H > fuzz::kInt32Max) return "batch * heads beyond int32";
  const AttentionParams& p = pr.params;
  if (p.scale && !std::isfinite(*p.scale)) return "scale";
  const std::int64_t offset = p.causal_offset.value_or(Sk - Sq);
  // docs/spec.md §4: positions i + causal_offset, i in [0, Sq), within [-2^31, 2^31 - 1], both ends allowed.
  if (offset < -fuzz::kInt32Max - 1 || offset > fuzz::kInt32Max - (Sq - 1)) return "causal_offset";
  if (p.window < 0 || p.window > fuzz::kInt32Max) return "window";
  if (!(p.dropout_p >= 0.0f && p.dropout_p < 1.0f)) return "dropout_p";
  if (!(p.softcap >= 0.0f && std::isfinite(p.softcap))) return "softcap";
  if (p.sinks != nullptr) {
    if (reinterpret_cast<std::uintptr_t>(p.sinks) % alignof(float) != 0) return "sinks misaligned";
    for (std::int64_t h = 0; h < H; ++h) {
      float x;
      std::memcpy(&x, p.sinks + h, sizeof x);
      if (std::isnan(x) || x == INFINITY) return "sinks: NaN or +inf";
    }
  }
  if (p.mask != nullptr) {
    if (reinterpret_cast<std::uintptr_t>(p.mask) % alignof(float) != 0) return "mask misaligned";
    const std::int64_t extent[4] = {B, H, Sq, Sk};
    __int128 last = 0;
    for (int d = 0; d < 4; ++d) {
      if (p.mask_strides[d] < 0) return "mask_strides < 0";
      last += (__int128)(extent[d] - 1) * p.mask_strides[d];
    }
    if (last >= p.mask_elements) return "mask_elements";
  }
  if (!backward && pr.lse != nullptr && reinterpret_cast<std::uintptr_t>(pr.lse) % alignof(float) != 0)
    return "lse misaligned";
  if (backward) {
    const int like[] = {OUT, Q, K, V};
    for (int i = DOUT; i <= DV; ++i) {
      if (t[i].view.shape != t[like[i - DOUT]].view.shape) return std::string(kNames[i]) + ": shape";
      if (t[i].view.dtype != t[Q].view.dtype) return std::string(kNames[i]) + ": dtype";
    }
    if (pr.lse == nullptr || reinterpret_cast<std::uintptr_t>(pr.lse) % alignof(float) != 0) return "lse";
  }
  return {};
}

std::string describe(const Problem& pr, bool backward) {
  std::string s = backward ? "backward" : "forward";
  for (int i = 0; i <= (backward ? DV : OUT); ++i)
    s += std::string(" ") + kNames[i] + " " + fuzz::describe(pr.t[i].view);
  const AttentionParams& p = pr.params;
  s += "; scale " + (p.scale ? fuzz::exact(*p.scale) : "default") + ", causal " + std::to_string(p.causal) +
       ", causal_offset " + (p.causal_offset ? std::to_string(*p.causal_offset) : "default") + ", window " +
       std::to_string(p.window) + ", dropout_p " + fuzz::exact(p.dropout_p) + ", seed " + std::to_string(p.seed);
  if (p.mask)
    s += ", mask strides [" + std::to_string(p.mask_strides[0]) + ", " + std::to_string(p.mask_strides[1]) + ", " +
         std::to_string(p.mask_strides[2]) + ", " + std::to_string(p.mask_strides[3]) + "] of " +
         std::to_string(p.mask_elements);
  if (p.softcap != 0.0f) s += ", softcap " + fuzz::exact(p.softcap);
  if (p.sinks) s += ", sinks";
  s += pr.lse ? ", lse" : ", no lse";
  return s;
}

bool runnable(const Problem& pr, bool backward) {
  for (int i = 0; i <= (backward ? DV : OUT); ++i)
    if (!pr.t[i].fits) return false;
  const auto& q = pr.t[Q].view.shape;
  const __int128 work = (__int128)q[0] * q[1] * q[2] * q[3] * pr.t[K].view.shape[1];
  return work <= kMaxWork;
}

bool visible(const Problem& pr, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
  const AttentionParams& p = pr.params;
  const std::int64_t Sq = pr.t[Q].view.shape[1], Sk = pr.t[K].view.shape[1];
  const std::int64_t pos = i + p.causal_offset.value_or(Sk - Sq);
  if (p.causal && j > pos) return false;
  if (p.window > 0 && std::abs(pos - j) >= p.window) return false;
  if (p.mask != nullptr) {
    const auto& s = p.mask_strides;
    float m;
    std::memcpy(&m, p.mask + (b * s[0] + h * s[1] + i * s[2] + j * s[3]), sizeof m);
    if (m == -INFINITY) return false;
  }
  return true;
}

// The checks of a successful forward whose inputs were moderate.
void check_forward(const Problem& pr, const std::string& backend) {
  const Tensor& out = pr.t[OUT];
  const auto [B, Sq, H, D] = out.view.shape;
  const std::int64_t Sk = pr.t[K].view.shape[1];
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < Sq; ++i) {
        bool any = false;
        for (std::int64_t j = 0; j < Sk && !any; ++j) any = visible(pr, b, h, i, j);
        float sink = -INFINITY;  // a row with a sink has a finite lse even when it sees no key
        if (pr.params.sinks) std::memcpy(&sink, pr.params.sinks + h, sizeof sink);
        const std::int64_t row = b * out.view.strides[0] + i * out.view.strides[1] + h * out.view.strides[2];
        for (std::int64_t d = 0; d < D; ++d) {
          const float x = out.get(row + d);
          if (!std::isfinite(x)) finding("%s forward: out[%ld, %ld, %ld, %ld] = %g", backend.c_str(), b, i, h, d, x);
          if (!any && x != 0.0f)
            finding("%s forward: row (%ld, %ld, %ld) sees no key but out = %g", backend.c_str(), b, i, h, x);
        }
        if (pr.lse != nullptr) {
          const float l = pr.lse[(b * H + h) * Sq + i];
          if ((any || sink != -INFINITY) ? !std::isfinite(l) : l != -INFINITY)
            finding("%s forward: lse[%ld, %ld, %ld] = %g (the row %s)", backend.c_str(), b, h, i, l,
                    any                 ? "sees a key"
                    : sink != -INFINITY ? "sees none but has a sink"
                                        : "sees none");
        }
      }
}

void check_finite(const Tensor& t, const char* what, const std::string& backend) {
  t.for_each([&](std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d, std::int64_t i) {
    const float x = t.get(i);
    if (!std::isfinite(x)) finding("%s backward: %s[%ld, %ld, %ld, %ld] = %g", backend.c_str(), what, b, s, h, d, x);
  });
}

std::vector<float> read_all(const Tensor& t) {
  std::vector<float> x;
  t.for_each([&](auto, auto, auto, auto, std::int64_t i) { x.push_back(t.get(i)); });
  return x;
}

// docs/spec.md §3's bar: ||x - ref|| <= tol * max(||ref||, floor), over the finite entries; an entry
// that is -inf in the reference is -inf exactly. `conditioning` is added to f32's tolerance (score_conditioning).
void compare(const std::vector<float>& x, const std::vector<float>& ref, DType dtype, const char* what,
             double floor = 0, double conditioning = 0) {
  const double tol = dtype == DType::f32 ? 1e-5 + conditioning : dtype == DType::f16 ? 2e-3 : 1e-2;
  double err = 0, norm = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (ref[i] == -INFINITY || x[i] == -INFINITY) {
      if (x[i] != ref[i]) finding("cpu %s[%zu] = %g, the reference's %g", what, i, x[i], ref[i]);
      continue;
    }
    err += (double(x[i]) - ref[i]) * (double(x[i]) - ref[i]);
    norm += double(ref[i]) * ref[i];
  }
  const double denominator = std::max(std::sqrt(norm), floor);
  if (std::sqrt(err) > tol * denominator + 1e-30)
    finding("cpu %s differs from the reference: error %g, relative to %g: %g > %g", what, std::sqrt(err), denominator,
            std::sqrt(err) / denominator, tol);
}

// docs/spec.md §3 (fuzzing): an f32 score carries a rounding error of about 2^-24 of the largest |score| a row
// can reach, |scale| max_i |q_i| max_j |k_j| (Cauchy-Schwarz), and the softmax passes it on to the weights; with the
// fuzzer's |scale| up to 4 and D up to 512 that alone exceeds 1e-5 (fuzz_dense found the cpu forward at D = 415 off
// by 1.15e-5). So the forward's f32 tolerance here grows by 4 * 2^-24 of that bound; for the conformance suite's
// N(0, 1) inputs at the default scale it stays under 2e-6, and the suite keeps 1e-5.
double score_conditioning(const Problem& pr) {
  auto largest_row = [](const Tensor& t) {
    std::map<std::array<std::int64_t, 3>, double> squares;
    t.for_each([&](std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t, std::int64_t i) {
      const double x = t.get(i);
      squares[{b, s, h}] += x * x;
    });
    double m = 0;
    for (const auto& [row, sq] : squares) m = std::max(m, std::sqrt(sq));
    return m;
  };
  const double D = double(pr.t[Q].view.shape[3]);
  const double scale = pr.params.scale ? std::abs(double(*pr.params.scale)) : 1.0 / std::sqrt(D);
  return 4.0 * std::ldexp(1.0, -24) * scale * largest_row(pr.t[Q]) * largest_row(pr.t[K]);
}

Problem draw(FuzzedDataProvider& fdp) {
  Problem pr;
  // Sane shapes first: every tensor small, the call cheap.
  static constexpr std::int64_t dims[] = {1,  2,  3,  4,   7,   8,   16,  31,  32,  33,
                                          64, 65, 96, 127, 128, 129, 255, 256, 257, 512};
  const std::int64_t D = fdp.ConsumeBool() ? fdp.PickValueInArray(dims) : fdp.ConsumeIntegralInRange(1, 512);
  const std::int64_t B = fdp.ConsumeIntegralInRange(1, 3), Hkv = fdp.ConsumeIntegralInRange(1, 3);
  const std::int64_t H = Hkv * fdp.ConsumeIntegralInRange(1, 3);
  const std::int64_t max_s = std::max<std::int64_t>(1, std::min<std::int64_t>(48, kMaxElements / (B * H * D)));
  const std::int64_t Sq = fdp.ConsumeIntegralInRange<std::int64_t>(1, max_s);
  const std::int64_t Sk = fdp.ConsumeIntegralInRange<std::int64_t>(1, max_s);
  const DType dtype = DType(fdp.ConsumeIntegralInRange(0, 2));
  for (int i = 0; i < kTensors; ++i) {
    const bool kv = i == K || i == V || i == DK || i == DV;
    TensorView& v = pr.t[i].view;
    v.dtype = dtype;
    v.shape = {B, kv ? Sk : Sq, kv ? Hkv : H, D};
    // Inputs may use any layout; outputs do not overlap themselves (the row checks read them back).
    v.strides = fuzz::fuzzed_strides(fdp, v.shape);
    if (!kOutput[i] && fuzz::rarely(fdp, 0.1f)) {
      for (int d = 0; d < 3; ++d) v.strides[d] = fdp.ConsumeIntegralInRange<std::int64_t>(0, 2 * v.strides[d] + 2);
    }
  }

  AttentionParams& p = pr.params;
  switch (fdp.ConsumeIntegralInRange(0, 3)) {
    case 0: break;
    case 1: p.scale = fdp.ConsumeFloatingPointInRange(-kModerateScale, kModerateScale); break;
    case 2:
    case 3: p.scale = fuzz::interesting_float(fdp); break;
  }
  p.causal = fdp.ConsumeBool();
  switch (fdp.ConsumeIntegralInRange(0, 3)) {
    case 0: break;
    case 1: p.causal_offset = 0; break;
    case 2: p.causal_offset = fdp.ConsumeIntegralInRange<std::int64_t>(-Sq - 2, Sk + 2); break;
    case 3: p.causal_offset = fuzz::interesting_int64(fdp); break;
  }
  switch (fdp.ConsumeIntegralInRange(0, 3)) {
    case 0:
    case 1: break;
    case 2: p.window = fdp.ConsumeIntegralInRange<std::int64_t>(1, Sk + 2); break;
    case 3: p.window = fuzz::interesting_int64(fdp); break;
  }
  switch (fdp.ConsumeIntegralInRange(0, 3)) {
    case 0:
    case 1: break;
    case 2: p.dropout_p = fdp.ConsumeFloatingPointInRange(0.0f, 0.9f); break;
    case 3: p.dropout_p = fuzz::interesting_float(fdp); break;
  }
  p.seed = fdp.ConsumeIntegral<std::uint32_t>();
  p.allow_tf32 = fdp.ConsumeBool();
  p.pedantic_f32 = fdp.ConsumeBool();
  pr.moderate = (!p.scale || std::abs(*p.scale) <= kModerateScale) && p.dropout_p <= 0.9f;

  if (fdp.ConsumeBool()) {  // a mask: broadcast over any of (b, h, i, j), or with fuzzed strides
    const std::int64_t extent[4] = {B, H, Sq, Sk};
    std::int64_t n = 1;
    for (int d = 3; d >= 0; --d) {
      const bool broadcast = fdp.ConsumeBool();
      p.mask_strides[d] = broadcast ? 0 : n;
      if (!broadcast) n *= extent[d];
    }
    n += fdp.ConsumeIntegralInRange(0, 3);
    std::int64_t elements = n;
    if (fuzz::rarely(fdp, 0.2f)) {
      p.mask_strides[fdp.ConsumeIntegralInRange(0, 3)] = fuzz::interesting_int64(fdp);
    }
    if (fuzz::rarely(fdp, 0.2f)) elements = fdp.ConsumeIntegralInRange<std::int64_t>(-1, n);
    const bool misaligned = fuzz::rarely(fdp, 0.1f);
    // The allocation holds exactly `elements` floats (and the byte the pointer is shifted by).
    const std::size_t count = std::size_t(std::max<std::int64_t>(elements, 0));
    pr.mask_owner.reset(new unsigned char[4 * count + 1]);
    unsigned char* base = pr.mask_owner.get() + (misaligned ? 1 : 0);
    fuzz::Rng rng{fdp.ConsumeIntegral<std::uint64_t>()};
    const int mode = fdp.ConsumeIntegralInRange(0, 3);  // moderate, some -inf, all -inf, special
    for (std::size_t i = 0; i < count; ++i) {
      float m = rng.uniform(-8.0f, 8.0f);
      if ((mode == 1 && rng.next() % 4 == 0) || mode == 2) m = -INFINITY;
      if (mode == 3) m = fuzz::draw_value(rng, Values::special);
      std::memcpy(base + 4 * i, &m, 4);
    }
    if (mode == 3) pr.moderate = false;
    p.mask = reinterpret_cast<const float*>(base);
    p.mask_elements = elements;
  }
  // The gradients' magnitude: |dS| sums to at most 8 D / (1 - p) over a row (|x| <= 2), dq and dk
  // take scale times that times |q| or |k|, over every row and head of a group for dk.
  const double scale = p.scale ? std::abs(double(*p.scale)) : 1.0 / std::sqrt(double(D));
  pr.gradient_bound = 16.0 * D * std::max(scale, 1.0) / (1.0 - std::min(p.dropout_p, 0.9f)) * double(Sq * (H / Hkv));
  return pr;
}

void allocate(FuzzedDataProvider& fdp, Problem& pr, Values values, std::uint64_t seed) {
  for (int i = 0; i < kTensors; ++i) {
    const int how = fuzz::rarely(fdp, 0.05f) ? fdp.ConsumeIntegralInRange(1, 3) : 0;
    pr.t[i].allocate(kMaxViewBytes, how == 1, how == 2 ? 1 : how == 3 ? 2 : 0);
  }
  fuzz::Rng rng{seed};
  for (int i : {Q, K, V, DOUT}) pr.t[i].fill(rng, values);
}

void run(const uint8_t* data, size_t size) {
  FuzzedDataProvider fdp(data, size);
  Problem pr = draw(fdp);
  const Values values = Values(fdp.ConsumeIntegralInRange(0, 3));
  const std::uint64_t seed = fdp.ConsumeIntegral<std::uint64_t>();
  const int threads = fdp.ConsumeIntegralInRange(1, 3);
  const int n_forward = !fuzz::rarely(fdp, 0.5f) ? 0 : fdp.ConsumeIntegralInRange(1, 3);
  for (int i = 0; i < n_forward; ++i) mutate(fdp, pr);
  const int forward_lse = fuzz::rarely(fdp, 0.05f) ? 2 : fdp.ConsumeIntegralInRange(0, 1);
  allocate(fdp, pr, values, seed);
  {
    const auto& q = pr.t[Q].view.shape;
    // Step by step: three drawn extents of up to 2^63 overflow even a 128-bit product.
    std::int64_t rows = 1;
    bool small = true;
    for (int d = 0; d < 3 && small; ++d) {
      small = q[d] > 0 && q[d] <= std::int64_t(kMaxViewBytes / 4) / rows;
      if (small) rows *= q[d];
    }
    pr.lse_owner.reset(new float[small ? std::size_t(rows) + 1 : 16]);
  }
  pr.lse = lse_at(pr, forward_lse);
  // Softcap and sinks (docs/spec.md §1.8, §1.9), drawn after the mutations: the sinks' buffer holds q's final H.
  switch (fdp.ConsumeIntegralInRange(0, 3)) {
    case 0:
    case 1: break;
    case 2: pr.params.softcap = fdp.ConsumeFloatingPointInRange(0.05f, 60.0f); break;
    case 3: pr.params.softcap = fuzz::interesting_float(fdp); break;
  }
  if (const std::int64_t H = pr.t[Q].view.shape[2]; H > 0 && H <= 1024 && fdp.ConsumeBool()) {
    pr.sinks_owner.reset(new float[std::size_t(H) + 1]);
    const bool misaligned = fuzz::rarely(fdp, 0.1f);
    unsigned char* base = reinterpret_cast<unsigned char*>(pr.sinks_owner.get()) + (misaligned ? 1 : 0);
    fuzz::Rng rng{fdp.ConsumeIntegral<std::uint64_t>()};
    const int mode = fdp.ConsumeIntegralInRange(0, 2);  // moderate, some -inf, special
    for (std::int64_t h = 0; h < H; ++h) {
      float x = rng.uniform(-4.0f, 4.0f);
      if (mode == 1 && rng.next() % 3 == 0) x = -INFINITY;
      if (mode == 2) x = fuzz::draw_value(rng, Values::special);
      std::memcpy(base + 4 * h, &x, 4);
    }
    pr.params.sinks = reinterpret_cast<const float*>(base);
    pr.dsinks.assign(std::size_t(H), NAN);
  }
  const bool moderate = pr.moderate && (values == Values::moderate || values == Values::zeros);

  Backend& reference = backend("reference");
  Backend& cpu = backend("cpu");
  cpu.set_threads(threads);

  const std::string why = call_invalid(pr, false);
  fuzz::context = describe(pr, false) + ", cpu threads " + std::to_string(threads) + " (" +
                  (why.empty() ? "valid" : "refused: " + why) + ")";
  if (why.empty() && !runnable(pr, false)) {
    fuzz::stats.count(0, "forward valid, too large to run (skipped)");
    return;  // not this harness's business
  }
  if (why.empty()) fuzz::stats.count(moderate ? 1 : 2, moderate ? "forward valid, outputs checked" : "forward valid");
  if (!why.empty()) fuzz::stats.count(3, "forward refused");

  // The reference first (its out kept for the comparison), then the cpu backend on the same views.
  std::vector<float> ref_out, ref_lse;
  const std::size_t lse_size = std::size_t(std::max<std::int64_t>(0, pr.t[Q].view.shape[0])) *
                               std::size_t(std::max<std::int64_t>(0, pr.t[Q].view.shape[1])) *
                               std::size_t(std::max<std::int64_t>(0, pr.t[Q].view.shape[2]));
  for (Backend* be : {&reference, &cpu}) {
    if (why.empty()) {
      pr.t[OUT].poison();
      if (pr.lse) std::fill_n(pr.lse, pr.t[Q].view.shape[0] * pr.t[Q].view.shape[1] * pr.t[Q].view.shape[2], NAN);
    }
    const ForwardArgs args{pr.t[Q].view, pr.t[K].view, pr.t[V].view, pr.t[OUT].view, pr.lse, nullptr};
    const auto error = fuzz::refused([&] { attention_forward(*be, args, pr.params); });
    if (!why.empty() && !error)
      finding("%s forward accepted a call the spec refuses (%s)", be->name().c_str(), why.c_str());
    if (why.empty() && error)
      finding("%s forward refused a valid call (argument '%s')", be->name().c_str(), error->c_str());
    if (!why.empty()) continue;
    // An output that overlaps itself holds whichever write came last: finite, but not comparable.
    const bool comparable = moderate && !fuzz::overlaps(pr.t[OUT].view);
    if (comparable) check_forward(pr, be->name());
    if (be == &reference) {
      ref_out = read_all(pr.t[OUT]);
      if (pr.lse) ref_lse.assign(pr.lse, pr.lse + lse_size);
    } else if (comparable) {
      compare(read_all(pr.t[OUT]), ref_out, pr.t[Q].view.dtype, "out", 0, score_conditioning(pr));
      // lse's floor is 1 nat per row (docs/spec.md §3): a single key's cancelling score is compared absolutely.
      if (pr.lse)
        compare(std::vector<float>(pr.lse, pr.lse + lse_size), ref_lse, pr.t[Q].view.dtype, "lse",
                std::sqrt(double(lse_size)));
    }
  }
  if (!why.empty()) return;

  // The backward, from the cpu forward's out and lse (the same parameters), with changes of its own.
  if (pr.lse == nullptr) {
    pr.lse = lse_at(pr, 1);
    const ForwardArgs args{pr.t[Q].view, pr.t[K].view, pr.t[V].view, pr.t[OUT].view, pr.lse, nullptr};
    if (fuzz::refused([&] { attention_forward(cpu, args, pr.params); })) finding("cpu forward refused an lse");
  }
  const int n_backward = !fuzz::rarely(fdp, 0.5f) ? 0 : fdp.ConsumeIntegralInRange(1, 2);
  const bool params_changed = n_backward > 0 && fdp.ConsumeBool();
  for (int i = 0; i < n_backward; ++i) {
    // Only the backward's own tensors (and lse) change: q, k, v and out hold the forward's.
    const int which = fdp.ConsumeIntegralInRange(int(DOUT), int(DV) + 1);
    if (which == DV + 1) {
      pr.lse = lse_at(pr, fdp.ConsumeBool() ? 0 : 2);
      continue;
    }
    Tensor& t = pr.t[which];
    switch (fdp.ConsumeIntegralInRange(0, 4)) {
      case 0: t.view.dtype = DType(fdp.ConsumeIntegral<std::uint8_t>()); break;
      case 1: t.view.memory = Memory(fdp.ConsumeIntegralInRange<std::uint8_t>(0, 3)); break;
      case 2: t.view.shape[fdp.ConsumeIntegralInRange(0, 3)] = fuzz::interesting_int64(fdp); break;
      case 3: t.view.strides[fdp.ConsumeIntegralInRange(0, 3)] = fuzz::interesting_int64(fdp); break;
      case 4: t.view.data = nullptr; break;
    }
    // The changed view claims what it claims; its buffer stays (too small for it, perhaps).
    const auto e = fuzz::extent_elements(t.view);
    t.fits = t.fits && e && fuzz::valid_dtype(t.view.dtype) && *e * fuzz::element_bytes(t.view.dtype) <= t.bytes &&
             fuzz::tuples(t.view) <= std::int64_t(kMaxViewBytes);
  }
  if (params_changed) pr.params.causal = !pr.params.causal;  // the lse then belongs to another problem
  const std::string bwhy = call_invalid(pr, true);
  fuzz::context = describe(pr, true) + " (" + (bwhy.empty() ? "valid" : "refused: " + bwhy) + ")";
  if (bwhy.empty() && !runnable(pr, true)) return;
  const bool check = moderate && !params_changed && (pr.t[Q].view.dtype != DType::f16 || pr.gradient_bound < 6e4);
  // Gradients that overlap themselves hold whichever write came last: finite, not comparable.
  const bool comparable =
      !fuzz::overlaps(pr.t[DQ].view) && !fuzz::overlaps(pr.t[DK].view) && !fuzz::overlaps(pr.t[DV].view);
  const std::int64_t D = pr.t[Q].view.shape[3];
  const double scale = pr.params.scale ? std::abs(double(*pr.params.scale)) : 1.0 / std::sqrt(double(D));
  const double conditioning = score_conditioning(pr);
  std::array<std::vector<float>, 3> ref_grads;
  std::vector<float> ref_dsinks;
  if (bwhy.empty()) fuzz::stats.count(check ? 4 : 5, check ? "backward valid, outputs checked" : "backward valid");
  if (!bwhy.empty()) fuzz::stats.count(6, "backward refused");
  for (Backend* be : {&reference, &cpu}) {
    for (int i : {DQ, DK, DV}) pr.t[i].poison();
    BackwardArgs args;
    args.q = pr.t[Q].view;
    args.k = pr.t[K].view;
    args.v = pr.t[V].view;
    args.out = pr.t[OUT].view;
    args.dout = pr.t[DOUT].view;
    args.dq = pr.t[DQ].view;
    args.dk = pr.t[DK].view;
    args.dv = pr.t[DV].view;
    args.lse = pr.lse;
    if (pr.params.sinks) {
      std::fill(pr.dsinks.begin(), pr.dsinks.end(), NAN);
      args.dsinks = pr.dsinks.data();
    }
    const auto error = fuzz::refused([&] { attention_backward(*be, args, pr.params); });
    if (!bwhy.empty() && !error)
      finding("%s backward accepted a call the spec refuses (%s)", be->name().c_str(), bwhy.c_str());
    if (bwhy.empty() && error)
      finding("%s backward refused a valid call (argument '%s')", be->name().c_str(), error->c_str());
    if (!bwhy.empty() || !check) continue;
    check_finite(pr.t[DQ], "dq", be->name());
    check_finite(pr.t[DK], "dk", be->name());
    check_finite(pr.t[DV], "dv", be->name());
    for (float x : pr.dsinks)
      if (!std::isfinite(x)) finding("%s backward: dsinks has %g", be->name().c_str(), x);
    if (be == &reference) ref_dsinks = pr.dsinks;
    // dsinks sums -P_sink * D_i (|D_i| <= |dout| |out| <= 4 D) over B * Sq rows: compared at a floor of that size.
    if (be != &reference && !pr.dsinks.empty())
      compare(pr.dsinks, ref_dsinks, pr.t[Q].view.dtype, "dsinks",
              0.1 * double(D) * std::sqrt(double(pr.t[Q].view.shape[0] * pr.t[Q].view.shape[1])));
    if (!comparable) continue;
    for (int i : {DQ, DK, DV}) {
      if (be == &reference) {
        ref_grads[i - DQ] = read_all(pr.t[i]);
        continue;
      }
      // §3's floor for a gradient: 0.1 * scale * D * sqrt(n) / (1 - dropout_p), its natural size for inputs of
      // unit size (dropout's kept weights, 1 / (1 - p) each, scale dP and dV). The backward recomputes P from
      // f32 scores, so the gradients inherit the forward's score rounding (score_conditioning; fuzz_dense found
      // the cpu's dq off by 1.16e-5).
      const double n = double(ref_grads[i - DQ].size());
      const double keep = 1.0 / (1.0 - double(pr.params.dropout_p));
      compare(read_all(pr.t[i]), ref_grads[i - DQ], pr.t[Q].view.dtype, kNames[i],
              0.1 * scale * double(D) * std::sqrt(n) * keep, conditioning);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  fuzz::write_corpus_if_asked(*argc, *argv, [](const std::string& dir) { fuzz::write_random_corpus(dir, 1); });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  run(data, size);
  return 0;
}

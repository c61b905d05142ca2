// Conformance checks of dense forward, backward and dropout against the double oracle.
#include <chrono>
#include <cmath>
#include <limits>
#include <sstream>

#include "conformance/conformance.hpp"
#include "conformance/device_buffer.hpp"
#include "conformance/host_tensor.hpp"
#include "core/hash3.hpp"
#include "core/visibility.hpp"
#include "core/validate.hpp"
#include "reference/dense.hpp"

namespace flashtq::conformance {

double tolerance(DType dtype, bool tf32) {
  switch (dtype) {
    case DType::f32: return tf32 ? 2e-3 : 1e-5;
    case DType::f16: return 2e-3;
    case DType::bf16: return 1e-2;
  }
  return 0;
}

const char* extreme_name(Extreme e) {
  switch (e) {
    case Extreme::none: return "none";
    case Extreme::hidden_non_finite: return "hidden_non_finite";
    case Extreme::large_scores: return "large_scores";
    case Extreme::scores_past_masked: return "scores_past_masked";
    case Extreme::scores_past_f32: return "scores_past_f32";
  }
  return "?";
}

std::string DenseCase::describe() const {
  std::ostringstream s;
  s << dtype_name(dtype) << " B" << B << " Sq" << Sq << " Sk" << Sk << " H" << H << "/" << Hkv << " D" << D;
  if (causal) s << " causal";
  if (causal_offset) s << " off" << *causal_offset;
  if (window) s << " win" << window;
  if (mask) s << " mask" << mask_broadcast[0] << mask_broadcast[1] << mask_broadcast[2] << mask_broadcast[3];
  if (dropout_p > 0) s << " drop" << dropout_p;
  if (bhsd_layout) s << " bhsd";
  if (scale) s << " scale" << *scale;
  if (tf32) s << " tf32";
  if (pedantic) s << " pedantic";
  if (softcap > 0) s << " softcap" << softcap;
  if (sinks) s << " sinks";
  if (extreme != Extreme::none) s << " " << extreme_name(extreme);
  s << " seed=" << seed << " data_seed=" << data_seed;
  return s.str();
}

DenseProblem DenseCase::shape() const {
  DenseProblem p;
  p.B = B;
  p.Sq = Sq;
  p.Sk = Sk;
  p.H = H;
  p.Hkv = Hkv;
  p.D = D;
  p.dtype = dtype;
  p.softcap = softcap;
  // Backends read only whether there are sinks, never their values.
  static const float kSinksMarker = 0.0f;
  p.sinks = sinks ? &kSinksMarker : nullptr;
  return p;
}

namespace {

// Values as an output of `dtype` can hold them: beyond the dtype's largest finite value (an infinity
// included) the value of that largest magnitude and the same sign. An f16 gradient whose exact value is 87644
// is rightly stored as +inf, and one computed as 65184 in f32 is as right; saturating both sides compares them
// as the dtype allows, while a NaN, or an infinity where the oracle is well inside the range, still counts.
std::vector<double> saturated(DType dtype, std::vector<double> x) {
  const double largest = dtype == DType::f16    ? 65504.0
                         : dtype == DType::bf16 ? 0x1.fep127
                                                : double(std::numeric_limits<float>::max());
  for (double& v : x)
    if (std::fabs(v) > largest) v = std::copysign(largest, v);
  return x;
}

std::vector<double> to_double(const std::vector<float>& x) { return {x.begin(), x.end()}; }

// Everything one case needs on the host: inputs, the mask, and the params.
struct DenseInputs {
  HostTensor q, k, v;
  std::vector<float> mask, sinks;
  AttentionParams params;

  explicit DenseInputs(const DenseCase& c)
      : q({c.B, c.Sq, c.H, c.D}, c.dtype, c.bhsd_layout),
        k({c.B, c.Sk, c.Hkv, c.D}, c.dtype, c.bhsd_layout),
        v({c.B, c.Sk, c.Hkv, c.D}, c.dtype, c.bhsd_layout) {
    std::mt19937_64 rng(c.data_seed);
    q.fill_normal(rng);
    k.fill_normal(rng);
    v.fill_normal(rng);
    params.scale = c.scale;
    params.causal = c.causal;
    params.causal_offset = c.causal_offset;
    params.window = c.window;
    params.dropout_p = c.dropout_p;
    params.seed = c.seed;
    params.allow_tf32 = c.tf32;
    params.pedantic_f32 = c.pedantic;
    params.softcap = c.softcap;
    if (c.sinks) {
      // Logits around a row's typical scores (N(0, 1) inputs: scores ~ N(0, 1)), so the sink takes a real
      // share of the softmax; one head in four has none.
      std::normal_distribution<float> logit(1.0f, 1.5f);
      sinks.resize(std::size_t(c.H));
      for (float& x : sinks) x = rng() % 4 == 0 ? -std::numeric_limits<float>::infinity() : logit(rng);
      params.sinks = sinks.data();
    }
    if (c.mask || c.extreme == Extreme::hidden_non_finite) {
      // A full [B, H, Sq, Sk] block; broadcast dimensions get stride 0 and read its first slice.
      const std::array<std::int64_t, 4> extent{c.B, c.H, c.Sq, c.Sk};
      std::int64_t stride = 1;
      for (int d = 3; d >= 0; --d) {
        params.mask_strides[std::size_t(d)] = c.mask_broadcast[std::size_t(d)] ? 0 : stride;
        stride *= extent[std::size_t(d)];
      }
      mask.resize(std::size_t(stride));
      std::normal_distribution<float> dist(0.0f, 1.0f);
      std::uniform_real_distribution<double> u(0.0, 1.0);
      for (float& m : mask) m = u(rng) < c.mask_neg_inf_rate ? -std::numeric_limits<float>::infinity() : dist(rng);
      params.mask_elements = std::int64_t(mask.size());
      params.mask = mask.data();
    }
    make_extreme(c, rng);
  }

  // Rewrites the drawn inputs for the case's Extreme kind.
  void make_extreme(const DenseCase& c, std::mt19937_64& rng) {
    switch (c.extreme) {
      case Extreme::none:
      case Extreme::large_scores:
      case Extreme::scores_past_f32: return;  // the case's scale does it
      case Extreme::scores_past_masked: {
        // Rows of alternating sign against keys of one sign: half the rows score at most -1e30 everywhere.
        q.map([](std::int64_t, std::int64_t i, std::int64_t h, float x) {
          return (i + h) % 2 ? std::fabs(x) : -std::fabs(x);
        });
        k.map([](std::int64_t, std::int64_t, std::int64_t, float x) { return -std::fabs(x); });
        return;
      }
      case Extreme::hidden_non_finite: {
        // Mask some key columns for every row, then poison every key that no row sees.
        std::uniform_real_distribution<double> u(0.0, 1.0);
        const auto mask_at = [&](std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) -> float& {
          return mask[std::size_t(b * params.mask_strides[0] + h * params.mask_strides[1] + i * params.mask_strides[2] +
                                  j * params.mask_strides[3])];
        };
        for (std::int64_t j = 0; j < c.Sk; ++j) {
          if (u(rng) >= 0.2) continue;
          for (std::int64_t b = 0; b < c.B; ++b)
            for (std::int64_t h = 0; h < c.H; ++h)
              for (std::int64_t i = 0; i < c.Sq; ++i) mask_at(b, h, i, j) = -std::numeric_limits<float>::infinity();
        }
        const DenseProblem p = problem();
        const float poison[3] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                                 -std::numeric_limits<float>::infinity()};
        for (std::int64_t b = 0; b < c.B; ++b)
          for (std::int64_t hk = 0; hk < c.Hkv; ++hk)
            for (std::int64_t j = 0; j < c.Sk; ++j) {
              bool seen = false;
              for (std::int64_t h = hk * p.group(); h < (hk + 1) * p.group() && !seen; ++h)
                for (std::int64_t i = 0; i < c.Sq && !seen; ++i)
                  seen = core::key_visible(p, i, j) && mask_at(b, h, i, j) != -std::numeric_limits<float>::infinity();
              if (seen) continue;
              const std::uint64_t kind = rng();
              k.set_row(b, j, hk, [&](std::int64_t d) { return poison[(kind + std::uint64_t(d)) % 3]; });
              v.set_row(b, j, hk, [&](std::int64_t d) { return poison[(kind + std::uint64_t(d) + 1) % 3]; });
            }
        return;
      }
    }
  }

  // What f32 arithmetic cannot resolve at large scores, added to the tolerance of large_scores cases:
  // a score rounds to about sqrt(D) * 2^-24 of the magnitudes it sums (scale * sum |q_d k_d|), and a
  // probability exp(s - lse) and so every output inherit that error (docs/spec.md §3).
  double large_score_allowance(const DenseCase& c) const {
    if (c.extreme != Extreme::large_scores) return 0;
    const std::vector<double> qv = q.values(), kv = k.values();
    const DenseProblem p = problem();
    double magnitude = 0;
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t i = 0; i < c.Sq; ++i)
        for (std::int64_t h = 0; h < c.H; ++h)
          for (std::int64_t j = 0; j < c.Sk; ++j) {
            const double* qi = qv.data() + ((b * c.Sq + i) * c.H + h) * c.D;
            const double* kj = kv.data() + ((b * c.Sk + j) * c.Hkv + h / p.group()) * c.D;
            double sum = 0;
            for (std::int64_t d = 0; d < c.D; ++d) sum += std::fabs(qi[d] * kj[d]);
            magnitude = std::max(magnitude, std::fabs(double(p.scale)) * sum);
          }
    // A score is rounded to the unit roundoff of the products that make it: f32's 2^-24, TF32's 2^-11.
    return 4 * std::sqrt(double(c.D)) * std::ldexp(magnitude, c.tf32 ? -11 : -24);
  }

  DenseProblem problem() const {
    HostTensor out(q);
    return core::validate_forward(backend("reference"), {q.view, k.view, v.view, out.view}, params).p;
  }
};

// The backend's copy of one case's inputs.
struct DeviceInputs {
  DeviceBuffer q, k, v, mask, sinks;
  AttentionParams params;
  DeviceInputs(Backend& b, const DenseInputs& in)
      : q(b, in.q.bytes), k(b, in.k.bytes), v(b, in.v.bytes), mask(b, in.mask), sinks(b, in.sinks), params(in.params) {
    if (in.params.mask) params.mask = static_cast<const float*>(mask.get());
    if (in.params.sinks) params.sinks = static_cast<const float*>(sinks.get());
  }
};

struct OracleForward {
  std::vector<double> out, lse;
};

OracleForward oracle_forward(const DenseInputs& in) {
  const DenseProblem p = in.problem();
  OracleForward o;
  o.out.resize(std::size_t(p.B * p.Sq * p.H * p.D));
  o.lse.resize(std::size_t(p.B * p.H * p.Sq));
  reference::dense_forward(p, in.q.values().data(), in.k.values().data(), in.v.values().data(), o.out.data(),
                           o.lse.data());
  return o;
}

}  // namespace

CheckResult check_forward(Backend& backend, const DenseCase& c) {
  CheckResult r{"forward", c.describe(), 0, tolerance(c.dtype, c.tf32), false, "", 0, ""};
  const DenseInputs in(c);
  r.tolerance += in.large_score_allowance(c);
  const OracleForward ref = oracle_forward(in);

  HostTensor out(in.q);
  out.poison();
  std::vector<float> lse(std::size_t(c.B * c.H * c.Sq), std::numeric_limits<float>::quiet_NaN());
  DeviceInputs dev(backend, in);
  DeviceBuffer dout(backend, out.bytes), dlse(backend, lse);
  ForwardArgs args{in.q.on(dev.q.get(), backend.memory()),
                   in.k.on(dev.k.get(), backend.memory()),
                   in.v.on(dev.v.get(), backend.memory()),
                   out.on(dout.get(), backend.memory()),
                   c.lse ? static_cast<float*>(dlse.get()) : nullptr,
                   nullptr};
  // The workspace its fastest plan asks for, poisoned (all bytes 0xFF: NaN floats): nothing may read what no
  // kernel wrote.
  const std::size_t workspace_bytes = attention_forward_workspace_bytes(backend, args, dev.params);
  DeviceBuffer workspace(backend, std::vector<std::uint8_t>(workspace_bytes, 0xFF));
  args.workspace = workspace_bytes ? workspace.get() : nullptr;
  args.workspace_bytes = workspace_bytes;
  const auto t0 = std::chrono::steady_clock::now();
  attention_forward(backend, args, dev.params);
  backend.synchronize();
  r.seconds = seconds_since(t0);
  r.kernel = backend.last_kernel();
  out.assign(dout.read<std::uint8_t>());
  r.error = relative_error(saturated(c.dtype, ref.out), saturated(c.dtype, out.values()), r.detail);
  if (c.lse) {
    std::string lse_detail;
    // lse is stored in f32: the oracle's past f32's range is +inf there too.
    std::vector<double> ref_lse(ref.lse.size());
    for (std::size_t i = 0; i < ref_lse.size(); ++i) ref_lse[i] = double(float(ref.lse[i]));
    // Floor of 1 nat per row (docs/spec.md §3): a row whose lse cancels to nearly 0 (one key whose score
    // cancels) is held to the dtype's bound in absolute terms, which bounds every probability's relative error.
    const double lse_err = relative_error(ref_lse, to_double(dlse.read<float>()), lse_detail, 1.0);
    if (lse_err > r.error) {
      r.error = lse_err;
      r.detail = "lse " + lse_detail;
    }
  }
  r.passed = r.error <= r.tolerance;
  return r;
}

CheckResult check_backward(Backend& backend, const DenseCase& c, bool with_workspace) {
  CheckResult r{"backward", c.describe(), 0, tolerance(c.dtype, c.tf32), false, "", 0, ""};
  const DenseInputs in(c);
  r.tolerance += in.large_score_allowance(c);
  const DenseProblem p = in.problem();
  const OracleForward fwd = oracle_forward(in);
  // Both sides get the same out (rounded to the dtype), lse (f32) and a random dout.
  HostTensor out(in.q), dout(in.q);
  out.fill(fwd.out);
  std::mt19937_64 rng(c.data_seed ^ 0xD0D0D0D0ull);
  dout.fill_normal(rng);
  std::vector<float> lse(fwd.lse.begin(), fwd.lse.end());

  std::vector<double> dq(std::size_t(in.q.numel())), dk(std::size_t(in.k.numel())), dv(dk.size()),
      dsinks(std::size_t(c.H));
  reference::dense_backward(p, in.q.values().data(), in.k.values().data(), in.v.values().data(), out.values().data(),
                            dout.values().data(), to_double(lse).data(), dq.data(), dk.data(), dv.data(),
                            dsinks.data());

  HostTensor gq(in.q), gk(in.k), gv(in.v);
  gq.poison();
  gk.poison();
  gv.poison();
  DeviceInputs dev(backend, in);
  DeviceBuffer d_out(backend, out.bytes), d_dout(backend, dout.bytes), d_lse(backend, lse), d_dq(backend, gq.bytes),
      d_dk(backend, gk.bytes), d_dv(backend, gv.bytes),
      d_dsinks(backend, std::vector<float>(std::size_t(c.H), std::numeric_limits<float>::quiet_NaN()));
  const Memory mem = backend.memory();
  BackwardArgs args{in.q.on(dev.q.get(), mem),
                    in.k.on(dev.k.get(), mem),
                    in.v.on(dev.v.get(), mem),
                    out.on(d_out.get(), mem),
                    dout.on(d_dout.get(), mem),
                    static_cast<const float*>(d_lse.get()),
                    gq.on(d_dq.get(), mem),
                    gk.on(d_dk.get(), mem),
                    gv.on(d_dv.get(), mem),
                    nullptr,
                    c.sinks ? static_cast<float*>(d_dsinks.get()) : nullptr};
  // The workspace it asks for, poisoned as the forward's is.
  const std::size_t workspace_bytes =
      with_workspace ? attention_backward_workspace_bytes(backend, args, dev.params) : 0;
  DeviceBuffer workspace(backend, std::vector<std::uint8_t>(workspace_bytes, 0xFF));
  args.workspace = workspace_bytes ? workspace.get() : nullptr;
  args.workspace_bytes = workspace_bytes;
  const auto t0 = std::chrono::steady_clock::now();
  attention_backward(backend, args, dev.params);
  backend.synchronize();
  r.seconds = seconds_since(t0);
  r.kernel = backend.last_kernel();
  gq.assign(d_dq.read<std::uint8_t>());
  gk.assign(d_dk.read<std::uint8_t>());
  gv.assign(d_dv.read<std::uint8_t>());
  // Inputs are N(0, 1), so dS_ij = P_ij (dP_ij - D_i) subtracts terms of size ~ sqrt(D) and a
  // gradient's natural scale is ~ scale * D. A reference far below that is cancellation (a row with
  // one visible key has dS = 0 exactly) and is compared against 1e-1 of that scale instead of its
  // own vanishing norm, where f32 rounding alone would exceed the tolerance (dK sums that rounding
  // over every row of every head of the group).
  // dV does not grow with the scale (it sums probabilities times dout): its floor stays at the default
  // scale's when the scale is larger.
  // Dropout's kept weights (1 / (1 - p) each) scale dP and dV, and the natural size with them.
  const double keep = 1.0 / (1.0 - double(c.dropout_p));
  const double kGradientFloor = 1e-1 * double(p.scale) * double(p.D) * keep;
  const double kValueGradientFloor =
      1e-1 * std::min(double(p.scale), 1.0 / std::sqrt(double(p.D))) * double(p.D) * keep;
  // Each gradient's error, and for each one over the bound its name and (for a NaN or an infinity)
  // the first offending element.
  const std::pair<const char*, const std::vector<double>*> grads[] = {{"dq", &dq}, {"dk", &dk}, {"dv", &dv}};
  const HostTensor* got[] = {&gq, &gk, &gv};
  for (int g = 0; g < 3; ++g) {
    std::string why;
    const double e = relative_error(saturated(c.dtype, *grads[g].second), saturated(c.dtype, got[g]->values()), why,
                                    g == 2 ? kValueGradientFloor : kGradientFloor);
    r.error = std::max(r.error, e);
    if (e > r.tolerance)
      r.detail += std::string(r.detail.empty() ? "" : "; ") + grads[g].first + " error " + std::to_string(e) +
                  (why.empty() ? "" : " (" + why + ")");
  }
  if (c.sinks) {
    // dsinks sums -P_sink * D_i over the batch and rows: its natural size is about sqrt(B * Sq) (D_i ~ 1 for
    // N(0, 1) inputs), the floor below which a cancelling sum is compared absolutely.
    std::string why;
    const double e =
        relative_error(dsinks, to_double(d_dsinks.read<float>()), why, 1e-1 * std::sqrt(double(c.B * c.Sq)));
    r.error = std::max(r.error, e);
    if (e > r.tolerance)
      r.detail += std::string(r.detail.empty() ? "" : "; ") + "dsinks error " + std::to_string(e) +
                  (why.empty() ? "" : " (" + why + ")");
  }
  r.passed = r.error <= r.tolerance;
  return r;
}

CheckResult check_dropout(Backend& backend, std::uint32_t seed, float p) {
  // With v_j = e_j (one-hot, D >= Sk) out_i[j] = P_ij * keep_ij / (1 - p): a dropped weight is an exact 0.
  DenseCase c;
  c.B = 2;
  c.H = 2;
  c.Hkv = 1;
  c.Sq = 24;
  c.Sk = 64;
  c.D = 64;
  c.dropout_p = p;
  c.seed = seed;
  c.lse = false;
  CheckResult r{"dropout", c.describe(), 0, 0, false, "", 0, ""};
  DenseInputs in(c);
  std::vector<double> one_hot(std::size_t(in.v.numel()), 0.0);
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t j = 0; j < c.Sk; ++j) one_hot[std::size_t(((b * c.Sk + j) * c.Hkv) * c.D + j)] = 1.0;
  in.v.fill(one_hot);
  HostTensor out(in.q);
  out.poison();
  DeviceInputs dev(backend, in);
  DeviceBuffer dout(backend, out.bytes);
  const Memory mem = backend.memory();
  const auto t0 = std::chrono::steady_clock::now();
  attention_forward(backend,
                    {in.q.on(dev.q.get(), mem), in.k.on(dev.k.get(), mem), in.v.on(dev.v.get(), mem),
                     out.on(dout.get(), mem), nullptr, nullptr},
                    dev.params);
  backend.synchronize();
  r.seconds = seconds_since(t0);
  out.assign(dout.read<std::uint8_t>());
  const std::vector<double> got = out.values();
  std::int64_t mismatches = 0;
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t i = 0; i < c.Sq; ++i)
      for (std::int64_t h = 0; h < c.H; ++h)
        for (std::int64_t j = 0; j < c.Sk; ++j) {
          const bool keep = core::dropout_keep(p, seed, std::uint32_t(b * c.H + h), std::uint32_t(i), std::uint32_t(j));
          const double value = got[std::size_t(((b * c.Sq + i) * c.H + h) * c.D + j)];
          if (keep != (value != 0.0) || std::isnan(value)) ++mismatches;
        }
  r.error = double(mismatches);
  r.passed = mismatches == 0;
  if (!r.passed) r.detail = std::to_string(mismatches) + " dropout decisions differ from hash3";
  return r;
}

namespace {

// The shape ranges a drawn case takes; every feature is drawn alike.
struct ShapeRanges {
  std::vector<std::int64_t> dims;
  std::int64_t batches, rows_lo, rows_hi, small_dim_rows_hi, window_hi;
  std::int64_t dim256_rows_hi;  // rows and keys at head_dim 256
  std::int64_t decode_keys_hi;  // > 0: some cases are decodes, 1 to 4 rows against up to this many keys
};

DenseCase draw_case(std::mt19937_64& rng, const Backend& backend, const ShapeRanges& shapes) {
  auto pick = [&](auto... options) {
    const std::array values{options...};
    return values[std::uniform_int_distribution<std::size_t>(0, values.size() - 1)(rng)];
  };
  auto chance = [&](double prob) { return std::uniform_real_distribution<double>(0, 1)(rng) < prob; };
  auto range = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  for (;;) {
    DenseCase c;
    c.dtype = pick(DType::f32, DType::f16, DType::bf16);
    c.D = shapes.dims[std::uniform_int_distribution<std::size_t>(0, shapes.dims.size() - 1)(rng)];
    c.B = range(1, shapes.batches);
    c.Hkv = range(1, 2);
    c.H = c.Hkv * pick(std::int64_t(1), std::int64_t(2), std::int64_t(4));
    const std::int64_t hi = c.D >= 256   ? shapes.dim256_rows_hi
                            : c.D >= 128 ? shapes.rows_hi
                                         : shapes.small_dim_rows_hi;  // keeps the oracle's work small
    c.Sq = range(shapes.rows_lo, hi);
    c.Sk = chance(0.2) ? c.Sq : range(shapes.rows_lo, hi + 20);
    if (shapes.decode_keys_hi > 0 && chance(0.15)) {  // a decode step: keys split across blocks on a GPU
      c.Sq = range(1, 4);
      c.Sk = range(64, shapes.decode_keys_hi);
    }
    c.causal = chance(0.5);
    const int offset_kind = int(range(0, 3));
    if (offset_kind == 1) c.causal_offset = 0;
    if (offset_kind == 2) c.causal_offset = range(-4, c.Sk + 4);
    if (chance(0.3)) c.window = range(1, shapes.window_hi);
    if (chance(0.4)) {
      c.mask = true;
      for (bool& bcast : c.mask_broadcast) bcast = chance(0.5);
      c.mask_neg_inf_rate = chance(0.5) ? 0.1 : 0.0;
    }
    if (chance(0.3)) c.dropout_p = pick(0.1f, 0.3f, 0.5f);
    c.seed = std::uint32_t(rng());
    c.lse = chance(0.8);
    c.bhsd_layout = chance(0.4);
    if (chance(0.2)) c.scale = float(pick(0.05, 0.3));
    c.tf32 = c.dtype == DType::f32 && chance(0.4);
    c.pedantic = c.dtype == DType::f32 && !c.tf32 && chance(0.4);  // the cuda FFMA path; the default is 3xTF32
    if (chance(0.15)) c.softcap = float(pick(0.5, 5.0, 30.0));     // Gemma 2 caps at 50 (attention) and 30 (logits)
    c.sinks = chance(0.15);
    if (chance(0.12)) {  // docs/spec.md §3's non-finite and extreme inputs
      c = with_extreme(c,
                       pick(Extreme::hidden_non_finite, Extreme::large_scores, Extreme::scores_past_masked,
                            Extreme::scores_past_f32),
                       rng);
    }
    c.data_seed = rng();
    if (!backend.unsupported(c.shape())) return c;
  }
}

}  // namespace

DenseCase with_extreme(DenseCase c, Extreme kind, std::mt19937_64& rng) {
  if (c.extreme != Extreme::none && c.extreme != Extreme::hidden_non_finite) c.scale.reset();  // its kind's scale
  c.extreme = kind;
  if (kind == Extreme::large_scores) c.scale = float((rng() % 2 ? 1e4 : 1e5) / std::sqrt(double(c.D)));
  if (kind == Extreme::scores_past_masked) c.scale = 1e30f;
  if (kind == Extreme::scores_past_f32) c.scale = 1e38f;
  // Past 1e30, TF32's rounding of a score (2^-11 of it) is larger than the gaps between a row's top
  // scores, so it, not the kernel, picks the key that takes the softmax: these kinds run on f32 products.
  if (kind == Extreme::scores_past_masked || kind == Extreme::scores_past_f32) c.tf32 = false;
  return c;
}

DenseCase backward_case(DenseCase c) {
  // Past about 1e30 an f32 lse is off by more than 1e23: exp(s - lse) of the top key is then 0 or 1
  // by its rounding, in the oracle too, so those backward cases measure nothing; the same shape at
  // ordinary scores is checked instead.
  if (c.extreme == Extreme::scores_past_masked || c.extreme == Extreme::scores_past_f32) {
    c.extreme = Extreme::none;
    c.scale.reset();
  }
  return c;
}

DenseCase draw_dense_case(std::mt19937_64& rng, const Backend& backend) {
  return draw_case(rng, backend, {{1, 17, 32, 64, 96, 128, 256, 512}, 2, 1, 24, 48, 24, 24, 3000});
}

DenseCase draw_long_dense_case(std::mt19937_64& rng, const Backend& backend) {
  return draw_case(rng, backend, {{64, 128, 256}, 1, 130, 520, 520, 400, 270, 0});
}

}  // namespace flashtq::conformance

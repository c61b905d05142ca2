// The conformance suite: fresh random cases, each run on a backend and on the oracle, compared at
// the docs/spec.md §3 tolerances with outputs poisoned first. Used by the tests and by `flashtq check`.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "flashtq/backend.hpp"

namespace flashtq::conformance {

// Inputs at the edges of docs/spec.md §3's policy for non-finite and extreme values.
enum class Extreme {
  none,
  hidden_non_finite,   // NaN and infinities in the keys and values of keys no row sees (masked columns, past causal)
  large_scores,        // scores of 1e4 to 1e5: one-hot softmax rows, the backward's exp(s - lse) at its most sensitive
  scores_past_masked,  // scale 1e30: rows whose every score is at most -1e30 (masked), the rest around +1e31
  scores_past_f32,     // scale 1e38: scores past f32's range whose softmax the oracle still finishes (forward only)
};
const char* extreme_name(Extreme e);

struct DenseCase {
  std::int64_t B = 1, Sq = 1, Sk = 1, H = 1, Hkv = 1, D = 32;
  DType dtype = DType::f32;
  std::optional<float> scale;
  bool causal = false;
  std::optional<std::int64_t> causal_offset;
  std::int64_t window = 0;
  bool mask = false;
  std::array<bool, 4> mask_broadcast{};  // per (b, h, q, k): stride 0
  double mask_neg_inf_rate = 0;
  float dropout_p = 0;
  std::uint32_t seed = 0;
  bool lse = true;
  bool bhsd_layout = false;  // PyTorch's [B, H, S, D] memory order
  bool tf32 = false;         // f32 only: AttentionParams::allow_tf32, checked at the TF32 bound
  bool pedantic = false;     // f32 only, not with tf32: AttentionParams::pedantic_f32 (f32 FMAs only)
  float softcap = 0;         // AttentionParams::softcap (docs/spec.md §1.8)
  bool sinks = false;        // AttentionParams::sinks: one drawn logit per head, some -inf (docs/spec.md §1.9)
  Extreme extreme = Extreme::none;
  std::uint64_t data_seed = 0;

  std::string describe() const;
  DenseProblem shape() const;  // sizes, dtype and the §1.8/§1.9 features: what Backend::unsupported reads
};

struct TqCase {
  TqLayout layout{128, 1, 1, 2, 2};  // head_dim, kv heads, capacity, bits
  std::int64_t H = 1, tokens = 1, n_queries = 1, start_pos = 0;
  std::optional<std::int64_t> max_seq;
  std::int64_t window = 0;  // attention only: 0 = none
  DType dtype = DType::f32;
  std::uint64_t seed = 0, data_seed = 0;
  bool zero_rows = false;            // some all-zero keys and values
  std::int64_t batch = 1;            // sequences attended in one call (attend only)
  std::vector<std::int32_t> starts;  // per-sequence start positions, or empty: start_pos for all
  bool exact = false;                // TqAttendArgs::exact
  float softcap = 0;                 // TqAttendArgs::softcap (docs/spec.md §1.8)
  bool sinks = false;                // TqAttendArgs::sinks: a logit per head from data_seed, some -inf (§1.9)

  std::string describe() const;
};

struct CheckResult {
  std::string op;           // forward, backward, dropout, tq_encode, tq_rotate, tq_attend
  std::string description;  // the case
  double error = 0;         // the measure compared with the tolerance
  double tolerance = 0;
  bool passed = false;
  std::string detail;  // why it failed
  double seconds = 0;  // time of the backend's call
  std::string kernel;  // the kernel that served it (Backend::last_kernel), where the backend names one
};

// Per docs/spec.md §3: relative error bound for a dtype (and for f32 with the opt-in TF32 path).
double tolerance(DType dtype, bool tf32 = false);

DenseCase draw_dense_case(std::mt19937_64& rng, const Backend& backend);
// The case made of kind `kind` (its scale set for the score kinds; the inputs follow from it).
DenseCase with_extreme(DenseCase c, Extreme kind, std::mt19937_64& rng);
// The case the backward checks for a drawn forward case: the same, except that extreme kinds whose
// backward no f32 lse can resolve (scores past 1e30) are checked at ordinary scores.
DenseCase backward_case(DenseCase forward_case);
// Cases of a few hundred query rows and keys at head_dim 64, 128 and 256, every feature: several tiles
// of every tiled kernel (the GPU kernels tile by 64 and 128), their pipelines and tile skipping.
DenseCase draw_long_dense_case(std::mt19937_64& rng, const Backend& backend);
TqCase draw_tq_case(std::mt19937_64& rng, const Backend& backend);
// Decode-shaped cases (1 to 3 query rows at the end of up to a few thousand timesteps): half in the seed's
// configuration (head_dim 128, keys 2+1, values 2, GQA groups of 4 or 8), half in a preset's layout that the
// backend serves (head_dim 64, 128 or 256, GQA groups of 1 to 16): the shapes GPU decode fast paths specialise for.
TqCase draw_tq_decode_case(std::mt19937_64& rng, const Backend& backend);
// Chunk-shaped cases (chunked prefill): 16 to 96 query rows from one start position for every sequence of
// the batch, unclamped, over every layout draw_tq_case draws: the shapes GPU prefill paths specialise for.
TqCase draw_tq_prefill_case(std::mt19937_64& rng, const Backend& backend);

CheckResult check_forward(Backend& backend, const DenseCase& c);
// With `workspace`, the backward gets the workspace attention_backward_workspace_bytes asks for (poisoned); without,
// none (a device backend then allocates its own scratch on the stream).
CheckResult check_backward(Backend& backend, const DenseCase& c, bool workspace = true);
// Dropout decisions made by the backend's forward, read off exactly (one-hot values).
CheckResult check_dropout(Backend& backend, std::uint32_t seed, float p);
CheckResult check_tq_encode(Backend& backend, const TqCase& c);
CheckResult check_tq_rotate(Backend& backend, const TqCase& c);
CheckResult check_tq_attend(Backend& backend, const TqCase& c);

// `cases` random cases of every operation, from one seed.
std::vector<CheckResult> run_suite(Backend& backend, int cases, std::uint64_t seed);

}  // namespace flashtq::conformance

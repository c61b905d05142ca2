#include "core/varlen.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/sequence_rows.hpp"
#include "core/validate.hpp"
#include "flashtq/error.hpp"

namespace flashtq::core {
namespace {

constexpr std::int64_t kInt32Max = std::numeric_limits<std::int32_t>::max();

// cu_seqlens: B + 1 int32 offsets, 0 first, non-decreasing, `total` last; each length within the hint.
std::vector<std::int64_t> read_offsets(const char* name, const std::int32_t* cu, std::int64_t batch, std::int64_t total,
                                       const char* total_name, std::int64_t hint, const char* hint_name) {
  check_pointer(name, cu, alignof(std::int32_t));
  if (hint < 0 || hint > kInt32Max) throw Error(hint_name, "must be in [0, 2^31 - 1] (0 = not given)");
  std::vector<std::int64_t> at(std::size_t(batch) + 1);
  for (std::int64_t b = 0; b <= batch; ++b) at[std::size_t(b)] = cu[b];
  if (at[0] != 0) throw Error(name, "must start at 0, starts at " + std::to_string(at[0]));
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t n = at[std::size_t(b) + 1] - at[std::size_t(b)];
    if (n < 0) {
      throw Error(name, "must be non-decreasing: entry " + std::to_string(b + 1) + " (" +
                            std::to_string(at[std::size_t(b) + 1]) + ") is below entry " + std::to_string(b) + " (" +
                            std::to_string(at[std::size_t(b)]) + ")");
    }
    if (hint > 0 && n > hint) {
      throw Error(hint_name, "sequence " + std::to_string(b) + " has " + std::to_string(n) + ", more than the hint " +
                                 std::to_string(hint));
    }
  }
  if (at[std::size_t(batch)] != total) {
    throw Error(name, "must end at " + std::string(total_name) + " = " + std::to_string(total) + ", ends at " +
                          std::to_string(at[std::size_t(batch)]));
  }
  return at;
}

// The checks of the whole batch and what every sequence's call shares.
struct Batch {
  std::vector<std::int64_t> q, k;         // cu_seqlens, widened
  std::vector<std::int64_t> mask_offset;  // per sequence, with a mask
  std::int64_t H = 0;

  Batch(const TensorView& qv, const TensorView& kv, const AttentionParams& params) {
    const Varlen& v = *params.varlen;
    if (v.batch < 1 || v.batch > kInt32Max) throw Error("varlen", "batch must be in [1, 2^31 - 1]");
    if (qv.shape[0] != 1) throw Error("q", "a ragged batch's q is [1, Tq, H, D] (the sequences packed along dim 1)");
    if (kv.shape[0] != 1) throw Error("k", "a ragged batch's k is [1, Tk, Hkv, D] (the sequences packed along dim 1)");
    q = read_offsets("cu_seqlens_q", v.cu_seqlens_q, v.batch, qv.shape[1], "Tq", v.max_seqlen_q, "max_seqlen_q");
    k = read_offsets("cu_seqlens_k", v.cu_seqlens_k, v.batch, kv.shape[1], "Tk", v.max_seqlen_k, "max_seqlen_k");
    H = qv.shape[2];
    if (v.mask_offsets != nullptr && params.mask == nullptr) throw Error("mask_offsets", "given without a mask");
    if (params.mask != nullptr) {
      mask_offset.assign(std::size_t(v.batch), 0);
      for (std::int64_t b = 0; v.mask_offsets != nullptr && b < v.batch; ++b) {
        const std::int64_t at = v.mask_offsets[b];
        if (at < 0 || at >= params.mask_elements) {
          throw Error("mask_offsets",
                      "entry " + std::to_string(b) + " (" + std::to_string(at) + ") must lie in [0, mask_elements)");
        }
        mask_offset[std::size_t(b)] = at;
      }
    }
  }
  std::int64_t batch() const { return std::int64_t(q.size()) - 1; }
  std::int64_t rows(std::int64_t b) const { return q[std::size_t(b) + 1] - q[std::size_t(b)]; }
  std::int64_t keys(std::int64_t b) const { return k[std::size_t(b) + 1] - k[std::size_t(b)]; }

  // Sequence b's parameters: the whole batch's, its mask moved to the sequence's origin.
  AttentionParams params_of(const AttentionParams& params, std::int64_t b) const {
    AttentionParams p = params;
    p.varlen.reset();
    if (p.mask != nullptr) {
      p.mask += mask_offset[std::size_t(b)];
      p.mask_elements -= mask_offset[std::size_t(b)];
    }
    return p;
  }
  // The whole batch as one sequence, without what is per sequence (mask, causal offset): the views, dtypes and
  // every other parameter are checked here once. `packed`: as the one call a device backend runs.
  static AttentionParams whole(const AttentionParams& params, bool packed = false) {
    AttentionParams p = params;
    if (!packed) p.varlen.reset();
    p.mask = nullptr;
    p.causal_offset.reset();
    return p;
  }
  std::int64_t longest(const std::vector<std::int64_t>& at) const {
    std::int64_t n = 0;
    for (std::size_t b = 0; b + 1 < at.size(); ++b) n = std::max(n, at[b + 1] - at[b]);
    return n;
  }
  // The one call's problem: B sequences, the longest rows and keys, the caller's mask and causal offset.
  void pack(DenseProblem& p, RaggedTable& t, const AttentionParams& params) const {
    const Varlen& v = *params.varlen;
    p.B = batch();
    p.Sq = longest(q);
    p.Sk = longest(k);
    p.mask = params.mask;
    p.mask_strides = params.mask != nullptr ? params.mask_strides : std::array<std::int64_t, 4>{};
    p.causal_offset = params.causal_offset.value_or(0);
    t = {v.cu_seqlens_q,
         v.cu_seqlens_k,
         params.mask != nullptr ? v.mask_offsets : nullptr,
         q.back(),
         k.back(),
         params.mask != nullptr ? params.mask_elements : 0,
         !params.causal_offset.has_value()};
  }
};

template <typename Call>
void mark(Call& c, std::int64_t b) {
  c.p.varlen = true;
  c.p.batch0 = b;
}

// A device backend runs the batch as one call (p.packed): each sequence is validated as its own call first (its
// views, mask reach and positions), none of which is run.
ForwardCall packed_forward(const Backend& backend, const Batch& batch, const ForwardArgs& a,
                           const AttentionParams& params) {
  for (std::int64_t b = 0; b < batch.batch(); ++b) {
    const std::int64_t q0 = batch.q[std::size_t(b)], k0 = batch.k[std::size_t(b)];
    if (batch.rows(b) == 0 || batch.keys(b) == 0) continue;
    validate_forward(backend,
                     {rows_of(a.q, q0, batch.rows(b)), rows_of(a.k, k0, batch.keys(b)), rows_of(a.v, k0, batch.keys(b)),
                      rows_of(a.out, q0, batch.rows(b)), nullptr, a.stream},
                     batch.params_of(params, b));
  }
  ForwardArgs whole_args = a;
  whole_args.lse = nullptr;
  ForwardCall c = validate_forward(backend, whole_args, Batch::whole(params, /*packed=*/true));
  batch.pack(c.p, c.ragged, params);
  c.lse = a.lse;
  return c;
}

}  // namespace

void varlen_forward(Backend& backend, const ForwardArgs& a, const AttentionParams& params) {
  const Batch batch(a.q, a.k, params);
  if (a.lse != nullptr) check_pointer("lse", a.lse, alignof(float));
  if (backend.memory() != Memory::host) return backend.forward(packed_forward(backend, batch, a, params));
  ForwardArgs whole_args = a;
  whole_args.lse = nullptr;
  validate_forward(backend, whole_args, Batch::whole(params));
  const std::int64_t H = batch.H, Tq = a.q.shape[1];
  // Each sequence's lse as its call writes it, [H, Sq_b] at H * (its first row); scattered to [H, Tq] after.
  std::vector<float> lse(a.lse != nullptr ? std::size_t(H * Tq) : 0);
  std::vector<ForwardCall> calls;
  for (std::int64_t b = 0; b < batch.batch(); ++b) {
    const std::int64_t q0 = batch.q[std::size_t(b)], k0 = batch.k[std::size_t(b)], n = batch.rows(b);
    if (n == 0 || batch.keys(b) == 0) continue;  // nothing to compute (rows without keys are written below)
    const ForwardArgs s{rows_of(a.q, q0, n),
                        rows_of(a.k, k0, batch.keys(b)),
                        rows_of(a.v, k0, batch.keys(b)),
                        rows_of(a.out, q0, n),
                        a.lse != nullptr ? lse.data() + H * q0 : nullptr,
                        a.stream};
    calls.push_back(validate_forward(backend, s, batch.params_of(params, b)));
    mark(calls.back(), b);
  }
  for (const ForwardCall& c : calls) backend.forward(c);
  for (std::int64_t b = 0; b < batch.batch(); ++b) {
    const std::int64_t q0 = batch.q[std::size_t(b)], n = batch.rows(b);
    if (n == 0 || batch.keys(b) != 0) continue;
    // Rows that see no key: out = 0, lse = the head's sink (or -inf) (docs/spec.md §1, §1.9).
    write_rows_without_keys(a.out, 0, q0, n, params, a.lse != nullptr ? lse.data() + H * q0 : nullptr, n);
  }
  for (std::int64_t b = 0; b < batch.batch() && a.lse != nullptr; ++b) {
    const std::int64_t q0 = batch.q[std::size_t(b)], n = batch.rows(b);
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < n; ++i) a.lse[h * Tq + q0 + i] = lse[std::size_t(H * q0 + h * n + i)];
  }
}

namespace {

BackwardCall packed_backward(const Backend& backend, const Batch& batch, const BackwardArgs& a,
                             const AttentionParams& params) {
  for (std::int64_t b = 0; b < batch.batch(); ++b) {
    const std::int64_t q0 = batch.q[std::size_t(b)], k0 = batch.k[std::size_t(b)], n = batch.rows(b), m = batch.keys(b);
    if (n == 0 || m == 0) continue;
    validate_backward(
        backend,
        {rows_of(a.q, q0, n), rows_of(a.k, k0, m), rows_of(a.v, k0, m), rows_of(a.out, q0, n), rows_of(a.dout, q0, n),
         a.lse, rows_of(a.dq, q0, n), rows_of(a.dk, k0, m), rows_of(a.dv, k0, m), a.stream, a.dsinks},
        batch.params_of(params, b));
  }
  BackwardCall c = validate_backward(backend, a, Batch::whole(params, /*packed=*/true));
  batch.pack(c.p, c.ragged, params);
  return c;
}

}  // namespace

BackwardCall validate_packed_backward(const Backend& backend, const BackwardArgs& a, const AttentionParams& params) {
  return packed_backward(backend, Batch(a.q, a.k, params), a, params);
}

ForwardCall validate_packed_forward(const Backend& backend, const ForwardArgs& a, const AttentionParams& params) {
  if (a.lse != nullptr) check_pointer("lse", a.lse, alignof(float));
  return packed_forward(backend, Batch(a.q, a.k, params), a, params);
}

void varlen_backward(Backend& backend, const BackwardArgs& a, const AttentionParams& params) {
  const Batch batch(a.q, a.k, params);
  if (backend.memory() != Memory::host) return backend.backward(packed_backward(backend, batch, a, params));
  validate_backward(backend, a, Batch::whole(params));
  const std::int64_t H = batch.H, Tq = a.q.shape[1];
  // lse from [H, Tq] into each sequence's [H, Sq_b]; each sequence's sink gradient apart, summed after.
  std::vector<float> lse(std::size_t(H * Tq));
  std::vector<float> dsinks(a.dsinks != nullptr ? std::size_t(H * batch.batch()) : 0, 0.0f);
  std::vector<BackwardCall> calls;
  for (std::int64_t b = 0; b < batch.batch(); ++b) {
    const std::int64_t q0 = batch.q[std::size_t(b)], k0 = batch.k[std::size_t(b)], n = batch.rows(b), m = batch.keys(b);
    if (n == 0 || m == 0) continue;
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < n; ++i) lse[std::size_t(H * q0 + h * n + i)] = a.lse[h * Tq + q0 + i];
    BackwardArgs s{rows_of(a.q, q0, n),
                   rows_of(a.k, k0, m),
                   rows_of(a.v, k0, m),
                   rows_of(a.out, q0, n),
                   rows_of(a.dout, q0, n),
                   lse.data() + H * q0,
                   rows_of(a.dq, q0, n),
                   rows_of(a.dk, k0, m),
                   rows_of(a.dv, k0, m),
                   a.stream,
                   a.dsinks != nullptr ? dsinks.data() + H * b : nullptr};
    calls.push_back(validate_backward(backend, s, batch.params_of(params, b)));
    mark(calls.back(), b);
  }
  for (const BackwardCall& c : calls) backend.backward(c);
  // A sequence without keys has dq = 0; keys no row of their sequence sees have dk = dv = 0.
  for (std::int64_t b = 0; b < batch.batch(); ++b) {
    if (batch.keys(b) == 0) zero_rows(a.dq, 0, batch.q[std::size_t(b)], batch.rows(b));
    if (batch.rows(b) == 0) {
      zero_rows(a.dk, 0, batch.k[std::size_t(b)], batch.keys(b));
      zero_rows(a.dv, 0, batch.k[std::size_t(b)], batch.keys(b));
    }
  }
  for (std::int64_t h = 0; h < H && a.dsinks != nullptr; ++h) {
    double sum = 0;
    for (std::int64_t b = 0; b < batch.batch(); ++b) sum += dsinks[std::size_t(H * b + h)];
    a.dsinks[h] = float(sum);
  }
}

}  // namespace flashtq::core

// Dense attention written straight from docs/spec.md §1 with the whole score matrix materialised: the
// independent formula the oracle is tested against.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/hash3.hpp"
#include "flashtq/problem.hpp"

namespace flashtq::testing {

struct BruteForce {
  std::vector<double> out, lse;
};

inline BruteForce brute_force_attention(const DenseProblem& p, const std::vector<double>& q,
                                        const std::vector<double>& k, const std::vector<double>& v) {
  const double ninf = -std::numeric_limits<double>::infinity();
  const std::int64_t B = p.B, H = p.H, Sq = p.Sq, Sk = p.Sk, D = p.D, Hkv = p.Hkv;
  std::vector<double> S(std::size_t(B * H * Sq * Sk), ninf);
  auto s_at = [&](std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) -> double& {
    return S[std::size_t(((b * H + h) * Sq + i) * Sk + j)];
  };
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < Sq; ++i)
        for (std::int64_t j = 0; j < Sk; ++j) {
          const std::int64_t pos = i + p.causal_offset;
          const bool visible = (!p.causal || j <= pos) && (p.window == 0 || std::llabs(pos - j) < p.window);
          if (!visible) continue;
          const std::int64_t hk = h / (H / Hkv);
          double dot = 0;
          for (std::int64_t d = 0; d < D; ++d)
            dot += q[std::size_t(((b * Sq + i) * H + h) * D + d)] * k[std::size_t(((b * Sk + j) * Hkv + hk) * D + d)];
          double s = p.scale * dot;
          if (p.softcap > 0) s = p.softcap * std::tanh(s / p.softcap);  // §1.8: before the mask
          if (p.mask) {
            s += p.mask[b * p.mask_strides[0] + h * p.mask_strides[1] + i * p.mask_strides[2] + j * p.mask_strides[3]];
          }
          s_at(b, h, i, j) = s <= -1e30 ? ninf : s;
        }
  BruteForce r{std::vector<double>(q.size(), 0.0), std::vector<double>(std::size_t(B * H * Sq), ninf)};
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < Sq; ++i) {
        // §1.9: the sink is one more logit of the softmax, with no value.
        const double sink = p.sinks ? double(p.sinks[h]) : ninf;
        double m = sink;
        for (std::int64_t j = 0; j < Sk; ++j) m = std::max(m, s_at(b, h, i, j));
        if (m == ninf) continue;
        double l = std::exp(sink - m);
        for (std::int64_t j = 0; j < Sk; ++j) l += std::exp(s_at(b, h, i, j) - m);
        r.lse[std::size_t((b * H + h) * Sq + i)] = m + std::log(l);
        for (std::int64_t j = 0; j < Sk; ++j) {
          double w = std::exp(s_at(b, h, i, j) - m) / l;
          if (p.dropout_p > 0) {
            const bool keep =
                core::hash3(std::uint32_t(b * H + h), std::uint32_t(i), std::uint32_t(j) + p.seed) >= p.dropout_p;
            w = keep ? w / (1.0 - p.dropout_p) : 0.0;
          }
          const std::int64_t hk = h / (H / Hkv);
          for (std::int64_t d = 0; d < D; ++d)
            r.out[std::size_t(((b * Sq + i) * H + h) * D + d)] += w * v[std::size_t(((b * Sk + j) * Hkv + hk) * D + d)];
        }
      }
  return r;
}

}  // namespace flashtq::testing

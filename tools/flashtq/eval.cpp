// `flashtq eval`: TurboQuant's quality report: codebook distortion, key estimator bias and error,
// attention error against exact attention at long contexts, and bytes per token.
#include <fmt/core.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "commands.hpp"
#include "conformance/host_tensor.hpp"
#include "flashtq/flashtq.hpp"
#include "reference/dense.hpp"
#include "reference/quality.hpp"

namespace flashtq::cli {
namespace {

constexpr double kSpecMse[] = {0, 0.361, 0.116, 0.034, 0.0093};
const std::pair<int, int> kConfigs[] = {{1, 2}, {2, 2}, {3, 3}, {3, 4}};  // (key b_mse, value bits)

// Keys, values and decode queries of one synthetic workload, [T, Hkv, D] and [H, D].
struct Workload {
  std::vector<float> k, v, q;
};

// Gaussian: i.i.d. N(0, 1) keys and values, Gaussian queries.
// LLM-like: keys with a non-zero mean and 4 outlier channels 10-50x larger; each query head
// attends sharply to 4 positions among the first 1024 (present at every context).
Workload make_workload(bool llm, std::int64_t T, std::int64_t Hkv, std::int64_t H, std::int64_t D,
                       std::mt19937_64& rng) {
  std::normal_distribution<float> n(0, 1);
  Workload w{std::vector<float>(std::size_t(T * Hkv * D)), std::vector<float>(std::size_t(T * Hkv * D)),
             std::vector<float>(std::size_t(H * D))};
  std::vector<float> mean(std::size_t(D), 0.0f), gain(std::size_t(D), 1.0f);
  if (llm) {
    for (float& m : mean) m = 0.8f * n(rng);
    std::uniform_real_distribution<float> big(10.0f, 50.0f);
    for (int o = 0; o < 4; ++o) gain[std::size_t(rng() % std::uint64_t(D))] = big(rng);
  }
  for (std::size_t i = 0; i < w.k.size(); ++i) {
    const std::size_t d = i % std::size_t(D);
    w.k[i] = mean[d] + gain[d] * n(rng);
    w.v[i] = n(rng);
  }
  for (std::int64_t h = 0; h < H; ++h) {
    float* q = w.q.data() + h * D;
    if (!llm) {
      for (std::int64_t d = 0; d < D; ++d) q[d] = n(rng);
      continue;
    }
    for (std::int64_t d = 0; d < D; ++d) q[d] = 0.0f;
    for (int target = 0; target < 4; ++target) {
      const float* k = w.k.data() + (std::int64_t(rng() % 1024) * Hkv + h / (H / Hkv)) * D;
      double norm = 0;
      for (std::int64_t d = 0; d < D; ++d) norm += double(k[d] - mean[std::size_t(d)]) * (k[d] - mean[std::size_t(d)]);
      // Scaled so a target's score stands about 12 above a typical key's.
      const float alpha = float(12.0 * std::sqrt(double(D)) / norm);
      for (std::int64_t d = 0; d < D; ++d) q[d] += alpha * (k[d] - mean[std::size_t(d)]);
    }
  }
  return w;
}

nlohmann::json attention_rows(std::mt19937_64& rng, const std::vector<std::int64_t>& contexts) {
  const std::int64_t Hkv = 1, H = 4, D = 128, T = contexts.back();
  nlohmann::json rows = nlohmann::json::array();
  for (bool llm : {false, true}) {
    const Workload w = make_workload(llm, T, Hkv, H, D, rng);
    const std::vector<double> kd(w.k.begin(), w.k.end()), vd(w.v.begin(), w.v.end()), qd(w.q.begin(), w.q.end());
    for (const auto& [kb, vb] : kConfigs) {
      TqKvCache cache({1, {D, Hkv, T, kb, vb}, rng()}, &default_backend());
      cache.append(0, TensorView::bshd(const_cast<float*>(w.k.data()), DType::f32, 1, T, Hkv, D),
                   TensorView::bshd(const_cast<float*>(w.v.data()), DType::f32, 1, T, Hkv, D), 0);
      for (std::int64_t ctx : contexts) {
        std::vector<float> out(std::size_t(H * D));
        std::vector<float> q = w.q;
        cache.attend(0, TensorView::bshd(q.data(), DType::f32, 1, 1, H, D), ctx - 1,
                     TensorView::bshd(out.data(), DType::f32, 1, 1, H, D));
        DenseProblem p;
        p.B = 1;
        p.Sq = 1;
        p.Sk = ctx;
        p.H = H;
        p.Hkv = Hkv;
        p.D = D;
        p.scale = float(1.0 / std::sqrt(double(D)));
        std::vector<double> exact(std::size_t(H * D));
        reference::dense_forward(p, qd.data(), kd.data(), vd.data(), exact.data(), nullptr);
        rows.push_back({{"data", llm ? "llm_like" : "gaussian"},
                        {"ctx", ctx},
                        {"key_bits", kb},
                        {"value_bits", vb},
                        {"rel_err", conformance::relative_error(exact, std::vector<double>(out.begin(), out.end()))}});
      }
    }
  }
  return rows;
}

}  // namespace

Command add_eval(CLI::App& app) {
  struct Options {
    bool json = false;
    std::string output;
    std::uint64_t seed = 1;
    bool quick = false;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand("eval", "TurboQuant quality report (distortion, estimator bias, attention error)");
  sub->add_flag("--json", opts->json, "Print the report as JSON");
  sub->add_option("--output", opts->output, "Also write the JSON report to this file");
  sub->add_option("--seed", opts->seed, "Random seed");
  sub->add_flag("--quick", opts->quick, "Contexts up to 4k only and fewer samples (for tests)");
  return {
      sub, [opts] {
        std::mt19937_64 rng(opts->seed);
        nlohmann::json report;
        const int trials = opts->quick ? 2000 : 20000;
        for (int b = 1; b <= 4; ++b) {
          report["mse"][std::to_string(b)] = reference::measure_mse(128, b, trials, rng);
          report["mse_d64"][std::to_string(b)] = reference::measure_mse(64, b, trials, rng);
          report["mse_spec"][std::to_string(b)] = kSpecMse[b];
        }
        for (int b = 1; b <= 3; ++b) {
          const auto s = reference::measure_key_estimator(128, b, opts->quick ? 20000 : 50000, rng);
          report["prod"][std::to_string(b)] = {
              {"slope", s.slope},
              {"dprod_d", s.dprod_d},
              {"bound", std::sqrt(3.0) * std::pow(std::acos(-1.0), 2) * std::pow(4.0, -(b + 1))}};
        }
        const std::vector<std::int64_t> contexts =
            opts->quick ? std::vector<std::int64_t>{1024, 4096} : std::vector<std::int64_t>{1024, 4096, 16384, 32768};
        report["attention"] = attention_rows(rng, contexts);
        for (const auto& [kb, vb] : kConfigs) {
          const TqLayout l{128, 1, 1, kb, vb};
          report["bytes_per_token"][fmt::format("k{}v{}", kb, vb)] = {{"head_dim", 128},
                                                                      {"bytes", l.bytes_per_token_per_head()},
                                                                      {"bf16_bytes", 512},
                                                                      {"compression_vs_bf16", l.compression_vs_bf16()}};
        }
        if (!opts->output.empty()) std::ofstream(opts->output) << report.dump(2) << "\n";
        if (opts->json) {
          fmt::print("{}\n", report.dump(2));
          return 0;
        }
        fmt::print("D_mse (random unit vectors)\n{:>4} {:>10} {:>10} {:>10}\n", "bits", "D=64", "D=128", "spec");
        for (int b = 1; b <= 4; ++b) {
          const auto key = std::to_string(b);
          fmt::print("{:>4} {:>10.4f} {:>10.4f} {:>10.4f}\n", b, report["mse_d64"][key].get<double>(),
                     report["mse"][key].get<double>(), kSpecMse[b]);
        }
        fmt::print("\nKey inner-product estimator (b_mse + 1 QJL bit, D=128)\n{:>6} {:>8} {:>10} {:>10}\n", "b_mse",
                   "slope", "D_prod*D", "bound");
        for (int b = 1; b <= 3; ++b) {
          const auto& p = report["prod"][std::to_string(b)];
          fmt::print("{:>6} {:>8.4f} {:>10.4f} {:>10.4f}\n", b, p["slope"].get<double>(), p["dprod_d"].get<double>(),
                     p["bound"].get<double>());
        }
        fmt::print("\nDecode attention, relative error against exact attention (H=4, Hkv=1, D=128)\n");
        fmt::print("{:<10} {:>7} {:>6} {:>6} {:>10}\n", "data", "ctx", "kbits", "vbits", "rel_err");
        for (const auto& row : report["attention"]) {
          fmt::print("{:<10} {:>7} {:>6} {:>6} {:>10.4f}\n", row["data"].get<std::string>(), row["ctx"].get<int>(),
                     row["key_bits"].get<int>(), row["value_bits"].get<int>(), row["rel_err"].get<double>());
        }
        fmt::print("\nBytes per token per kv head (D=128)\n");
        for (const auto& [name, b] : report["bytes_per_token"].items()) {
          fmt::print("{:<6} {:>4} bytes  {:.2f}x smaller than bf16\n", name, b["bytes"].get<int>(),
                     b["compression_vs_bf16"].get<double>());
        }
        return 0;
      }};
}

}  // namespace flashtq::cli

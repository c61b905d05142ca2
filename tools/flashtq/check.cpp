// `flashtq check`: the conformance suite's random cases on one or every available backend.
#include <fmt/core.h>

#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "commands.hpp"
#include "conformance/conformance.hpp"
#include "conformance/seeds.hpp"
#include "flashtq/flashtq.hpp"

namespace flashtq::cli {

Command add_check(CLI::App& app) {
  struct Options {
    std::string backend;
    int cases = 20;
    bool json = false;
    std::uint64_t seed = 0;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand("check", "Run the conformance suite's random cases against the oracle");
  sub->add_option("--backend", opts->backend, "Backend to check (default: every available one)");
  sub->add_option("--cases", opts->cases, "Random cases per operation")->check(CLI::Range(1, 100000));
  sub->add_option("--seed", opts->seed, "Seed for drawing the cases (default: FLASHTQ_TEST_SEED, else fresh)");
  sub->add_flag("--json", opts->json,
                "Print {\"backends\": {NAME: {\"cases\": N, \"failed\": F, \"failures\": [...]}}, \"seed\": S}");
  return {sub, [opts] {
            std::vector<Backend*> targets;
            if (opts->backend.empty()) {
              targets = available_backends();
            } else {
              targets.push_back(&backend(opts->backend));
            }
            const std::uint64_t seed = opts->seed ? opts->seed : conformance::run_seed();  // FLASHTQ_TEST_SEED replays
            nlohmann::json report;
            report["backends"] = nlohmann::json::object();
            int failed_total = 0;
            for (Backend* b : targets) {
              const auto results = conformance::run_suite(*b, opts->cases, seed);
              int failed = 0;
              nlohmann::json failures = nlohmann::json::array();
              std::map<std::string, int> kernels;  // checks per kernel that served them
              for (const auto& r : results) {
                if (!r.kernel.empty()) ++kernels[r.kernel];
                if (r.passed) continue;
                ++failed;
                if (failures.size() < 10) {
                  failures.push_back({{"op", r.op},
                                      {"case", r.description},
                                      {"error", r.error},
                                      {"tolerance", r.tolerance},
                                      {"detail", r.detail},
                                      {"kernel", r.kernel}});
                }
                if (!opts->json) {
                  fmt::print("FAIL {} {} [{}] error {:.3g} > {:.3g} {}{}\n", b->name(), r.op, r.description, r.error,
                             r.tolerance, r.detail, r.kernel.empty() ? "" : " (kernel " + r.kernel + ")");
                }
              }
              failed_total += failed;
              report["backends"][b->name()] = {{"cases", results.size()}, {"failed", failed}};
              if (!kernels.empty()) report["backends"][b->name()]["kernels"] = kernels;
              if (failed) report["backends"][b->name()]["failures"] = failures;
              if (!opts->json) {
                fmt::print("{:<10} {:>6} checks {:>4} failed (seed {})\n", b->name(), results.size(), failed, seed);
                for (const auto& [kernel, n] : kernels) fmt::print("{:<10} {:>6} served by {}\n", "", n, kernel);
              }
            }
            report["seed"] = seed;
            if (opts->json) fmt::print("{}\n", report.dump());
            return failed_total == 0 ? 0 : 1;
          }};
}

}  // namespace flashtq::cli

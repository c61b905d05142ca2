// The subcommands of the `flashtq` program; each registers itself and its options.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <nlohmann/json.hpp>

namespace flashtq::cli {

struct Command {
  CLI::App* app;
  std::function<int()> run;  // returns the exit status
};

Command add_demo(CLI::App& app);
Command add_check(CLI::App& app);
Command add_eval(CLI::App& app);
Command add_bench(CLI::App& app);

// The GPU part of `flashtq bench` (bench_gpu.cpp): one row per (backend, operation, shape).
nlohmann::json bench_gpu_backends(bool quick);

}  // namespace flashtq::cli

// The subcommands of the `flashtq` program; each registers itself and its options.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace flashtq::cli {

struct Command {
  CLI::App* app;
  std::function<int()> run;  // returns the exit status
};

Command add_demo(CLI::App& app);
Command add_check(CLI::App& app);
Command add_eval(CLI::App& app);
Command add_bench(CLI::App& app);

}  // namespace flashtq::cli

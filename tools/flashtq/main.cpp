// flashtq: the command-line program (demo, check, eval, bench).
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <vector>

#include "commands.hpp"
#include "flashtq/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{"flashtq: exact FlashAttention and TurboQuant-compressed KV-cache attention"};
  app.require_subcommand(1);
  const std::vector<flashtq::cli::Command> commands = {flashtq::cli::add_demo(app), flashtq::cli::add_check(app),
                                                       flashtq::cli::add_eval(app), flashtq::cli::add_bench(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr, "flashtq: error: {} (see flashtq --help)\n", e.what());
    return 2;
  }
  try {
    for (const auto& command : commands) {
      if (command.app->parsed()) return command.run();
    }
  } catch (const flashtq::Error& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 2;
  }
  return 2;
}

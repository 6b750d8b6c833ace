// build/bin/pdkv: one binary, one subcommand per role (DESIGN §6).
#include <cstdio>
#include <vector>

#include <spdlog/cfg/env.h>

#include "cli/command.h"
#include "cli/parent_watch.h"

int main(int argc, char** argv) {
  pdkv::cli::stop_with_parent();
  // Log levels from SPDLOG_LEVEL (e.g. "warn", or "engine=debug"); pdkv run
  // starts its workers with "warn" unless the user chose.
  spdlog::cfg::load_env_levels();
  CLI::App app{"pdkv: KV-cache transfer between prefill and decode ranks"};
  app.require_subcommand(1);
  const std::vector<pdkv::cli::Command> commands = {
      pdkv::cli::add_plan_command(app),     pdkv::cli::add_bootstrap_command(app),
      pdkv::cli::add_topology_command(app), pdkv::cli::add_prefill_command(app),
      pdkv::cli::add_decode_command(app),   pdkv::cli::add_run_command(app),
      pdkv::cli::add_bench_command(app),    pdkv::cli::add_gpu_bench_command(app),
  };

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line that names the offending value, and the documented exit code.
    std::fprintf(stderr, "pdkv: %s\n", e.what());
    return pdkv::cli::kExitInvalidInput;
  }
  for (const auto& command : commands) {
    if (command.app->parsed()) return command.run();
  }
  return pdkv::cli::kExitInvalidInput;
}

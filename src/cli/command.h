// How the `pdkv` binary is put together: each subcommand lives in its own file,
// registers its flags on the top-level CLI11 app, and hands back the function
// that runs it once the command line has been parsed.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace pdkv::cli {

// Exit codes shared by every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;       // the work ran and failed (mismatch, dead rank, ...)
inline constexpr int kExitInvalidInput = 2;  // the command line can never work

// A registered subcommand: its CLI11 node and what runs it after parsing.
struct Command {
  CLI::App* app;
  std::function<int()> run;
};

Command add_plan_command(CLI::App& app);
Command add_bootstrap_command(CLI::App& app);
Command add_topology_command(CLI::App& app);
Command add_prefill_command(CLI::App& app);
Command add_decode_command(CLI::App& app);
Command add_run_command(CLI::App& app);
Command add_bench_command(CLI::App& app);
Command add_gpu_bench_command(CLI::App& app);

}  // namespace pdkv::cli

// `pdkv prefill` and `pdkv decode`: one process per rank. Each prints a line
// "progress N room R ok|failed" after every finished request and, last, one
// JSON summary line.
#include <cstdio>
#include <memory>

#include "cli/command.h"
#include "cli/security_flags.h"
#include "cli/shape_flags.h"
#include "worker/worker.h"

namespace pdkv::cli {
namespace {

int run(worker::WorkerArgs args, const SecurityFlags& flags) {
  const char* name = args.role == Role::kPrefill ? "prefill" : "decode";
  auto security = flags.load();
  if (!security.is_ok()) {
    std::fprintf(stderr, "pdkv %s: %s\n", name, security.status().message().c_str());
    return kExitInvalidInput;
  }
  args.security = std::move(*security);
  auto summary = worker::run_worker(
      args,
      [](uint64_t done, uint64_t room, bool ok) {
        std::printf("progress %llu room %llu %s\n", static_cast<unsigned long long>(done),
                    static_cast<unsigned long long>(room), ok ? "ok" : "failed");
        std::fflush(stdout);
      },
      [](const nlohmann::json& j) {
        std::printf("%s\n", j.dump().c_str());
        std::fflush(stdout);
      });
  if (!summary.is_ok()) {
    std::fprintf(stderr, "pdkv %s: %s\n", name, summary.status().message().c_str());
    return summary.status().code() == StatusCode::kInvalidArgument ? kExitInvalidInput
                                                                   : kExitFailure;
  }
  return (*summary)["verified"].get<bool>() ? kExitOk : kExitFailure;
}

Command add_worker_command(CLI::App& app, Role role) {
  auto args = std::make_shared<worker::WorkerArgs>();
  auto security = std::make_shared<SecurityFlags>();
  args->role = role;
  const bool prefill = role == Role::kPrefill;
  CLI::App* cmd = app.add_subcommand(prefill ? "prefill" : "decode",
                                     prefill ? "Run one prefill rank (writes KV for every request)"
                                             : "Run one decode rank (receives and verifies KV)");
  add_shape_flags(*cmd, args->shape);
  cmd->add_option("--tp-rank", args->tp_rank, "This rank's TP rank")->required();
  cmd->add_option("--engine-id", args->engine_id,
                  prefill ? "This rank's engine id: --prefill-engine (default), named for ps"
                          : "This rank's decode engine: --decode-engine, or with --decode-engines "
                            "N one of ID-0 ... ID-(N-1)");
  cmd->add_option("--bootstrap", args->bootstrap, "Bootstrap service host:port")->required();
  cmd->add_option("--host", args->host,
                  "This rank's address: its control service binds and advertises it, and its "
                  "data plane uses it unless backend options say otherwise")
      ->capture_default_str();
  add_security_flags(*cmd, *security);
  return {cmd, [args, security] { return run(*args, *security); }};
}

}  // namespace

Command add_prefill_command(CLI::App& app) { return add_worker_command(app, Role::kPrefill); }
Command add_decode_command(CLI::App& app) { return add_worker_command(app, Role::kDecode); }

}  // namespace pdkv::cli

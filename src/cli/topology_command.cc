// `pdkv topology --bootstrap ADDR --engine ID [--engine ID ...] [--wait]`:
// what the bootstrap service knows of engines, as an operator checks it (and
// as fault tests do after a restart of the service). One JSON line per
// engine; exit 0 only when every rank of every named engine is registered.
// With --wait it asks again until they are, for at most --timeout in all: a
// start-up script waits for its cluster with one process, not a loop of them.
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/client.h"
#include "cli/command.h"
#include "cli/security_flags.h"

namespace pdkv::cli {
namespace {

struct TopologyOptions {
  std::string bootstrap;
  std::vector<std::string> engines;
  uint32_t dp_rank = 0;
  double timeout_s = 2;
  bool wait = false;
  SecurityFlags security;
};

// How often --wait asks again: ranks renew their registration every second.
constexpr auto kAskAgainEvery = std::chrono::milliseconds(100);

std::string topology_line(const std::string& engine, uint32_t dp_rank,
                          const std::vector<proto::RankInfo>& ranks) {
  nlohmann::ordered_json out{{"engine", engine}, {"dp_rank", dp_rank}};
  nlohmann::json list = nlohmann::json::array();
  for (const auto& r : ranks) {
    list.push_back({{"role", r.role() == proto::ROLE_DECODE ? "decode" : "prefill"},
                    {"tp_rank", r.tp_rank()},
                    {"pp_rank", r.pp_rank()},
                    {"control_address", r.control_address()},
                    {"backend", r.backend()},
                    {"incarnation", r.incarnation()}});
  }
  out["ranks"] = list;
  return out.dump();
}

// One engine's answer, asked again (with --wait) until it is whole or
// `deadline` passes. Each new reason to wait is said once on stderr.
Result<std::vector<proto::RankInfo>> ask(bootstrap::Client& client, const TopologyOptions& o,
                                         const std::string& engine,
                                         std::chrono::steady_clock::time_point deadline) {
  std::string said;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    auto ranks = client.topology(engine, o.dp_rank, std::max(left, std::chrono::milliseconds(1)));
    const bool missing = !ranks.is_ok() && (ranks.status().code() == StatusCode::kNotFound ||
                                            ranks.status().code() == StatusCode::kUnavailable);
    if (ranks.is_ok() || !o.wait || !missing ||
        std::chrono::steady_clock::now() + kAskAgainEvery >= deadline) {
      return ranks;
    }
    if (ranks.status().message() != said) {
      said = ranks.status().message();
      std::fprintf(stderr, "pdkv topology: %s; asking again\n", said.c_str());
    }
    std::this_thread::sleep_for(kAskAgainEvery);  // the retry interval, not a synchronisation
  }
}

int run_topology(const TopologyOptions& o) {
  if (!(o.timeout_s > 0)) {
    std::fprintf(stderr, "pdkv topology: --timeout %g: must be more than 0 seconds\n", o.timeout_s);
    return kExitInvalidInput;
  }
  auto security = o.security.load();
  if (!security.is_ok()) {
    std::fprintf(stderr, "pdkv topology: %s\n", security.status().message().c_str());
    return kExitInvalidInput;
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  bootstrap::Client client(o.bootstrap, *security);
  int exit_code = kExitOk;
  for (const std::string& engine : o.engines) {
    auto ranks = ask(client, o, engine, deadline);
    if (!ranks.is_ok()) {
      std::fprintf(stderr, "pdkv topology: %s\n", ranks.status().message().c_str());
      exit_code = kExitFailure;
      continue;
    }
    std::printf("%s\n", topology_line(engine, o.dp_rank, *ranks).c_str());
    std::fflush(stdout);  // a script reading the lines sees each engine as it completes
  }
  return exit_code;
}

}  // namespace

Command add_topology_command(CLI::App& app) {
  auto o = std::make_shared<TopologyOptions>();
  CLI::App* cmd = app.add_subcommand(
      "topology", "Ask the bootstrap service for engines' registered ranks (a JSON line each)");
  cmd->add_option("--bootstrap", o->bootstrap, "Bootstrap service host:port")->required();
  cmd->add_option("--engine", o->engines, "Engine id (repeat for several)")->required();
  cmd->add_option("--dp-rank", o->dp_rank, "Data-parallel rank")->capture_default_str();
  cmd->add_option("--timeout", o->timeout_s, "Seconds to wait for the answers, all together")
      ->capture_default_str();
  cmd->add_flag("--wait", o->wait,
                "Ask again until every rank of every engine has registered (within --timeout)");
  add_security_flags(*cmd, o->security);
  return {cmd, [o] { return run_topology(*o); }};
}

}  // namespace pdkv::cli

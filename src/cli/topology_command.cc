// `pdkv topology --bootstrap ADDR --engine ID`: what the bootstrap service
// knows of one engine, as an operator checks it (and fault tests do after a
// restart of the service). One JSON line; exit 0 only when every rank of the
// engine is registered.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "bootstrap/client.h"
#include "cli/command.h"
#include "cli/security_flags.h"

namespace pdkv::cli {
namespace {

struct TopologyOptions {
  std::string bootstrap, engine;
  uint32_t dp_rank = 0;
  double timeout_s = 2;
  SecurityFlags security;
};

int run_topology(const TopologyOptions& o) {
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  auto security = o.security.load();
  if (!security.is_ok()) {
    std::fprintf(stderr, "pdkv topology: %s\n", security.status().message().c_str());
    return kExitInvalidInput;
  }
  auto ranks = bootstrap::Client(o.bootstrap, *security).topology(o.engine, o.dp_rank, timeout);
  if (!ranks.is_ok()) {
    std::fprintf(stderr, "pdkv topology: %s\n", ranks.status().message().c_str());
    return kExitFailure;
  }
  nlohmann::ordered_json out{{"engine", o.engine}, {"dp_rank", o.dp_rank}};
  nlohmann::json list = nlohmann::json::array();
  for (const auto& r : *ranks) {
    list.push_back({{"role", r.role() == proto::ROLE_DECODE ? "decode" : "prefill"},
                    {"tp_rank", r.tp_rank()},
                    {"pp_rank", r.pp_rank()},
                    {"control_address", r.control_address()},
                    {"backend", r.backend()},
                    {"incarnation", r.incarnation()}});
  }
  out["ranks"] = list;
  std::printf("%s\n", out.dump().c_str());
  return kExitOk;
}

}  // namespace

Command add_topology_command(CLI::App& app) {
  auto o = std::make_shared<TopologyOptions>();
  CLI::App* cmd =
      app.add_subcommand("topology", "Ask the bootstrap service for one engine's registered ranks");
  cmd->add_option("--bootstrap", o->bootstrap, "Bootstrap service host:port")->required();
  cmd->add_option("--engine", o->engine, "Engine id")->required();
  cmd->add_option("--dp-rank", o->dp_rank, "Data-parallel rank")->capture_default_str();
  cmd->add_option("--timeout", o->timeout_s, "Seconds to wait for an answer")
      ->capture_default_str();
  add_security_flags(*cmd, o->security);
  return {cmd, [o] { return run_topology(*o); }};
}

}  // namespace pdkv::cli

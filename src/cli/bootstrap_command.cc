// `pdkv bootstrap --port N`: the standalone bootstrap service. Runs until
// SIGINT or SIGTERM.
#include <fmt/format.h>
#include <pthread.h>

#include <csignal>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/command.h"
#include "cli/security_flags.h"
#include "pdkv/bootstrap.h"

namespace pdkv::cli {
namespace {

struct BootstrapOptions {
  uint16_t port = 0;
  std::string host = "127.0.0.1";  // never every interface unless asked
  SecurityFlags security;
};

int run_bootstrap(const BootstrapOptions& o) {
  // Block the stop signals before gRPC starts its threads, so that only the
  // sigwait below receives them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  auto security = o.security.load();
  if (!security.is_ok()) {
    std::fprintf(stderr, "pdkv bootstrap: %s\n", security.status().message().c_str());
    return kExitInvalidInput;
  }
  auto server = BootstrapServer::start(fmt::format("{}:{}", o.host, o.port), *security);
  if (!server.is_ok()) {
    std::fprintf(stderr, "pdkv bootstrap: %s\n", server.status().message().c_str());
    return kExitFailure;
  }
  // Machines and scripts read the bound port from this line.
  std::printf("pdkv bootstrap listening on %s:%d\n", o.host.c_str(), (*server)->port());
  std::fflush(stdout);
  int signal = 0;
  sigwait(&stop, &signal);
  (*server)->shutdown();
  return kExitOk;
}

}  // namespace

Command add_bootstrap_command(CLI::App& app) {
  auto o = std::make_shared<BootstrapOptions>();
  CLI::App* cmd = app.add_subcommand("bootstrap", "Run the bootstrap service (topology registry)");
  cmd->add_option("--port", o->port, "TCP port; 0 picks a free one")->capture_default_str();
  cmd->add_option("--host", o->host, "Address to listen on (0.0.0.0: every interface)")
      ->capture_default_str();
  add_security_flags(*cmd, o->security);
  return {cmd, [o] { return run_bootstrap(*o); }};
}

}  // namespace pdkv::cli

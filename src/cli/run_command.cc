// `pdkv run`: the router. Runs one local cluster (cluster_runner.h) and
// prints one summary. Exit 0 only when every request succeeded and every
// byte verified; a worker that dies ends the run within moments, naming the
// rank.
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/cluster_runner.h"
#include "cli/command.h"
#include "cli/security_flags.h"
#include "cli/shape_flags.h"

namespace pdkv::cli {
namespace {

struct RunOptions {
  worker::Shape shape;
  SecurityFlags security;
  bool json = false;
  double timeout_s = 300;
};

int run_router(const RunOptions& o) {
  const worker::Shape& s = o.shape;
  if (Status valid = s.validate(); !valid.is_ok()) {
    std::fprintf(stderr, "pdkv run: %s\n", valid.message().c_str());
    return kExitInvalidInput;
  }
  if (!o.json) {
    const std::string engines = s.decode_engines > 1 ? fmt::format("{} decode engines of TP {}",
                                                                   s.decode_engines, s.decode_tp)
                                                     : fmt::format("decode TP {}", s.decode_tp);
    std::fprintf(stderr,
                 "pdkv run: %s, %u KV heads%s, prefill TP %u -> %s, %s, %llu requests x "
                 "%llu tokens\n",
                 s.backend.c_str(), s.mla ? 1 : s.kv_heads, s.mla ? " (MLA)" : "", s.prefill_tp,
                 engines.c_str(), s.layout.c_str(), static_cast<unsigned long long>(s.requests),
                 static_cast<unsigned long long>(s.tokens));
  }
  // Live progress: a rewritten line on a terminal; in a log, a line a second.
  const bool tty = isatty(STDERR_FILENO);
  auto last_line = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  const ClusterOutcome outcome = run_cluster(
      s, o.timeout_s,
      [&](uint64_t done) {
        const auto now = std::chrono::steady_clock::now();
        if (o.json || !(tty || done == s.requests || now - last_line >= std::chrono::seconds(1))) {
          return;
        }
        last_line = now;
        std::fprintf(stderr, tty ? "\rrequests done: %llu/%llu" : "requests done: %llu/%llu\n",
                     static_cast<unsigned long long>(done),
                     static_cast<unsigned long long>(s.requests));
      },
      o.security);
  if (tty && !o.json) std::fprintf(stderr, "\n");
  if (!outcome.failure.empty()) {
    std::fprintf(stderr, "pdkv run: %s\n", outcome.failure.c_str());
    return kExitFailure;
  }
  const nlohmann::ordered_json out = summarize(s, outcome.summaries, outcome.lost);
  // Without verification (--no-verify) success means every request succeeded
  // (with --keep-going: the run completed).
  const bool ok =
      s.verify ? out["verified"].get<bool>() : s.keep_going || out["failed"].get<uint64_t>() == 0;
  if (o.json) {
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf(
        "requests %llu, failed %llu, bytes %.1f MB, %.2f GB/s, latency p50 %.2f ms p99 %.2f ms, "
        "verified %s\n",
        static_cast<unsigned long long>(s.requests),
        static_cast<unsigned long long>(out["failed"].get<uint64_t>()),
        out["bytes"].get<uint64_t>() / 1e6, out["gbps"].get<double>(), out["p50_ms"].get<double>(),
        out["p99_ms"].get<double>(),
        !s.verify                     ? "no (--no-verify)"
        : out["verified"].get<bool>() ? "yes"
                                      : "NO");
    for (const auto& e : out["errors"]) std::printf("  %s\n", e.get<std::string>().c_str());
    if (s.keep_going && out["failed"].get<uint64_t>() > 0) {
      std::printf(
          "  (--keep-going: %llu failed requests counted with their reasons; --json "
          "lists every outcome)\n",
          static_cast<unsigned long long>(out["failed"].get<uint64_t>()));
    }
  }
  return ok ? kExitOk : kExitFailure;
}

}  // namespace

Command add_run_command(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand(
      "run", "Start bootstrap, prefill and decode ranks on loopback, move N requests, verify");
  add_shape_flags(*cmd, o->shape);
  add_security_flags(*cmd, o->security);
  cmd->add_flag("--json", o->json, "One JSON object on stdout");
  cmd->add_option("--timeout", o->timeout_s, "Give up after this many seconds")
      ->capture_default_str();
  return {cmd, [o] { return run_router(*o); }};
}

}  // namespace pdkv::cli

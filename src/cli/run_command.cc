// `pdkv run`: the router. Starts `pdkv bootstrap`, P prefill and D decode
// ranks as processes on loopback, follows their progress, and prints one
// summary. Exit 0 only when every request succeeded and every byte verified;
// a worker that dies ends the run within moments, naming the rank.
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/shape_flags.h"

extern char** environ;

namespace pdkv::cli {
namespace {

struct RunOptions {
  worker::Shape shape;
  bool json = false;
  double timeout_s = 300;
};

// One child process with its stdout on a pipe, read line by line.
struct Child {
  std::string name;  // "prefill rank 1"
  pid_t pid = -1;
  int out = -1;
  std::string buffer;
  uint64_t progress = 0;
  std::optional<nlohmann::json> summary;
  bool exited = false;
  int status = 0;
};

std::string self_exe() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  return n > 0 ? std::string(path, n) : "pdkv";
}

Status spawn(Child& c, const std::vector<std::string>& args) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return Status::internal("pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const int rc = posix_spawn(&c.pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return Status::internal(fmt::format("cannot start {}: {}", c.name, strerror(rc)));
  }
  c.out = fds[0];
  return Status::ok();
}

// Reads what the child wrote; returns complete lines.
std::vector<std::string> read_lines(Child& c) {
  std::vector<std::string> lines;
  char buf[4096];
  const ssize_t n = read(c.out, buf, sizeof buf);
  if (n <= 0) {
    close(c.out);
    c.out = -1;
    return lines;
  }
  c.buffer.append(buf, n);
  size_t nl;
  while ((nl = c.buffer.find('\n')) != std::string::npos) {
    lines.push_back(c.buffer.substr(0, nl));
    c.buffer.erase(0, nl + 1);
  }
  return lines;
}

std::string exit_text(int status) {
  if (WIFSIGNALED(status))
    return fmt::format("killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return fmt::format("exited with status {}", WEXITSTATUS(status));
}

void stop_all(std::vector<Child>& children) {
  for (auto& c : children) {
    if (!c.exited && c.pid > 0) kill(c.pid, SIGKILL);
  }
  for (auto& c : children) {
    if (!c.exited && c.pid > 0) waitpid(c.pid, &c.status, 0);
    c.exited = true;
  }
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

int run_router(const RunOptions& o) {
  const worker::Shape& s = o.shape;
  if (Status valid = s.validate(); !valid.is_ok()) {
    std::fprintf(stderr, "pdkv run: %s\n", valid.message().c_str());
    return kExitInvalidInput;
  }
  const std::string exe = self_exe();
  // Workers and bootstrap speak up only for warnings, unless the user set a level.
  setenv("SPDLOG_LEVEL", "warn", /*overwrite=*/0);
  std::vector<Child> children;
  Child bootstrap;
  bootstrap.name = "bootstrap";
  if (Status st = spawn(bootstrap, {exe, "bootstrap", "--host", "127.0.0.1", "--port", "0"});
      !st.is_ok()) {
    std::fprintf(stderr, "pdkv run: %s\n", st.message().c_str());
    return kExitFailure;
  }
  // Its first line names the port it bound.
  std::string address;
  while (address.empty() && bootstrap.out >= 0) {
    for (const auto& line : read_lines(bootstrap)) {
      const auto at = line.rfind(' ');
      if (line.rfind("pdkv bootstrap listening on ", 0) == 0 && at != std::string::npos) {
        address = line.substr(at + 1);
      }
    }
  }
  children.push_back(std::move(bootstrap));
  if (address.empty()) {
    stop_all(children);
    std::fprintf(stderr, "pdkv run: the bootstrap service did not start\n");
    return kExitFailure;
  }
  for (int side = 0; side < 2; ++side) {
    const bool prefill = side == 0;
    for (uint32_t r = 0; r < (prefill ? s.prefill_tp : s.decode_tp); ++r) {
      Child c;
      c.name = fmt::format("{} rank {}", prefill ? "prefill" : "decode", r);
      std::vector<std::string> args = {exe, prefill ? "prefill" : "decode"};
      for (auto& a : shape_arguments(s)) args.push_back(a);
      for (auto a :
           {std::string("--tp-rank"), std::to_string(r), std::string("--bootstrap"), address}) {
        args.push_back(a);
      }
      if (Status st = spawn(c, args); !st.is_ok()) {
        stop_all(children);
        std::fprintf(stderr, "pdkv run: %s\n", st.message().c_str());
        return kExitFailure;
      }
      children.push_back(std::move(c));
    }
  }
  if (!o.json) {
    std::fprintf(stderr,
                 "pdkv run: %s, %u KV heads%s, prefill TP %u -> decode TP %u, %s, %llu requests x "
                 "%llu tokens\n",
                 s.backend.c_str(), s.mla ? 1 : s.kv_heads, s.mla ? " (MLA)" : "", s.prefill_tp,
                 s.decode_tp, s.layout.c_str(), static_cast<unsigned long long>(s.requests),
                 static_cast<unsigned long long>(s.tokens));
  }
  const bool tty = isatty(STDERR_FILENO);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(o.timeout_s);
  uint64_t shown = 0;
  std::optional<std::chrono::steady_clock::time_point> reported_at;
  auto last_line = std::chrono::steady_clock::now();
  std::string failure;
  while (failure.empty()) {
    bool workers_left = false;
    std::vector<pollfd> fds;
    std::vector<Child*> owners;
    for (size_t i = 1; i < children.size(); ++i) {
      Child& c = children[i];
      if (c.out >= 0) {
        fds.push_back({c.out, POLLIN, 0});
        owners.push_back(&c);
      }
      workers_left |= !c.exited;
    }
    if (!workers_left) break;
    ::poll(fds.data(), fds.size(), 100);
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP))) continue;
      for (const auto& line : read_lines(*owners[i])) {
        if (line.rfind("progress ", 0) == 0) {
          owners[i]->progress = std::stoull(line.substr(9));
        } else if (!line.empty() && line[0] == '{') {
          owners[i]->summary = nlohmann::json::parse(line, nullptr, false);
        }
      }
    }
    // Every worker has reported: allow a few seconds to exit, then stop the
    // stragglers (their outcome is in), saying who lingered.
    bool all_reported = true;
    for (size_t i = 1; i < children.size(); ++i) all_reported &= children[i].summary.has_value();
    if (all_reported && !reported_at) reported_at = std::chrono::steady_clock::now();
    if (reported_at && std::chrono::steady_clock::now() - *reported_at > std::chrono::seconds(5)) {
      for (size_t i = 1; i < children.size(); ++i) {
        if (children[i].exited) continue;
        std::fprintf(stderr, "pdkv run: %s (pid %d) reported but did not exit; stopped it\n",
                     children[i].name.c_str(), children[i].pid);
        kill(children[i].pid, SIGKILL);
        waitpid(children[i].pid, &children[i].status, 0);
        children[i].exited = true;
      }
      break;
    }
    for (size_t i = 1; i < children.size(); ++i) {
      Child& c = children[i];
      if (c.exited || waitpid(c.pid, &c.status, WNOHANG) != c.pid) continue;
      c.exited = true;
      // A worker that ends without its summary died: the run is over.
      while (c.out >= 0) {
        for (const auto& line : read_lines(c)) {
          if (!line.empty() && line[0] == '{')
            c.summary = nlohmann::json::parse(line, nullptr, false);
        }
      }
      if (!c.summary || c.summary->is_discarded()) {
        failure = fmt::format("{} (pid {}) died: {}", c.name, c.pid, exit_text(c.status));
      }
    }
    uint64_t done = s.requests;
    for (size_t i = 1; i < children.size(); ++i) {
      if (children[i].name.rfind("decode", 0) == 0) done = std::min(done, children[i].progress);
    }
    // Live progress: a rewritten line on a terminal; in a log, a line a second.
    const auto now = std::chrono::steady_clock::now();
    if (!o.json && done != shown &&
        (tty || done == s.requests || now - last_line >= std::chrono::seconds(1))) {
      shown = done;
      last_line = now;
      std::fprintf(stderr, tty ? "\rrequests done: %llu/%llu" : "requests done: %llu/%llu\n",
                   static_cast<unsigned long long>(done),
                   static_cast<unsigned long long>(s.requests));
    }
    if (failure.empty() && std::chrono::steady_clock::now() > deadline) {
      failure = fmt::format("timed out after {} s with {}/{} requests done", o.timeout_s, done,
                            s.requests);
    }
  }
  if (tty && !o.json) std::fprintf(stderr, "\n");
  stop_all(children);  // the bootstrap service, and workers still up after a failure
  if (!failure.empty()) {
    std::fprintf(stderr, "pdkv run: %s\n", failure.c_str());
    return kExitFailure;
  }

  std::set<uint64_t> failed;
  std::vector<double> latencies;
  uint64_t bytes = 0;
  int64_t start = INT64_MAX, end = 0;
  bool verified = true;
  std::vector<std::string> errors;
  uint64_t staged = 0, direct = 0;
  for (size_t i = 1; i < children.size(); ++i) {
    const auto& j = *children[i].summary;
    for (uint64_t r : j["failed_rooms"]) failed.insert(r);
    for (const auto& e : j["errors"])
      errors.push_back(children[i].name + ": " + e.get<std::string>());
    verified &= j["verified"].get<bool>();
    if (j["role"] == "prefill") {
      staged += j["staged_routes"].get<uint64_t>();
      direct += j["direct_routes"].get<uint64_t>();
    }
    if (j["role"] == "decode") {
      bytes += j["bytes"].get<uint64_t>();
      start = std::min<int64_t>(start, j["start_ms"]);
      end = std::max<int64_t>(end, j["end_ms"]);
      for (double l : j["latencies_ms"]) latencies.push_back(l);
    }
  }
  verified &= failed.empty();
  const double seconds = std::max<int64_t>(1, end - start) / 1000.0;
  nlohmann::ordered_json out;
  out["verified"] = verified;
  out["requests"] = s.requests;
  out["failed"] = failed.size();
  out["bytes"] = bytes;
  out["gbps"] = bytes / seconds / 1e9;
  out["p50_ms"] = percentile(latencies, 0.5);
  out["p99_ms"] = percentile(latencies, 0.99);
  out["staged_routes"] = staged;
  out["direct_routes"] = direct;
  out["backend"] = s.backend;
  out["prefill_tp"] = s.prefill_tp;
  out["decode_tp"] = s.decode_tp;
  out["errors"] = errors;
  if (o.json) {
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf(
        "requests %llu, failed %zu, bytes %.1f MB, %.2f GB/s, latency p50 %.2f ms p99 %.2f ms, "
        "verified %s\n",
        static_cast<unsigned long long>(s.requests), failed.size(), bytes / 1e6,
        bytes / seconds / 1e9, percentile(latencies, 0.5), percentile(latencies, 0.99),
        verified ? "yes" : "NO");
    for (const auto& e : errors) std::printf("  %s\n", e.c_str());
  }
  return verified ? kExitOk : kExitFailure;
}

}  // namespace

Command add_run_command(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand(
      "run", "Start bootstrap, prefill and decode ranks on loopback, move N requests, verify");
  add_shape_flags(*cmd, o->shape);
  cmd->add_flag("--json", o->json, "One JSON object on stdout");
  cmd->add_option("--timeout", o->timeout_s, "Give up after this many seconds")
      ->capture_default_str();
  return {cmd, [o] { return run_router(*o); }};
}

}  // namespace pdkv::cli

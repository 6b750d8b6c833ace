// Runs one local cluster for `pdkv run` and `pdkv bench`: starts `pdkv
// bootstrap`, P prefill and D decode ranks as processes on loopback, follows
// their progress, and collects every worker's summary. A worker that dies
// ends the run within moments, naming the rank.
#include "cli/cluster_runner.h"

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
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "cli/parent_watch.h"
#include "cli/shape_flags.h"

namespace pdkv::cli {
namespace {

// One child process with its stdout on a pipe, read line by line.
struct Child {
  std::string name;  // "prefill rank 1", "decode-1 rank 0": its engine id and rank
  bool decode = false;
  uint32_t engine = 0;  // decode ranks: the decode engine's index
  pid_t pid = -1;
  int out = -1;
  std::string buffer;
  uint64_t progress = 0;
  std::set<uint64_t> ok_rooms;  // from "progress N room R ok" lines
  std::optional<nlohmann::json> summary;
  bool lost = false;  // ended by a signal the user sent (--keep-going)
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
  // Each child ends when this process does (parent_watch.h).
  const std::vector<std::string> env = child_environment();
  std::vector<char*> envp;
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const int rc = posix_spawn(&c.pid, argv[0], &actions, nullptr, argv.data(), envp.data());
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

// Signals that a person (or a fault campaign) sends to stop a process, as
// opposed to a crash (SIGSEGV, SIGABRT, SIGBUS, ...).
bool user_signal(int status) {
  if (!WIFSIGNALED(status)) return false;
  const int sig = WTERMSIG(status);
  return sig == SIGKILL || sig == SIGTERM || sig == SIGINT || sig == SIGHUP || sig == SIGQUIT;
}

// A worker's line: "progress N room R ok|failed", or its JSON summary.
void take_line(Child& c, const std::string& line) {
  if (line.rfind("progress ", 0) == 0) {
    unsigned long long done = 0, room = 0;
    char verdict[8] = {};
    const int n = std::sscanf(line.c_str(), "progress %llu room %llu %7s", &done, &room, verdict);
    if (n >= 1) c.progress = done;
    if (n == 3 && std::string(verdict) == "ok") c.ok_rooms.insert(room);
  } else if (!line.empty() && line[0] == '{') {
    c.summary = nlohmann::json::parse(line, nullptr, false);
  }
}

std::string exit_text(int status) {
  if (WIFSIGNALED(status))
    return fmt::format("killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return fmt::format("exited with status {}", WEXITSTATUS(status));
}

// A summary's engine id (a worker of an older build names only its role).
std::string engine_of(const nlohmann::json& summary) {
  return summary.value("engine", summary["role"].get<std::string>());
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

}  // namespace

ClusterOutcome run_cluster(const worker::Shape& s, double timeout_s,
                           const std::function<void(uint64_t)>& progress, SecurityFlags security) {
  const std::string exe = self_exe();
  auto run_secret = RunSecret::make(security);
  if (!run_secret.is_ok()) return {{}, {}, run_secret.status().message()};
  const std::vector<std::string> secured = security.arguments();
  // Workers and bootstrap speak up only for warnings, unless the user set a level.
  setenv("SPDLOG_LEVEL", "warn", /*overwrite=*/0);
  std::vector<Child> children;
  Child bootstrap;
  bootstrap.name = "bootstrap";
  std::vector<std::string> bootstrap_args = {exe,         "bootstrap", "--host",
                                             "127.0.0.1", "--port",    "0"};
  bootstrap_args.insert(bootstrap_args.end(), secured.begin(), secured.end());
  if (Status st = spawn(bootstrap, bootstrap_args); !st.is_ok()) {
    return {{}, {}, st.message()};
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
    return {{}, {}, "the bootstrap service did not start"};
  }
  // The prefill engine, then each decode engine: every rank's command line
  // names its role, engine id and TP rank, so that `ps` finds it.
  for (uint32_t engine = 0; engine <= s.decode_engines; ++engine) {
    const bool prefill = engine == 0;
    const std::string id = prefill ? s.prefill_engine : s.decode_engine_id(engine - 1);
    for (uint32_t r = 0; r < (prefill ? s.prefill_tp : s.decode_tp); ++r) {
      Child c;
      c.name = fmt::format("{} rank {}", id, r);
      c.decode = !prefill;
      c.engine = prefill ? 0 : engine - 1;
      std::vector<std::string> args = {exe,           prefill ? "prefill" : "decode",
                                       "--engine-id", id,
                                       "--tp-rank",   std::to_string(r),
                                       "--bootstrap", address};
      for (auto& a : shape_arguments(s)) args.push_back(a);
      args.insert(args.end(), secured.begin(), secured.end());
      if (Status st = spawn(c, args); !st.is_ok()) {
        stop_all(children);
        return {{}, {}, st.message()};
      }
      children.push_back(std::move(c));
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  uint64_t shown = 0;
  std::optional<std::chrono::steady_clock::time_point> reported_at;
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
      for (const auto& line : read_lines(*owners[i])) take_line(*owners[i], line);
    }
    // Every worker has reported: allow a few seconds to exit, then stop the
    // stragglers (their outcome is in), saying who lingered.
    bool all_reported = true;
    for (size_t i = 1; i < children.size(); ++i) {
      all_reported &= children[i].summary.has_value() || children[i].lost;
    }
    if (all_reported && !reported_at) reported_at = std::chrono::steady_clock::now();
    if (reported_at && std::chrono::steady_clock::now() - *reported_at > std::chrono::seconds(5)) {
      for (size_t i = 1; i < children.size(); ++i) {
        if (children[i].exited) continue;
        std::fprintf(stderr, "pdkv: %s (pid %d) reported but did not exit; stopped it\n",
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
      // A worker that ends without its summary died: the run is over,
      // unless the user stopped it in a run that keeps going.
      while (c.out >= 0) {
        for (const auto& line : read_lines(c)) take_line(c, line);
      }
      if (!c.summary || c.summary->is_discarded()) {
        c.summary.reset();
        if (s.keep_going && user_signal(c.status)) {
          c.lost = true;
          std::fprintf(stderr, "pdkv: %s (pid %d) %s; the run goes on\n", c.name.c_str(), c.pid,
                       exit_text(c.status).c_str());
        } else {
          failure = fmt::format("{} (pid {}) died: {}", c.name, c.pid, exit_text(c.status));
        }
      }
    }
    // Done: per decode engine, the requests every one of its ranks finished.
    std::vector<uint64_t> engine_done(s.decode_engines, s.requests);
    for (size_t i = 1; i < children.size(); ++i) {
      const Child& c = children[i];
      if (c.decode && !c.lost) engine_done[c.engine] = std::min(engine_done[c.engine], c.progress);
    }
    uint64_t done = 0;
    for (uint32_t e = 0; e < s.decode_engines; ++e) {
      done += std::min(engine_done[e], s.decode_share(e).count(s.requests));
    }
    if (done != shown) {
      shown = done;
      if (progress) progress(done);
    }
    if (failure.empty() && std::chrono::steady_clock::now() > deadline) {
      failure =
          fmt::format("timed out after {} s with {}/{} requests done", timeout_s, done, s.requests);
    }
  }
  stop_all(children);  // the bootstrap service, and workers still up after a failure
  ClusterOutcome outcome;
  outcome.failure = failure;
  if (failure.empty()) {
    for (size_t i = 1; i < children.size(); ++i) {
      const Child& c = children[i];
      if (c.summary) {
        outcome.summaries.push_back(*c.summary);
      } else if (c.lost) {
        outcome.lost.push_back({fmt::format("{} (pid {})", c.name, c.pid), c.decode, c.engine,
                                exit_text(c.status), c.ok_rooms});
      }
    }
  }
  return outcome;
}

nlohmann::ordered_json summarize(const worker::Shape& s,
                                 const std::vector<nlohmann::json>& summaries,
                                 const std::vector<LostWorker>& lost) {
  std::map<uint64_t, std::string> failed;        // room -> the first reason (decode ranks first)
  std::map<uint64_t, int64_t> sent_us, done_us;  // by room: the latest rank's event
  uint64_t bytes = 0, staged = 0, direct = 0, notified = 0;
  bool verified = true;
  std::vector<std::string> errors;
  for (int decode_first = 1; decode_first >= 0; --decode_first) {
    for (const auto& j : summaries) {
      if ((j["role"] == "decode") != bool(decode_first)) continue;
      for (const auto& f : j["failed_rooms"]) {
        const std::string why =
            fmt::format("{} rank {}: {}", engine_of(j), j["rank"].get<uint32_t>(),
                        f["reason"].get<std::string>());
        failed.emplace(f["room"].get<uint64_t>(), why);
      }
    }
  }
  // A decode rank that was stopped only vouches for the rooms it finished well.
  for (const LostWorker& w : lost) {
    errors.push_back(fmt::format("{} {}", w.name, w.how));
    for (uint64_t room = 1; room <= s.requests; ++room) {
      if (w.decode && s.decode_engine_of(room) == w.decode_engine && !w.ok_rooms.count(room)) {
        failed.emplace(room, fmt::format("{} {} before it finished", w.name, w.how));
      }
    }
  }
  for (const auto& j : summaries) {
    const bool prefill = j["role"] == "prefill";
    for (const auto& e : j["errors"]) {
      errors.push_back(fmt::format("{} rank {}: {}", engine_of(j), j["rank"].get<uint32_t>(),
                                   e.get<std::string>()));
    }
    verified &= j["verified"].get<bool>();
    auto& events = prefill ? sent_us : done_us;
    for (const auto& e : j["events_us"]) {
      int64_t& t = events[e[0].get<uint64_t>()];
      t = std::max(t, e[1].get<int64_t>());
    }
    if (prefill) {
      staged += j["staged_routes"].get<uint64_t>();
      direct += j["direct_routes"].get<uint64_t>();
    } else {
      bytes += j["bytes"].get<uint64_t>();
      notified += j["notified_reports"].get<uint64_t>();
    }
  }
  // Every request moves the same bytes, so the measured ones carry their
  // share of the total.
  const uint64_t succeeded = s.requests - std::min<uint64_t>(s.requests, failed.size());
  const uint64_t bytes_per_request = succeeded > 0 ? bytes / succeeded : 0;
  std::vector<double> latencies;
  int64_t first = INT64_MAX, last = 0;
  for (const auto& [room, done] : done_us) {
    auto sent = sent_us.find(room);
    if (room <= s.warmup || sent == sent_us.end() || failed.count(room)) continue;
    latencies.push_back((done - sent->second) / 1000.0);
    first = std::min(first, sent->second);
    last = std::max(last, done);
  }
  const double seconds = latencies.empty() ? 0 : std::max<int64_t>(1, last - first) / 1e6;
  const uint64_t measured_bytes = bytes_per_request * latencies.size();
  nlohmann::ordered_json out;
  out["verified"] = verified && (failed.empty() || s.keep_going);
  out["requests"] = s.requests;
  out["warmup"] = s.warmup;
  out["failed"] = failed.size();
  out["bytes"] = bytes;
  out["measured_bytes"] = measured_bytes;
  out["seconds"] = seconds;
  out["gbps"] = seconds > 0 ? measured_bytes / seconds / 1e9 : 0.0;
  out["requests_per_s"] = seconds > 0 ? latencies.size() / seconds : 0.0;
  out["p50_ms"] = percentile(latencies, 0.5);
  out["p99_ms"] = percentile(latencies, 0.99);
  out["staged_routes"] = staged;
  out["direct_routes"] = direct;
  out["notified_reports"] = notified;
  out["backend"] = s.backend;
  out["prefill_tp"] = s.prefill_tp;
  out["decode_tp"] = s.decode_tp;
  out["decode_engines"] = s.decode_engines;
  out["errors"] = errors;
  nlohmann::json outcomes = nlohmann::json::array();
  for (uint64_t room = 1; room <= s.requests; ++room) {
    auto f = failed.find(room);
    outcomes.push_back({{"room", room},
                        {"decode_engine", s.decode_engine_id(s.decode_engine_of(room))},
                        {"ok", f == failed.end()},
                        {"reason", f == failed.end() ? "" : f->second}});
  }
  out["outcomes"] = outcomes;
  nlohmann::json lost_workers = nlohmann::json::array();
  for (const LostWorker& w : lost) lost_workers.push_back({{"name", w.name}, {"how", w.how}});
  out["lost_workers"] = lost_workers;
  return out;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

}  // namespace pdkv::cli

#include "cli/baselines.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <vector>

extern char** environ;

namespace pdkv::cli {
namespace {

// A TCP port that was free a moment ago (bound, read back, released).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), len);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Starts `args` with stdout and stderr discarded; its pid, or -1.
pid_t start_quiet(const std::vector<std::string>& args) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  return rc == 0 ? pid : -1;
}

// Runs a shell command line, returns its stdout (stderr discarded) and status.
std::string capture(const std::string& command, int& status) {
  std::string out;
  FILE* p = popen((command + " 2>/dev/null").c_str(), "r");
  if (p == nullptr) {
    status = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  status = pclose(p);
  return out;
}

void stop(pid_t pid) {
  if (pid <= 0) return;
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

// The client of a server started just before may connect before the server
// listens: try a few times, a moment apart.
template <typename F>
auto retry(F attempt) -> decltype(attempt()) {
  for (int i = 0; i < 20; ++i) {
    if (auto r = attempt()) return r;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return attempt();
}

}  // namespace

double memcpy_gbps(uint64_t bytes) {
  bytes = std::clamp<uint64_t>(bytes, 1 << 20, uint64_t{1} << 30);
  std::vector<char> a(bytes, 1), b(bytes, 2);
  double best = 0;
  for (int pass = 0; pass < 4; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, bytes / s / 1e9);
    std::swap(a, b);
  }
  return best;
}

std::optional<double> ucx_put_gbps(uint64_t message_bytes, std::string& why) {
  const std::string port = std::to_string(free_port());
  const pid_t server = start_quiet({"ucx_perftest", "-p", port});
  if (server < 0) {
    why = "ucx_perftest not found (Debian package ucx-utils)";
    return std::nullopt;
  }
  // About 4 GiB moved: a steady figure in about a second, at least 8 puts
  // so that the first touch of the target's pages weighs little.
  const uint64_t iterations = std::clamp<uint64_t>((uint64_t{4} << 30) / message_bytes, 8, 20000);
  auto result = retry([&]() -> std::optional<double> {
    int status = 0;
    const std::string out =
        capture(fmt::format("ucx_perftest 127.0.0.1 -p {} -t ucp_put_bw -s {} -n {}", port,
                            message_bytes, iterations),
                status);
    // "Final: iters p50 avg overall bw_avg bw_overall rate_avg rate_overall"
    const size_t at = out.rfind("Final:");
    if (status != 0 || at == std::string::npos) return std::nullopt;
    std::istringstream fields(out.substr(at + 6));
    double v[6] = {};
    for (double& x : v) fields >> x;
    return v[5] * 1048576.0 / 1e9;  // overall MB/s (2^20) -> GB/s
  });
  stop(server);
  if (!result) why = "ucx_perftest gave no result";
  return result;
}

std::optional<double> iperf3_gbps(double seconds, std::string& why) {
  const std::string port = std::to_string(free_port());
  const pid_t server = start_quiet({"iperf3", "-s", "-1", "-p", port, "-B", "127.0.0.1"});
  if (server < 0) {
    why = "iperf3 not found (Debian package iperf3)";
    return std::nullopt;
  }
  auto result = retry([&]() -> std::optional<double> {
    int status = 0;
    const std::string out =
        capture(fmt::format("iperf3 -c 127.0.0.1 -p {} -t {} -J", port, seconds), status);
    // A failed client still prints JSON, with "error" and an empty "end".
    const auto j = nlohmann::json::parse(out, nullptr, false);
    const auto bps = nlohmann::json::json_pointer("/end/sum_received/bits_per_second");
    if (status != 0 || !j.is_object() || j.contains("error") || !j.contains(bps) ||
        !j[bps].is_number()) {
      return std::nullopt;
    }
    return j[bps].get<double>() / 8 / 1e9;
  });
  stop(server);
  if (!result) why = "iperf3 gave no result";
  return result;
}

}  // namespace pdkv::cli

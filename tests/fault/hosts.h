// Hosts for fault tests: network namespaces this test creates, joined by
// veth pairs whose addresses exist only inside them, and `pdkv` processes
// started inside them, as an operator would start them on separate machines
// (README, "Run-book: ranks on separate hosts"). Everything is removed, and
// every process ended by pid, when the Hosts object goes away. Needs root
// and iproute2; the tests skip, saying so, where namespaces cannot be made.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/child_process.h"
#include "support/poll.h"
#include "support/run_command.h"

namespace pdkv::testing {

// Host A and host B, joined by `links` veth pairs: link i is
// 10.233.i.1 (A) <-> 10.233.i.2 (B).
class Hosts {
 public:
  explicit Hosts(int links = 1) : id_(std::to_string(::getpid())) {
    a_ = "pdkv-fa-" + id_;
    b_ = "pdkv-fb-" + id_;
    if (::geteuid() != 0) {
      why_not_ = "needs root to create network namespaces";
      return;
    }
    const auto probe = run_command("ip netns add " + a_);
    if (probe.exit_code != 0) {
      why_not_ = "cannot create a network namespace here: " + probe.err;
      return;
    }
    created_ = true;
    ok_ = sh("ip netns add " + b_) && sh("ip -n " + a_ + " link set lo up") &&
          sh("ip -n " + b_ + " link set lo up");
    for (int i = 0; ok_ && i < links; ++i) {
      const std::string l = std::to_string(i);
      ok_ = sh("ip link add fa" + l + " netns " + a_ + " type veth peer name fb" + l + " netns " +
               b_) &&
            sh("ip -n " + a_ + " addr add " + address('a', i) + "/24 dev fa" + l) &&
            sh("ip -n " + b_ + " addr add " + address('b', i) + "/24 dev fb" + l) &&
            sh("ip -n " + a_ + " link set fa" + l + " up") &&
            sh("ip -n " + b_ + " link set fb" + l + " up");
    }
    // A fresh veth pair takes a moment to report carrier: until then
    // libraries that list usable devices (UCX) do not see it.
    for (int i = 0; ok_ && i < links; ++i) {
      ok_ = poll_until([&] { return operstate('a', i) == "up" && operstate('b', i) == "up"; });
      EXPECT_TRUE(ok_) << "link " << i << " did not come up";
    }
  }
  ~Hosts() {
    processes_.clear();  // SIGKILL and reap, by pid
    if (created_) {      // veth pairs go with their namespaces
      run_command("ip netns del " + a_);
      run_command("ip netns del " + b_);
    }
  }
  Hosts(const Hosts&) = delete;
  Hosts& operator=(const Hosts&) = delete;

  // Empty when the hosts are up; else why not (for GTEST_SKIP).
  const std::string& why_not() const { return why_not_; }
  bool ok() const { return ok_ && why_not_.empty(); }

  static std::string address(char host, int link = 0) {
    return "10.233." + std::to_string(link) + (host == 'a' ? ".1" : ".2");
  }
  const std::string& ns(char host) const { return host == 'a' ? a_ : b_; }

  // The command that runs what follows it on `host`.
  std::vector<std::string> exec_in(char host) const {
    return {"/usr/sbin/ip", "netns", "exec", ns(host)};
  }
  // Starts `argv` on `host`; the returned process lives as long as Hosts.
  ChildProcess& start(char host, const std::vector<std::string>& argv,
                      const std::map<std::string, std::string>& env = {}) {
    std::vector<std::string> full = exec_in(host);
    full.insert(full.end(), argv.begin(), argv.end());
    std::map<std::string, std::string> quiet = env;  // warnings only, unless told otherwise
    if (!std::getenv("SPDLOG_LEVEL")) quiet.try_emplace("SPDLOG_LEVEL", "warn");
    processes_.push_back(std::make_unique<ChildProcess>(full, quiet));
    return *processes_.back();
  }
  // Starts `pdkv bootstrap` on host A's first address (`port` 0: any free
  // one) and returns its address "ip:port", or "" (the failure recorded)
  // when it did not say it listens; `*process` is set to it when given.
  std::string start_bootstrap(uint16_t port = 0, ChildProcess** process = nullptr) {
    ChildProcess& boot =
        start('a', {PDKV_BIN, "bootstrap", "--host", address('a'), "--port", std::to_string(port)});
    if (process != nullptr) *process = &boot;
    const std::string first = boot.read_line(std::chrono::seconds(10));
    const bool listening = first.rfind("pdkv bootstrap listening on ", 0) == 0;
    EXPECT_TRUE(listening) << first;
    return listening ? first.substr(first.rfind(' ') + 1) : "";
  }
  // A link between the hosts down or up (on A's side: no packet crosses).
  bool link(int i, bool up) {
    return sh("ip -n " + a_ + " link set fa" + std::to_string(i) + (up ? " up" : " down"));
  }
  // "up", "down", "lowerlayerdown", ... of host's end of link i.
  std::string operstate(char host, int i) {
    const auto r = run_command("ip netns exec " + ns(host) + " cat /sys/class/net/f" +
                               std::string(1, host) + std::to_string(i) + "/operstate");
    return r.exit_code == 0 ? r.out.substr(0, r.out.find('\n')) : "";
  }

 private:
  bool sh(const std::string& command) {
    const auto r = run_command(command);
    EXPECT_EQ(r.exit_code, 0) << command << ": " << r.err;
    return r.exit_code == 0;
  }

  const std::string id_;
  std::string a_, b_, why_not_;
  bool created_ = false, ok_ = false;
  std::vector<std::unique_ptr<ChildProcess>> processes_;
};

// The last line a worker printed that is JSON (its summary), read until it
// exits or `limit` passes; a discarded value when there was none.
inline nlohmann::json summary_of(ChildProcess& worker,
                                 std::chrono::milliseconds limit = std::chrono::seconds(120)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    const std::string line = worker.read_line(left);
    if (line.empty()) break;  // EOF (or time)
    if (line[0] == '{') return nlohmann::json::parse(line, nullptr, false);
  }
  return nlohmann::json::value_t::discarded;
}

}  // namespace pdkv::testing

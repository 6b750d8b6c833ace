// A pdkv_test_peer process (support/engine_peer_main.cc): one engine in its
// own process, to kill, pause or command; killed when this goes away.
#pragma once

#include <signal.h>

#include <chrono>
#include <string>
#include <vector>

#include "pdkv/room.h"
#include "support/child_process.h"

namespace pdkv::testing {

class PeerProcess {
 public:
  // `extra`: HOST, then the backend's OPTION=VALUE arguments
  // (support/engine_peer_main.cc). `wrap` goes before the program (for
  // example "ip netns exec NAME").
  PeerProcess(const std::string& role, const std::string& bootstrap, RoomId room,
              const std::string& backend = "loopback", int keepalive_ms = 1000,
              const std::vector<std::string>& extra = {}, const std::vector<std::string>& wrap = {})
      : child_(argv(wrap,
                    {PDKV_TEST_PEER, role, bootstrap, std::to_string(room), backend,
                     std::to_string(keepalive_ms)},
                    extra)) {}
  // Blocks until the peer printed "ready" (or exited).
  bool ready() { return child_.pid() > 0 && child_.read_line() == "ready"; }
  // A prefill peer serves `room` (pages 4..7 of its pool, the oracle's
  // pattern): "ok", or "failed: why".
  std::string serve(RoomId room) {
    if (!child_.write_line("room " + std::to_string(room))) return "failed: peer gone";
    return outcome(room, std::chrono::seconds(60));
  }
  // Opens `room` (a prefill: Sender and init, no pages; a decode: Receiver
  // and metadata): "" once opened, else why not.
  std::string open(RoomId room) {
    if (!child_.write_line("open " + std::to_string(room))) return "peer gone";
    const std::string line = child_.read_line();
    return line == "opened " + std::to_string(room) ? "" : "said '" + line + "'";
  }
  // How an opened room ended: "ok" or "failed: why"; "failed: said ''" when
  // it has not ended within `limit` (its answer then still comes, and would
  // be read as the next command's: a test ends there).
  std::string wait(RoomId room, std::chrono::milliseconds limit) {
    if (!child_.write_line("wait " + std::to_string(room))) return "failed: peer gone";
    return outcome(room, limit);
  }
  // Its thread count, as it counts it.
  size_t threads() {
    child_.write_line("threads");
    const std::string line = child_.read_line();
    return line.rfind("threads ", 0) == 0 ? std::stoul(line.substr(8)) : 0;
  }
  void pause() { child_.signal(SIGSTOP); }
  void resume() { child_.signal(SIGCONT); }
  void kill_now() { child_.kill_now(); }

 private:
  static std::vector<std::string> argv(std::vector<std::string> wrap,
                                       const std::vector<std::string>& args,
                                       const std::vector<std::string>& extra) {
    wrap.insert(wrap.end(), args.begin(), args.end());
    wrap.insert(wrap.end(), extra.begin(), extra.end());
    return wrap;
  }
  std::string outcome(RoomId room, std::chrono::milliseconds limit) {
    const std::string line = child_.read_line(limit);
    const std::string prefix = "room " + std::to_string(room) + " ";
    return line.rfind(prefix, 0) == 0 ? line.substr(prefix.size()) : "failed: said '" + line + "'";
  }

  ChildProcess child_;
};

}  // namespace pdkv::testing

// A pdkv_test_peer process (support/engine_peer_main.cc): one engine in its
// own process, to kill, pause or command; killed when this goes away.
#pragma once

#include <signal.h>

#include <chrono>
#include <string>

#include "pdkv/room.h"
#include "support/child_process.h"

namespace pdkv::testing {

class PeerProcess {
 public:
  PeerProcess(const std::string& role, const std::string& bootstrap, RoomId room,
              const std::string& backend = "loopback", int keepalive_ms = 1000)
      : child_({PDKV_TEST_PEER, role, bootstrap, std::to_string(room), backend,
                std::to_string(keepalive_ms)}) {}
  // Blocks until the peer printed "ready" (or exited).
  bool ready() { return child_.pid() > 0 && child_.read_line() == "ready"; }
  // A prefill peer serves `room` (pages 4..7 of its pool, the oracle's
  // pattern): "ok", or "failed: why".
  std::string serve(RoomId room) {
    if (!child_.write_line("room " + std::to_string(room))) return "failed: peer gone";
    const std::string line = child_.read_line();
    const std::string prefix = "room " + std::to_string(room) + " ";
    return line.rfind(prefix, 0) == 0 ? line.substr(prefix.size()) : "failed: said '" + line + "'";
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
  ChildProcess child_;
};

}  // namespace pdkv::testing

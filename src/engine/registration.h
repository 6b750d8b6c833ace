// Keeps this rank registered with the bootstrap service. The service keeps
// its registry in memory, so one that was restarted knows nobody: every
// kRenewEvery this rank registers again (RegisterRank is idempotent for the
// same rank), and peers' new lookups find it once the service is back.
// Lookups already answered are cached (topology_lookups.h) and need no
// bootstrap service at all.
//
// Thread-safety: loop thread only.
#pragma once

#include <chrono>
#include <string>

#include "bootstrap/client.h"
#include "engine/event_loop.h"
#include "engine/grpc_calls.h"

namespace pdkv::engine {

class Registration {
 public:
  static constexpr auto kRenewEvery = std::chrono::milliseconds(1000);

  Registration(EventLoop& loop, CallTracker& tracker, const std::string& bootstrap_address,
               const Security& security, proto::RankInfo self);
  // After the first registration (made while the engine starts, blocking).
  void start();
  void stop();

 private:
  void renew();
  void renewed(const grpc::Status& status);

  EventLoop& loop_;
  CallTracker& tracker_;
  bootstrap::Client bootstrap_;
  const proto::RankInfo self_;
  const CallTracker::Group group_;  // the renewal in flight, cancelled by stop()
  EventLoop::TimerId timer_ = 0;
  bool stopped_ = false;
  bool lapsed_ = false;  // the last renewal failed (logged once per lapse)
};

}  // namespace pdkv::engine

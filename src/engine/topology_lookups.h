// The topologies of peer engines, looked up in the bootstrap service without
// blocking: one asynchronous GetTopology per attempt, retried on a timer
// while the engine is still registering (capped backoff), until the
// bootstrap timeout. An answer is cached per (engine, dp rank) with the links
// between that engine and this rank's own, until a rank of that engine is
// lost (a restart registers a new incarnation: look again).
//
// Thread-safety: loop thread only.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bootstrap/client.h"
#include "engine/event_loop.h"
#include "engine/grpc_calls.h"
#include "engine/routing.h"
#include "pdkv/engine.h"

namespace pdkv::engine {

using EngineKey = std::pair<std::string, uint32_t>;  // engine id, dp rank

// A peer engine as this rank sees it.
struct PeerEngine {
  Topology topology;
  std::vector<Link> links;  // every link between the prefill and the decode engine
  std::vector<EngineNotice> notices;
};

class TopologyLookups {
 public:
  using Done = std::function<void(const Result<const PeerEngine*>&)>;

  TopologyLookups(EventLoop& loop, CallTracker& tracker, const std::string& bootstrap_address,
                  const EngineConfig& self);

  // The engine when its answer is cached; otherwise nullopt, and `done` runs
  // (on a later loop iteration) once it is known or the lookup failed. A
  // failed lookup is not cached: the next want() tries again.
  std::optional<const PeerEngine*> want(const EngineKey& engine, Done done);
  // Forgets every engine with a rank at this peer key (PeerRegistry::key_of).
  void forget_peer(const std::string& peer_key);
  // Ends the lookups in flight: their waiters hear "shutting down".
  void stop();
  // For a lookup still in flight, the bootstrap service's last failed answer
  // ("" when there is none yet): what a room that gives up waiting reports.
  std::string last_answer(const EngineKey& engine) const;

 private:
  struct Lookup {
    bool ready = false;
    PeerEngine engine;
    std::vector<Done> waiting;
    Clock::time_point deadline;
    std::string last_answer;  // the latest failed attempt, for diagnosis
  };
  using Fetched = std::function<void(Result<std::vector<proto::RankInfo>>)>;

  void start(const EngineKey& engine);
  // One engine's ranks (`engine`, on behalf of the lookup of `wanted`),
  // retried until `deadline`.
  void fetch(const EngineKey& wanted, const EngineKey& engine, Clock::time_point deadline,
             Fetched done, std::chrono::milliseconds backoff = std::chrono::milliseconds(10),
             Status last = {});
  Result<PeerEngine> link_up(const EngineKey& engine, std::vector<proto::RankInfo> theirs) const;
  void finish(const EngineKey& engine, Result<PeerEngine> result);

  EventLoop& loop_;
  CallTracker& tracker_;
  bootstrap::Client bootstrap_;
  const EngineConfig& self_;
  std::optional<Topology> own_;  // this rank's engine, once looked up
  std::map<EngineKey, Lookup> lookups_;
  uint32_t pending_ = 0;  // lookups_ not ready (Limits::pending_lookups)
  bool stopped_ = false;
};

}  // namespace pdkv::engine

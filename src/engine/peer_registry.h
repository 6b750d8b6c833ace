// Every peer rank an engine has business with, keyed by (control address,
// incarnation): its control link, its transport connection (the one a
// prefill rank writes through), and the rooms bound to it.
//
// Life of a peer:
//   connecting -> up      a room bound it; its control link answered
//   up -> lost            the link broke (death, silence past keepalive):
//                         every room bound to it hears of it (Hooks), the
//                         transport connection is failed, the engine's
//                         lookups forget its engine
//   lost -> connecting    a room binds it again, or has news for it
//                         (link_to_tell): a fresh link and, when written to,
//                         a fresh transport connection; "recovered" once up
//                         (a paused peer resumed, a partition healed)
//   forgotten             no room bound for kIdleLinger (at once when lost):
//                         link stopped, transport connection released
// Work is per event: a loss visits the rooms bound to that peer only.
//
// Thread-safety: loop thread only, except where said.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "engine/blocking_pool.h"
#include "engine/control_link.h"
#include "engine/counters.h"
#include "engine/event_loop.h"
#include "pdkv.pb.h"
#include "pdkv/engine.h"
#include "pdkv/transport.h"

namespace pdkv::engine {

class PeerRegistry {
 public:
  // How long a healthy peer that no room needs keeps its link and connection.
  static constexpr auto kIdleLinger = std::chrono::seconds(30);

  struct Hooks {
    // The peer's control link was lost; once per room bound to it. True
    // when the room still needed the peer (it fails).
    std::function<bool(RoomId, const std::string& peer, const Status& reason)> link_lost;
    // The transport connection wire() started is ready, or failed; once per
    // room bound to the peer then. A connection that fails later (the
    // backend's peer-failure callback) is reported through wire_failed too.
    std::function<void(RoomId, const std::string& peer)> wire_ready;
    std::function<void(RoomId, const std::string& peer, const Status& reason)> wire_failed;
    // Once per loss, after the rooms heard of it.
    std::function<void(const std::string& peer)> peer_lost;
  };

  PeerRegistry(EventLoop& loop, CallTracker& tracker, BlockingPool& connector, Transport& transport,
               proto::RankRef self, const Timeouts& timeouts, const Security& security,
               Counters& counters, Hooks hooks);
  ~PeerRegistry();

  static std::string key_of(const proto::RankInfo& rank);

  // Binds `room` to peer `rank`, opening its control link (a fresh one after
  // a loss). Returns the peer's key.
  std::string attach(const proto::RankInfo& rank, RoomId room);
  void detach(const std::string& key, RoomId room);

  // The peer's link; null when it is unknown.
  ControlLink* link(const std::string& key);
  // The link over which to tell the peer what it must hear if it is alive
  // (a room's failure, decided while it was cut off): its link or, after a
  // loss, a fresh one. A partition that healed lets the message through; a
  // dead peer refuses the fresh link, whose loss drops the message.
  ControlLink* link_to_tell(const std::string& key);
  // Ok while the peer's link is not lost; else why.
  Status health(const std::string& key) const;

  // The transport connection to the peer when there is one; otherwise starts
  // connecting (on the connector's threads) and returns nullopt.
  std::optional<PeerId> wire(const std::string& key);
  // Fails the transport connection (its batches in flight end as failed);
  // the next wire() connects afresh.
  void fail_wire(const std::string& key, const Status& reason);
  // Receiving side, for a peer that wrote into this rank: nothing more of
  // what it sent lands here (Transport::fence_inbound). Once per loss (no
  // `cut`), or once per transport connection the peer reports it cut its
  // writes on (`cut`: the peer's id of that connection).
  void fence_inbound(const std::string& key, std::optional<uint64_t> cut = std::nullopt);
  // The backend reported transport peer `id` failed (posted by the engine).
  void on_transport_failed(PeerId id, const Status& reason);

  size_t size() const { return peers_.size(); }
  // Stops every link (shutdown); no hook runs after it.
  void stop_all();

 private:
  struct Peer {
    std::string key;
    proto::RankInfo rank;
    std::shared_ptr<ControlLink> link;
    Status lost;  // ok unless the link was lost
    bool recovering = false;
    bool fenced = false;                 // since the last loss
    std::optional<uint64_t> fenced_cut;  // the last connection fenced on the peer's word
    enum class Wire { kNone, kConnecting, kReady } wire = Wire::kNone;
    PeerId transport_peer = 0;
    uint64_t connect_generation = 0;
    std::unordered_set<RoomId> rooms;
    EventLoop::TimerId linger = 0;
  };

  void open_link(Peer& peer);
  void on_link_up(const std::string& key);
  void on_link_lost(const std::string& key, const Status& reason);
  void on_connected(const std::string& key, uint64_t generation, Result<PeerId> result);
  void drop_wire(Peer& peer, const Status& reason);
  void forget(const std::string& key);
  void maybe_linger(Peer& peer);
  // The rooms bound to `peer`, copied: a hook may detach rooms.
  std::vector<RoomId> rooms_of(const Peer& peer) const;

  EventLoop& loop_;
  CallTracker& tracker_;
  BlockingPool& connector_;
  Transport& transport_;
  const proto::RankRef self_;
  const Timeouts timeouts_;
  const Security& security_;  // the engine config's, which outlives this
  Counters& counters_;        // its gauge of peers
  Hooks hooks_;
  bool stopped_ = false;
  std::unordered_map<std::string, Peer> peers_;
  std::unordered_map<PeerId, std::string> by_transport_peer_;
  // Lives as long as the registry: jobs on the connector test it.
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace pdkv::engine

#include "engine/peer_registry.h"

#include <fmt/format.h>

#include "engine/routing.h"
#include "log.h"

namespace pdkv::engine {

PeerRegistry::PeerRegistry(EventLoop& loop, CallTracker& tracker, BlockingPool& connector,
                           Transport& transport, proto::RankRef self, const Timeouts& timeouts,
                           const Security& security, Counters& counters, Hooks hooks)
    : loop_(loop),
      tracker_(tracker),
      connector_(connector),
      transport_(transport),
      self_(std::move(self)),
      timeouts_(timeouts),
      security_(security),
      counters_(counters),
      hooks_(std::move(hooks)) {}

PeerRegistry::~PeerRegistry() { stop_all(); }

std::string PeerRegistry::key_of(const proto::RankInfo& rank) {
  return fmt::format("{}#{}", rank.control_address(), rank.incarnation());
}

std::string PeerRegistry::attach(const proto::RankInfo& rank, RoomId room) {
  const std::string key = key_of(rank);
  auto [it, fresh] = peers_.try_emplace(key);
  Peer& peer = it->second;
  if (fresh) {
    peer.key = key;
    peer.rank = rank;
    counters_.peers = peers_.size();
  }
  loop_.cancel(peer.linger);
  peer.linger = 0;
  peer.rooms.insert(room);
  if (!stopped_ && (!peer.link || !peer.lost.is_ok())) {
    peer.recovering = !peer.lost.is_ok();
    open_link(peer);
  }
  return key;
}

void PeerRegistry::detach(const std::string& key, RoomId room) {
  auto it = peers_.find(key);
  if (it == peers_.end()) return;
  it->second.rooms.erase(room);
  maybe_linger(it->second);
}

ControlLink* PeerRegistry::link(const std::string& key) {
  auto it = peers_.find(key);
  return it == peers_.end() ? nullptr : it->second.link.get();
}

ControlLink* PeerRegistry::link_to_tell(const std::string& key) {
  auto it = peers_.find(key);
  if (it == peers_.end()) return nullptr;
  Peer& peer = it->second;
  if (!stopped_ && !peer.lost.is_ok()) {
    peer.recovering = true;
    open_link(peer);
  }
  return peer.link.get();
}

Status PeerRegistry::health(const std::string& key) const {
  auto it = peers_.find(key);
  if (it == peers_.end()) return Status::unavailable(fmt::format("peer {} is not known", key));
  return it->second.lost;
}

void PeerRegistry::open_link(Peer& peer) {
  if (peer.link) peer.link->stop();
  peer.lost = Status::ok();
  peer.fenced = false;
  const std::string key = peer.key;
  peer.link = std::make_shared<ControlLink>(
      loop_, tracker_, peer.rank.control_address(),
      fmt::format("{} ({})", describe(peer.rank), peer.rank.control_address()), self_, security_,
      timeouts_.keepalive, timeouts_.connect,
      ControlLink::Events{[this, key] { on_link_up(key); },
                          [this, key](const Status& reason) { on_link_lost(key, reason); }});
  peer.link->start();
}

void PeerRegistry::on_link_up(const std::string& key) {
  auto it = peers_.find(key);
  if (it == peers_.end() || !it->second.recovering) return;
  it->second.recovering = false;
  logger("engine")->info("control connection to {} recovered", it->second.link->name());
}

void PeerRegistry::on_link_lost(const std::string& key, const Status& reason) {
  auto it = peers_.find(key);
  if (it == peers_.end() || stopped_) return;
  Peer& peer = it->second;
  peer.lost = reason;
  bool needed = false;
  for (RoomId room : rooms_of(peer)) needed |= hooks_.link_lost(room, key, reason);
  // A peer that leaves when no room waits on it (a rank done with its work)
  // is news, not a warning.
  logger("engine")->log(needed ? spdlog::level::warn : spdlog::level::info, "{}", reason.message());
  // Its transport connection goes too: batches in flight to it end failed,
  // and a later room connects afresh.
  if (auto again = peers_.find(key); again != peers_.end()) drop_wire(again->second, reason);
  if (hooks_.peer_lost) hooks_.peer_lost(key);
  if (auto again = peers_.find(key); again != peers_.end()) maybe_linger(again->second);
}

std::optional<PeerId> PeerRegistry::wire(const std::string& key) {
  auto it = peers_.find(key);
  if (it == peers_.end() || stopped_) return std::nullopt;
  Peer& peer = it->second;
  if (peer.wire == Peer::Wire::kReady) return peer.transport_peer;
  if (peer.wire == Peer::Wire::kConnecting) return std::nullopt;
  peer.wire = Peer::Wire::kConnecting;
  const uint64_t generation = ++peer.connect_generation;
  std::weak_ptr<bool> alive = alive_;
  connector_.run([this, alive, key, generation, desc = peer.rank.transport_descriptor()] {
    Result<PeerId> result = transport_.connect(desc);
    loop_.post([this, alive, key, generation, result = std::move(result)]() mutable {
      if (alive.lock()) on_connected(key, generation, std::move(result));
    });
  });
  return std::nullopt;
}

void PeerRegistry::on_connected(const std::string& key, uint64_t generation,
                                Result<PeerId> result) {
  auto it = peers_.find(key);
  const bool current = it != peers_.end() && it->second.connect_generation == generation &&
                       it->second.wire == Peer::Wire::kConnecting && !stopped_;
  if (!current) {
    // Forgotten or failed while connecting: the connection is not wanted.
    if (result.is_ok()) transport_.fail_peer(*result, Status::aborted("peer forgotten"));
    return;
  }
  Peer& peer = it->second;
  if (!result.is_ok()) {
    peer.wire = Peer::Wire::kNone;
    const Status reason = result.status().with_context(
        fmt::format("transport connection to {}", describe(peer.rank)));
    for (RoomId room : rooms_of(peer)) hooks_.wire_failed(room, key, reason);
    return;
  }
  peer.wire = Peer::Wire::kReady;
  peer.transport_peer = *result;
  by_transport_peer_[*result] = key;
  for (RoomId room : rooms_of(peer)) hooks_.wire_ready(room, key);
}

void PeerRegistry::fail_wire(const std::string& key, const Status& reason) {
  auto it = peers_.find(key);
  if (it != peers_.end()) drop_wire(it->second, reason);
}

void PeerRegistry::fence_inbound(const std::string& key, std::optional<uint64_t> cut) {
  auto it = peers_.find(key);
  if (it == peers_.end()) return;
  Peer& peer = it->second;
  if (!cut) {
    if (peer.lost.is_ok() || peer.fenced) return;
    peer.fenced = true;
  } else {
    if (peer.fenced_cut == cut) return;
    peer.fenced_cut = cut;
  }
  logger("engine")->info("fencing {}: {}", describe(peer.rank),
                         cut ? fmt::format("it cut its writes here (its connection {})", *cut)
                             : "its control connection was lost");
  transport_.fence_inbound(peer.rank.transport_descriptor(), cut);
}

void PeerRegistry::drop_wire(Peer& peer, const Status& reason) {
  if (peer.wire == Peer::Wire::kConnecting) ++peer.connect_generation;  // its outcome is stale
  if (peer.wire == Peer::Wire::kReady) {
    by_transport_peer_.erase(peer.transport_peer);
    const PeerId id = peer.transport_peer;
    peer.wire = Peer::Wire::kNone;
    // The backend ends the batches in flight as failed; its callback, which
    // may run inside this call, only posts to the loop.
    transport_.fail_peer(id, reason);
    return;
  }
  peer.wire = Peer::Wire::kNone;
}

void PeerRegistry::on_transport_failed(PeerId id, const Status& reason) {
  auto found = by_transport_peer_.find(id);
  if (found == by_transport_peer_.end()) return;  // dropped already, or not ours
  const std::string key = found->second;
  by_transport_peer_.erase(found);
  auto it = peers_.find(key);
  if (it == peers_.end()) return;
  it->second.wire = Peer::Wire::kNone;
  const Status why = Status::unavailable(
      fmt::format("transport lost peer {}: {}", describe(it->second.rank), reason.message()));
  for (RoomId room : rooms_of(it->second)) hooks_.wire_failed(room, key, why);
}

void PeerRegistry::maybe_linger(Peer& peer) {
  if (!peer.rooms.empty() || stopped_) return;
  if (!peer.lost.is_ok()) {
    forget(peer.key);
    return;
  }
  if (peer.linger != 0) return;
  const std::string key = peer.key;
  peer.linger = loop_.after(kIdleLinger, [this, key] {
    auto it = peers_.find(key);
    if (it == peers_.end()) return;
    it->second.linger = 0;
    if (it->second.rooms.empty()) forget(key);
  });
}

void PeerRegistry::forget(const std::string& key) {
  auto it = peers_.find(key);
  if (it == peers_.end()) return;
  Peer& peer = it->second;
  loop_.cancel(peer.linger);
  if (peer.link) peer.link->stop();
  drop_wire(peer,
            Status::aborted(fmt::format("{} forgotten: no room needs it", describe(peer.rank))));
  peers_.erase(key);
  counters_.peers = peers_.size();
}

std::vector<RoomId> PeerRegistry::rooms_of(const Peer& peer) const {
  return {peer.rooms.begin(), peer.rooms.end()};
}

void PeerRegistry::stop_all() {
  if (stopped_) return;
  stopped_ = true;
  for (auto& [key, peer] : peers_) {
    loop_.cancel(peer.linger);
    if (peer.link) peer.link->stop();
  }
}

}  // namespace pdkv::engine

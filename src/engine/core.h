// The engine's machinery behind Engine, Sender and Receiver: rooms, the
// progress thread, topology lookups and control traffic. One instance per
// rank; every public method may be called from any thread.
//
// Locking: one mutex (mu_) guards every room and cache. Nothing blocking
// (gRPC calls, bootstrap lookups) runs under it: the progress thread
// collects such work as Actions under the lock and runs them after
// releasing it.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_set>
#include <vector>

#include "bootstrap/client.h"
#include "engine/peer_links.h"
#include "engine/pool_memory.h"
#include "engine/pool_staging.h"
#include "engine/routing.h"
#include "engine/staging_pool.h"
#include "pdkv.grpc.pb.h"
#include "pdkv/engine.h"
#include "pdkv/plan.h"

namespace pdkv::engine {

using Clock = std::chrono::steady_clock;
using Action = std::function<void()>;

// Deadline of one control call to a peer (a lost peer cancels it sooner).
inline constexpr auto kControlCallTimeout = std::chrono::seconds(5);

// The peer engine of a room, as looked up in the bootstrap service.
struct PeerEngine {
  enum class Lookup { kPending, kReady, kFailed } lookup = Lookup::kPending;
  Topology topology;
  std::vector<Link> links;  // every link between the prefill and the decode engine
  Status error;
};

// One decode rank a prefill room writes to.
struct Destination {
  Link link;
  proto::RankInfo rank;  // the decode rank, from its engine's topology
  std::optional<proto::TransferInfo> info;
  std::optional<PeerId> peer;  // transport connection
  uint64_t pages_written = 0;
  bool extras_written = false;  // aux and state
  std::vector<BatchId> in_flight;
  bool reported = false;  // Status(Success) acknowledged by the decode rank
  bool report_pending = false;
  bool aborted = false;                   // the decode rank aborted: no new writes
  std::optional<uint64_t> local_staging;  // gather buffer in our staging pool
};

struct PrefillRoom {
  RoomId id = 0;
  RoomState state;
  std::string decode_engine;
  uint32_t decode_dp = 0;
  bool has_sender = false;  // false while only early metadata created it
  std::map<RankKey, Destination> destinations;
  bool initialized = false;
  uint64_t num_pages = 0;
  uint32_t aux_slot = 0;
  std::vector<uint32_t> state_slots;
  std::vector<uint64_t> pages;  // every page sent so far, request order
  bool last = false;
  bool expired = false;  // a room no Sender opened, past its deadline: to be dropped
  Clock::time_point deadline = Clock::time_point::max();
};

struct Source {
  Link link;
  proto::RankInfo rank;
  bool info_sent = false;
  bool info_pending = false;
  bool reported = false;
  std::optional<uint64_t> staging_offset;  // the slot reserved for this source
  uint64_t staging_bytes = 0;
};

struct DecodeRoom {
  RoomId id = 0;
  RoomState state;
  std::string prefill_engine;
  uint32_t prefill_dp = 0;
  bool init_called = false;
  std::map<RankKey, Source> sources;
  std::optional<proto::TransferInfo> metadata;  // set by send_metadata
  Clock::time_point deadline = Clock::time_point::max();
};

class EngineCore : public std::enable_shared_from_this<EngineCore> {
 public:
  // Without `pools`, the engine allocates them (pool_memory.h).
  static Result<std::shared_ptr<EngineCore>> start(EngineConfig config,
                                                   std::optional<EnginePools> pools);
  ~EngineCore();
  void shutdown();

  const EngineConfig& config() const { return config_; }
  const EnginePools& pools() const { return pools_; }
  std::string control_address() const { return self_.control_address(); }
  EngineStats stats() const {
    std::lock_guard lock(mu_);
    return stats_;
  }

  // Sender
  Status open_prefill_room(RoomId room, const std::string& decode_engine, uint32_t dp);
  Status prefill_init(RoomId room, uint64_t num_pages, uint32_t aux_slot,
                      std::vector<uint32_t> state_slots);
  Status prefill_send(RoomId room, std::span<const uint64_t> pages, bool is_last);
  void prefill_abort(RoomId room, const std::string& reason);
  // Receiver
  Status open_decode_room(RoomId room, const std::string& prefill_engine, uint32_t dp);
  Status decode_init(RoomId room);
  Status decode_send_metadata(RoomId room, std::span<const uint64_t> pages, uint32_t aux_slot,
                              std::vector<uint32_t> state_slots);
  Status decode_abort(RoomId room, const std::string& reason);
  // Both
  PollState poll(RoomId room) const;
  Status failure(RoomId room) const;
  void close_room(RoomId room);

  // Control service (gRPC threads)
  Status on_transfer_info(const proto::TransferInfo& info);
  Status on_room_status(const proto::RoomStatus& status);
  Status on_abort(const proto::AbortRequest& request);

 private:
  explicit EngineCore(EngineConfig config);
  Status init(std::unique_ptr<Transport> transport);

  // Lookups
  using EngineKey = std::pair<std::string, uint32_t>;
  PeerEngine& peer_engine(const EngineKey& key);  // starts a lookup if needed (mu_ held)
  void lookup(EngineKey key);

  // Progress thread
  void run();
  void progress_prefill(PrefillRoom& room, bool& busy);
  void progress_decode(DecodeRoom& room);
  void bind_prefill_room(PrefillRoom& room, const PeerEngine& peer);
  void bind_decode_room(DecodeRoom& room, const PeerEngine& peer);
  Status accept_info(PrefillRoom& room, const proto::TransferInfo& info);
  Status post_writes(PrefillRoom& room, Destination& dest);
  // Decode: reserves a staging slot for `source` when staging pays (see Staging).
  // False while a route that must be staged (device pools, see
  // PoolStaging) waits for room in the pool; an error when it never can be.
  Result<bool> reserve_staging(const DecodeRoom& room, Source& source);
  // Decode: scatters a source's staging slot into the pool and frees it.
  Status scatter_staged(const DecodeRoom& room, Source& source);
  // The plan that fills this rank's pages from `source`, with the request's
  // pages numbered 0..n-1 on the source side (the staging layout does not
  // depend on the source's page numbers).
  Result<TransferPlan> staging_plan(const Source& source, const proto::TransferInfo& info);
  void fail_prefill(PrefillRoom& room, const Status& reason);
  void fail_decode(DecodeRoom& room, const Status& reason);
  void on_peer_lost(const std::string& key, const Status& reason);
  void on_transport_peer_failed(PeerId peer, const Status& reason);
  // Fails every open room that still waits on the peer behind link `key`
  // (mu_ held); returns how many.
  size_t fail_rooms_waiting_on(const std::string& key, const Status& reason);
  Status check_room_unused(RoomId id) const;  // mu_ held
  void wake() { cv_.notify_all(); }
  // Every KV route of this rank is staged (device pools the transport
  // cannot register).
  bool staged_only() const { return pool_staging_->mode() == PoolStaging::Mode::kDeviceStaged; }
  void run_actions();  // an action thread: control calls to peers, never under mu_
  // Waits (mu_ held through `lock`) until the lookup of `key` has ended; null
  // unless it succeeded.
  const PeerEngine* await_peer(std::unique_lock<std::mutex>& lock, const EngineKey& key);
  void drain(Destination& dest);

  // Control calls to peers
  std::shared_ptr<PeerLink> link_to(const proto::RankInfo& peer);
  Action report_action(RoomId room, const proto::RankInfo& dest, const Status& outcome);
  Action info_action(RoomId room, const proto::RankInfo& source, const proto::TransferInfo& info);
  // Sends AbortRoom and waits for the acknowledgement; the error names the source.
  Status send_abort(RoomId room, const proto::RankInfo& source, const std::string& reason);
  PrefillRoom* find_prefill(RoomId room);  // open or draining
  proto::RankRef self_ref() const;
  bool closed_before(RoomId room) const { return tombstones_.count(room) > 0; }
  void bury(RoomId room);

  EngineConfig config_;
  EnginePools pools_;
  // Pools the engine mapped itself; declared before transport_, so that they
  // outlive its registrations.
  std::vector<HostMapping> owned_memory_;
  proto::RankInfo self_;
  RankShard shard_;
  uint32_t local_channels_ = 0;
  std::unique_ptr<Transport> transport_;
  // How KV pools and the staging pool exchange bytes (host memcpy, or GPU
  // kernels); declared after transport_, so that it goes first.
  std::unique_ptr<PoolStaging> pool_staging_;
  bool staging_starved_ = false;  // a must-stage route waits for a slot
  std::vector<RegionKey> kv_keys_;
  RegionKey aux_key_ = 0, state_key_ = 0, staging_key_ = 0;
  StagingPool staging_pool_;
  EngineStats stats_;
  // Slots of failed rooms, freed only once any write still on its way has
  // landed (after the transfer timeout).
  std::vector<std::pair<Clock::time_point, uint64_t>> staging_quarantine_;
  Planner planner_;
  std::unique_ptr<bootstrap::Client> bootstrap_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::Service> service_;
  std::unique_ptr<PeerLinks> links_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::vector<Action> deferred_;  // collected under mu_, handed to the action threads
  std::deque<Action> actions_;    // control calls waiting for an action thread
  std::condition_variable actions_cv_;
  std::vector<std::thread> action_threads_;
  std::map<EngineKey, PeerEngine> peers_;
  std::map<RoomId, std::unique_ptr<PrefillRoom>> prefill_rooms_;
  std::map<RoomId, std::unique_ptr<DecodeRoom>> decode_rooms_;
  std::vector<std::unique_ptr<PrefillRoom>> draining_;  // closed, batches still in flight
  std::unordered_set<RoomId> tombstones_;
  std::deque<RoomId> tombstone_order_;
  std::map<std::string, PeerId> transport_peers_;  // by peer link key
  std::vector<std::thread> lookups_;
  std::thread worker_;
};

}  // namespace pdkv::engine

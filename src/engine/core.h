// The machinery behind Engine, Sender and Receiver; one per rank.
//
//   start-up     pools, the transport (with injected faults, if any), its
//                registrations, the control service, the bootstrap
//                registration (engine_start.cc)
//   the loop     owns all room and peer state (event_loop.h); its two sides
//                are the room state machines (prefill_side.h, decode_side.h)
//   the API      checks the caller's own sequencing on the caller's thread
//                (RoomHandle) and posts the rest to the loop; it never waits
//                on a peer
//   shutdown     in an order that lets every call in flight end before what
//                it touches goes away
//
// Threads: the loop, two connector threads (Transport::connect, which may
// block), two copy threads (staged routes' gathers and scatters of host
// pools, EngineContext::copy_then), and gRPC's own; none per peer, room or
// call. No lock of the engine is held across a call into the transport or
// gRPC; transport callbacks are accepted on any thread at any time (they
// post to the loop).
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "engine/blocking_pool.h"
#include "engine/change_feed.h"
#include "engine/control_service.h"
#include "engine/counters.h"
#include "engine/decode_side.h"
#include "engine/engine_context.h"
#include "engine/event_loop.h"
#include "engine/grpc_calls.h"
#include "engine/peer_registry.h"
#include "engine/pool_memory.h"
#include "engine/pool_staging.h"
#include "engine/prefill_side.h"
#include "engine/registration.h"
#include "engine/room_directory.h"
#include "engine/topology_lookups.h"
#include "pdkv/engine.h"

namespace pdkv::engine {

class EngineCore : public std::enable_shared_from_this<EngineCore>, public ControlSink {
 public:
  // Without `pools`, the engine allocates them (pool_memory.h).
  static Result<std::shared_ptr<EngineCore>> start(EngineConfig config,
                                                   std::optional<EnginePools> pools);
  ~EngineCore() override;
  // Fails every open room ("engine shut down"), tells the peers, stops. Any
  // thread but the loop's; idempotent.
  void shutdown();

  const EngineConfig& config() const { return config_; }
  const EnginePools& pools() const { return pools_; }
  std::string control_address() const { return self_.control_address(); }
  EngineStats stats() const;
  ChangeFeed& changes() { return feed_; }

  // The API, from any thread.
  Result<std::shared_ptr<RoomHandle>> open_sender(RoomId room, std::optional<EngineKey> decode);
  Result<std::shared_ptr<RoomHandle>> open_receiver(RoomId room, EngineKey prefill);
  Status sender_init(RoomHandle& room, uint64_t num_pages, uint32_t aux_slot,
                     std::vector<uint32_t> state_slots);
  Status sender_send(RoomHandle& room, std::span<const uint64_t> pages, bool is_last);
  void sender_abort(RoomHandle& room, const std::string& reason);
  Status receiver_init(RoomHandle& room);
  Status receiver_send_metadata(RoomHandle& room, std::span<const uint64_t> pages,
                                uint32_t aux_slot, std::vector<uint32_t> state_slots,
                                uint64_t prefix_pages);
  void receiver_abort(RoomHandle& room, const std::string& reason);
  void close_room(RoomHandle& room);
  std::vector<PollState> poll(std::span<const RoomId> rooms) const;

  // ControlSink: gRPC's threads hand requests over to the loop.
  void on_transfer_info(const proto::TransferInfo& info, AnswerPtr answer) override;
  void on_room_status(const proto::RoomStatus& status, AnswerPtr answer) override;
  void on_abort(const proto::AbortRequest& request, AnswerPtr answer) override;

 private:
  explicit EngineCore(EngineConfig config) : config_(std::move(config)) {}
  // engine_start.cc
  Status check_config();
  Status set_up_memory(std::optional<EnginePools> pools);
  Status register_pools();
  Status start_server();
  void describe_self(int port);
  void build_machinery();
  Status check_slots(RoomId room, uint32_t aux_slot, const std::vector<uint32_t>& state_slots,
                     uint32_t aux_slots, uint32_t state_slots_max) const;
  bool prefill() const { return config_.role == Role::kPrefill; }

  EngineConfig config_;
  RankShard shard_;
  uint32_t local_channels_ = 0;
  // Pools the engine mapped itself; declared before transport_, so that they
  // outlive its registrations.
  std::vector<HostMapping> owned_memory_;
  EnginePools pools_;
  std::unique_ptr<Transport> transport_;
  // How KV pools and the staging pool exchange bytes (host memcpy, or GPU
  // kernels); declared after transport_, so that it goes first.
  std::unique_ptr<PoolStaging> pool_staging_;
  RegionKeys keys_;
  proto::RankInfo self_;

  RoomDirectory directory_;
  ChangeFeed feed_;
  Counters counters_;
  // The loop and what runs on it; everything below is the loop's.
  EventLoop loop_{"pdkv-loop"};
  std::shared_ptr<LoopInbox> transport_inbox_ = std::make_shared<LoopInbox>(loop_);
  CallTracker calls_;
  BlockingPool connector_{"pdkv-connect", 2};
  // Two, so that one long copy (a 32k request's gigabytes) holds up no other
  // room's, and a rank's gathers or scatters overlap its transfers.
  BlockingPool copier_{"pdkv-copy", 2};
  std::unique_ptr<TopologyLookups> lookups_;
  std::unique_ptr<Registration> registration_;
  std::unique_ptr<PeerRegistry> peers_;
  std::unique_ptr<EngineContext> ctx_;
  std::unique_ptr<PrefillSide> prefill_;
  std::unique_ptr<DecodeSide> decode_;
  // gRPC's server threads call the service, which posts to the loop.
  ControlService service_{config_.security, config_.limits};
  std::unique_ptr<grpc::Server> server_;
  std::atomic<bool> stopped_{false};
};

}  // namespace pdkv::engine

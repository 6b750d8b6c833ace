// Engine, Sender and Receiver: the API an inference server links against
// (DESIGN §4). One Engine per rank; one Sender (prefill) or Receiver (decode)
// per request ("room"). The calls follow the order SGLang's schedulers use:
//
//   prefill rank                              decode rank
//   ------------                              -----------
//   Engine::create(config)                    Engine::create(config)
//   s = engine->sender(room)                  r = engine->receiver(room, "prefill-a")
//     poll(): Bootstrapping                   r->init()
//                                               poll(): Bootstrapping -> WaitingForInput
//                                             r->send_metadata(pages, aux_slot)
//     poll(): WaitingForInput  <------------  (metadata reaches every source)
//   s->init(num_pages, aux_slot)
//   s->send(first_pages, false) ...             poll(): Transferring
//   s->send(last_pages, true)
//     poll(): Transferring -> Success           poll(): Success
//
// Both roles register with the bootstrap service, so each side derives the
// same transfer map: a decode rank contacts exactly the prefill ranks that
// expect it, and a prefill rank learns the decode engine from the first
// metadata (or from the Sender, when it names it). Status(Success) travels
// only after the transport reports the bytes visible at the destination.
// Failures travel to every peer of the room; a dead peer is seen through the
// control connection (a Watch stream plus gRPC keepalive), and every open
// room tied to it fails with a reason naming it.
//
// On the prefill side, kFailed is published at once, except while the
// room's last batch to a decode rank carries its success notice (docs/
// protocol.md, "Success over the data plane"): then once that batch ended,
// so that pages it reads are not reused under it. Keep a Sender's pages and
// slots as they are until poll() says Success or Failed; destroying the
// Sender earlier leaves its writes reading them, and so does destroying the
// Engine (it fails every room at once): keep them until ~Engine returned.
//
// On the decode side, kFailed means more than "this room will not succeed":
// it is reported only once no source can write into the room's pages any
// more (each has acknowledged the abort, reported, or is dead), so that the
// pages may be reused at once (docs/protocol.md, "Failure").
//
// Thread-safety: Engine, Sender and Receiver methods may be called from any
// thread, and none waits on a peer: each takes local locks only and hands
// the work to the engine's loop. Destroying a Sender or Receiver clears the
// room: a late message for it is refused, never resurrects it. Destroying
// the Engine first is safe: its rooms fail ("engine shut down").
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "pdkv/faults.h"
#include "pdkv/kv_spec.h"
#include "pdkv/room.h"
#include "pdkv/security.h"
#include "pdkv/sharding.h"
#include "pdkv/status.h"
#include "pdkv/transport.h"

namespace pdkv {

enum class Role : uint8_t { kPrefill, kDecode };

// Staging (DESIGN §3): small fragments are gathered into one contiguous
// block, written at once into a slot the decode rank reserved, and scattered
// there. The decode rank decides per (room, source): kOn always, kAuto when
// the route's writes would cost the transport more than the copies staging
// adds (Transport::write_overhead_bytes_from() of the source, and the
// scatters of the room's sources here: staging_pays() in pdkv/plan.h), kOff
// never. Needs staging_bytes
// on both sides; without room in a pool, a route goes direct.
// kNaive is a benchmark baseline, not a choice for production: no staging and
// no coalescing, one write per (layer, token, K/V) fragment (per head too in
// hnd), the per-token slicing of stacks without a planner.
enum class Staging : uint8_t { kOff, kOn, kAuto, kNaive };

struct Timeouts {
  // Finding the peer engine's topology (all its ranks registered).
  std::chrono::milliseconds bootstrap{30'000};
  // Prefill: from sender() until every destination's metadata arrived.
  // Decode: from send_metadata() until every source reported.
  std::chrono::milliseconds waiting_for_data{120'000};
  // Prefill: from the last chunk until every destination acknowledged its
  // bytes visible; and from a room's failure until its writes in flight
  // ended (after that the transport connection to that peer is failed, which
  // ends them).
  std::chrono::milliseconds transfer{30'000};
  // gRPC keepalive on control connections: a silent peer is declared dead
  // after about twice this.
  std::chrono::milliseconds keepalive{1'000};
  // Setting up a control connection to a peer; one that cannot be reached
  // in this time is declared dead. (An established connection that breaks
  // is a dead peer at once.)
  std::chrono::milliseconds connect{5'000};
};

// Recurrent state per request: [slot][local layer][local channel][channel_bytes].
struct StateSpec {
  uint32_t channels = 0;  // per layer, whole model; 0 = no state data
  uint32_t channel_bytes = 0;
  uint32_t num_slots = 0;
};

struct EngineConfig {
  Role role = Role::kPrefill;
  std::string engine_id;  // the same for every rank of one engine
  uint32_t dp_rank = 0, dp_size = 1;
  uint32_t tp_rank = 0, tp_size = 1;
  uint32_t pp_rank = 0, pp_size = 1;
  std::optional<UnitRange> layers;  // this stage's layers; default: an even split
  KvSpec kv;
  // Aux data (first output token, logprobs, ...): one buffer per entry, each
  // aux_slots items of that many bytes, SGLang's aux_item_lens. Empty: none.
  // The prefill ranks of the last pipeline stage write them.
  std::vector<uint32_t> aux_item_bytes;
  uint32_t aux_slots = 0;
  StateSpec state;
  Staging staging = Staging::kAuto;
  uint64_t staging_bytes = 0;  // this rank's staging pool; 0 = no staging
  std::string backend;         // a registered transport name
  TransportOptions transport_options;
  std::string bootstrap_address;           // host:port
  std::string control_host = "127.0.0.1";  // where peers reach this rank
  Timeouts timeouts;
  // Wraps the transport in the fault-injecting decorator (pdkv/faults.h).
  FaultSpec faults;
  // The cluster secret (and TLS): every rank and the bootstrap service of one
  // cluster need the same (pdkv/security.h, docs/security.md).
  Security security;
  Limits limits;
};

// The rank's memory, registered once with the transport at Engine::create.
// The KV buffers may be GPU memory (kind kCuda or kHip, one device): a
// transport that registers such memory writes it directly; otherwise every
// KV route goes through the staging pool, gathered and scattered by GPU
// kernels, and staging_bytes must be set (docs/gpu.md). Aux, state and
// staging are host memory.
struct EnginePools {
  std::vector<MemoryRegion> kv;   // one per (local layer, K/V): layer * buffers_per_layer + kv
  std::vector<MemoryRegion> aux;  // one per aux_item_bytes entry: aux_slots * its item bytes
  MemoryRegion state;             // num_slots * layers * local channels * channel_bytes
  MemoryRegion staging;           // staging_bytes, when staging_bytes > 0
};

// Counters since the engine started, and gauges; for operators and tests.
struct EngineStats {
  uint64_t staged_routes = 0;      // (room, peer) routes that went through staging
  uint64_t direct_routes = 0;      // routes written fragment by fragment
  uint64_t batches_in_flight = 0;  // gauge: transport batches posted and not yet ended
  uint64_t rooms = 0;              // gauge: rooms the engine tracks (closed ones still ending too)
  uint64_t peers = 0;              // gauge: peer ranks with a control link
  uint64_t loop_tasks = 0;         // events the engine's loop handled
  uint64_t room_steps = 0;         // times a room's state machine ran: follows events, not rooms
  uint64_t engine_threads = 0;     // threads the engine started itself (a constant)
  // Decode: sources whose success was taken from a notice over the data
  // plane, before their RoomStatus call (docs/protocol.md).
  uint64_t notified_reports = 0;
};

// What one room moved, as SGLang's get_transfer_metric reports it.
struct TransferMetrics {
  uint64_t bytes = 0;  // KV, aux and state bytes (prefill: written; decode: as its sources report)
  // From the first write posted (prefill) or the metadata sent (decode) until
  // every byte was visible; 0 until the room succeeded.
  std::chrono::microseconds latency{0};
  bool staged = false;   // a route of the room went through staging
  uint32_t retries = 0;  // control messages sent again (a slow or reconnecting peer)
};

class Sender;
class Receiver;
namespace engine {
class EngineCore;
}

class Engine {
 public:
  // Creates the transport, registers the pools, starts the control service
  // and registers this rank with the bootstrap service.
  static Result<std::unique_ptr<Engine>> create(EngineConfig config, EnginePools pools);
  // As above, with pools the engine allocates, sized from `config` and zeroed:
  // host memory the transport moves fastest where it offers some
  // (Transport::allocate; nixl's comes from UCX), else ordinary memory.
  // pools() gives them to the application; they live as long as the engine.
  static Result<std::unique_ptr<Engine>> create(EngineConfig config);
  ~Engine();  // fails every open room ("engine shut down") and stops

  const EngineConfig& config() const;
  const EnginePools& pools() const;
  std::string control_address() const;
  EngineStats stats() const;

  // Prefill only: the sending side of `room`. The decode engine is learnt
  // from the first metadata that arrives (or from an engine notice, for a
  // rank the map gives nothing to send).
  Result<std::unique_ptr<Sender>> sender(RoomId room);
  // As above, bound for a named decode engine: metadata from another engine
  // is refused (its sender's room fails), and a rank the map gives nothing
  // to send concludes without waiting for any message.
  Result<std::unique_ptr<Sender>> sender(RoomId room, const std::string& decode_engine,
                                         uint32_t decode_dp_rank = 0);
  // Decode only: the receiving side of `room`, fed by a prefill engine.
  Result<std::unique_ptr<Receiver>> receiver(RoomId room, const std::string& prefill_engine,
                                             uint32_t prefill_dp_rank = 0);

  // Many rooms at once: the state of each (kFailed for an id not open here).
  std::vector<PollState> poll(std::span<const RoomId> rooms) const;
  // The rooms whose state changed since the last call, each listed once
  // (in the order they first changed; a room closed since may be listed).
  std::vector<RoomId> take_changed_rooms();
  // Until some room changed state (true) or `timeout` passed (false); the
  // changes stay listed for take_changed_rooms().
  bool wait_for_changes(std::chrono::milliseconds timeout);
  // Readable while changes are listed (for epoll); owned by the engine.
  int change_fd() const;

 private:
  explicit Engine(std::shared_ptr<engine::EngineCore> core);
  std::shared_ptr<engine::EngineCore> core_;
};

namespace engine {
struct RoomHandle;
}

// Prefill states: Bootstrapping until every destination's metadata arrived
// (the decode engine's topology is known and each decode rank the map names
// has sent its page list), WaitingForInput until the first send(),
// Transferring, then Success once every destination acknowledged its bytes.
// init() may come before or after the room leaves Bootstrapping.
class Sender {
 public:
  ~Sender();  // clears the room
  // The pages this rank sends (all chunks; the decode prefix excluded, see
  // decode_prefix_pages) and its aux/state slots in this rank's pools.
  Status init(uint64_t num_pages, uint32_t aux_slot = 0, std::vector<uint32_t> state_slots = {});
  // The next chunk's pages, in request order; `is_last` completes the request
  // (and sends aux and state data).
  Status send(std::span<const uint64_t> pages, bool is_last);
  PollState poll() const;
  // Fails the room here and at every destination, with `reason`.
  void abort(const std::string& reason);
  Status failure() const;
  // The request's first pages, which the decode ranks hold already
  // (Receiver::send_metadata's prefix_pages): they are not sent, and init()
  // and send() count only the pages after them. Known once poll() has left
  // Bootstrapping (SGLang's pop_decode_prefix_len, in pages).
  uint64_t decode_prefix_pages() const;
  TransferMetrics metrics() const;
  RoomId room() const;

 private:
  friend class Engine;
  Sender(std::shared_ptr<engine::EngineCore> core, std::shared_ptr<engine::RoomHandle> room)
      : core_(std::move(core)), room_(std::move(room)) {}
  std::shared_ptr<engine::EngineCore> core_;
  std::shared_ptr<engine::RoomHandle> room_;
};

// Decode states: Bootstrapping until init() found the prefill engine's
// ranks, WaitingForInput until every source accepted the metadata,
// Transferring, then Success once every source reported its bytes visible.
class Receiver {
 public:
  ~Receiver();  // clears the room (an abort, if it is still open)
  // Starts finding the prefill engine's ranks (Bootstrapping -> WaitingForInput).
  Status init();
  // Where the room's bytes go in this rank's pools; sent to exactly the
  // prefill ranks the transfer map names. With `prefix_pages`, the request's
  // first pages are here already (a prefix cache on the decode side):
  // dst_pages are the places of the pages after them, which are all the
  // sources send (aux and state data are sent regardless).
  Status send_metadata(std::span<const uint64_t> dst_pages, uint32_t aux_slot = 0,
                       std::vector<uint32_t> state_slots = {}, uint64_t prefix_pages = 0);
  PollState poll() const;
  // Fails the room and tells every source to stop writing; returns at once.
  // poll() reports kFailed once every source has acknowledged that none of
  // the room's bytes is in flight any more, has reported, or is dead: from
  // then on the pages may be reused.
  void abort(const std::string& reason);
  Status failure() const;
  TransferMetrics metrics() const;
  RoomId room() const;

 private:
  friend class Engine;
  Receiver(std::shared_ptr<engine::EngineCore> core, std::shared_ptr<engine::RoomHandle> room)
      : core_(std::move(core)), room_(std::move(room)) {}
  std::shared_ptr<engine::EngineCore> core_;
  std::shared_ptr<engine::RoomHandle> room_;
};

}  // namespace pdkv

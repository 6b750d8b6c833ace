// Engine, Sender and Receiver: the API an inference server links against
// (DESIGN §4). One Engine per rank; one Sender (prefill) or Receiver (decode)
// per request ("room").
//
//   prefill rank                              decode rank
//   ------------                              -----------
//   Engine::create(kPrefill, pools)           Engine::create(kDecode, pools)
//   s = engine->sender(room, "decode-a")      r = engine->receiver(room, "prefill-a")
//                                             r->init()
//   s->init(num_pages, aux_slot)              r->send_metadata(pages, aux_slot)
//   s->send(first_pages, false) ...           ... poll() until Success or Failed
//   s->send(last_pages, true)
//   poll() until Success or Failed
//
// Both roles register with the bootstrap service, so each side derives the
// same transfer map: a decode rank contacts exactly the prefill ranks that
// expect it, and a prefill rank that the map gives no destination concludes
// at once. Status(Success) travels only after the transport reports the bytes
// visible at the destination. Failures travel to every peer of the room; a
// dead peer is seen through the control connection (a Watch stream plus gRPC
// keepalive), and every open room tied to it fails with a reason naming it.
//
// Thread-safety: Engine, Sender and Receiver methods may be called from any
// thread. A Sender or Receiver must not outlive its Engine. Destroying one
// clears the room: a late message for it is refused, never resurrects it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "pdkv/kv_spec.h"
#include "pdkv/room.h"
#include "pdkv/sharding.h"
#include "pdkv/status.h"
#include "pdkv/transport.h"

namespace pdkv {

enum class Role : uint8_t { kPrefill, kDecode };

// Staging (DESIGN §3): small fragments are gathered into one contiguous
// block, written at once into a slot the decode rank reserved, and scattered
// there. The decode rank decides per (room, source): kOn always, kAuto when a
// route's average fragment is under 4 KiB, kOff never. Needs staging_bytes
// on both sides; without room in a pool, a route goes direct.
// kNaive is a benchmark baseline, not a choice for production: no staging and
// no coalescing, one write per (layer, token, K/V) fragment (per head too in
// hnd), the per-token slicing of stacks without a planner.
enum class Staging : uint8_t { kOff, kOn, kAuto, kNaive };

struct Timeouts {
  // Finding the peer engine's topology (all its ranks registered).
  std::chrono::milliseconds bootstrap{30'000};
  // Prefill: from init() until every destination's metadata arrived.
  // Decode: from send_metadata() until every source reported.
  std::chrono::milliseconds waiting_for_data{120'000};
  // From the last chunk (prefill) until every byte is visible.
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
  uint32_t aux_bytes = 0;  // bytes per aux slot; 0 = no aux data
  uint32_t aux_slots = 0;
  StateSpec state;
  Staging staging = Staging::kAuto;
  uint64_t staging_bytes = 0;  // this rank's staging pool; 0 = no staging
  std::string backend;         // a registered transport name
  TransportOptions transport_options;
  std::string bootstrap_address;           // host:port
  std::string control_host = "127.0.0.1";  // where peers reach this rank
  Timeouts timeouts;
};

// The rank's memory, registered once with the transport at Engine::create.
// The KV buffers may be GPU memory (kind kCuda or kHip, one device): a
// transport that registers such memory writes it directly; otherwise every
// KV route goes through the staging pool, gathered and scattered by GPU
// kernels, and staging_bytes must be set (docs/gpu.md). Aux, state and
// staging are host memory.
struct EnginePools {
  std::vector<MemoryRegion> kv;  // one per (local layer, K/V): layer * buffers_per_layer + kv
  MemoryRegion aux;              // aux_slots * aux_bytes, when aux_bytes > 0
  MemoryRegion state;            // num_slots * layers * local channels * channel_bytes
  MemoryRegion staging;          // staging_bytes, when staging_bytes > 0
};

// Counters since the engine started; for operators and tests.
struct EngineStats {
  uint64_t staged_routes = 0;  // (room, peer) routes that went through staging
  uint64_t direct_routes = 0;  // routes written fragment by fragment
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

  // Prefill only: the sending side of `room`, bound for a decode engine.
  Result<std::unique_ptr<Sender>> sender(RoomId room, const std::string& decode_engine,
                                         uint32_t decode_dp_rank = 0);
  // Decode only: the receiving side of `room`, fed by a prefill engine.
  Result<std::unique_ptr<Receiver>> receiver(RoomId room, const std::string& prefill_engine,
                                             uint32_t prefill_dp_rank = 0);

 private:
  explicit Engine(std::shared_ptr<engine::EngineCore> core);
  std::shared_ptr<engine::EngineCore> core_;
};

class Sender {
 public:
  ~Sender();  // clears the room
  // The request's page count (all chunks) and its aux/state slots in this
  // rank's pools.
  Status init(uint64_t num_pages, uint32_t aux_slot = 0, std::vector<uint32_t> state_slots = {});
  // The next chunk's pages, in request order; `is_last` completes the request
  // (and sends aux and state data).
  Status send(std::span<const uint64_t> pages, bool is_last);
  PollState poll() const;
  // Fails the room here and at every destination, with `reason`.
  void abort(const std::string& reason);
  Status failure() const;
  RoomId room() const { return room_; }

 private:
  friend class Engine;
  Sender(std::shared_ptr<engine::EngineCore> core, RoomId room)
      : core_(std::move(core)), room_(room) {}
  std::shared_ptr<engine::EngineCore> core_;
  RoomId room_;
};

class Receiver {
 public:
  ~Receiver();  // clears the room
  // Starts finding the prefill engine's ranks (Bootstrapping -> WaitingForInput).
  Status init();
  // Where the room's bytes go in this rank's pools; sent to exactly the
  // prefill ranks the transfer map names.
  Status send_metadata(std::span<const uint64_t> dst_pages, uint32_t aux_slot = 0,
                       std::vector<uint32_t> state_slots = {});
  PollState poll() const;
  // Fails the room and tells every source to stop writing. Returns once every
  // source acknowledged (no byte of the room is in flight any more), or an
  // error naming the sources that did not answer.
  Status abort(const std::string& reason);
  Status failure() const;
  RoomId room() const { return room_; }

 private:
  friend class Engine;
  Receiver(std::shared_ptr<engine::EngineCore> core, RoomId room)
      : core_(std::move(core)), room_(room) {}
  std::shared_ptr<engine::EngineCore> core_;
  RoomId room_;
};

}  // namespace pdkv

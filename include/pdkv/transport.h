// The transport interface: what every backend implements, and nothing more.
//
// A backend names remote memory, moves bytes and reports completion or
// failure. It never sees heads, layers, TP or rooms: the protocol layer turns
// those into WriteOps (via the planner) before a backend is involved. A
// backend declares what it can do (TransportCapabilities) so that the core
// never asks which backend it is talking to.
//
// Threading contract for implementations: every method may be called from
// any thread. The peer-failure callback runs on a backend thread with no
// backend lock held, so it may call back into the transport.
//
// "kFailed means over": once poll() reports a batch kFailed, none of its
// bytes lands in the peer's memory later. A backend cancels what it has not
// sent, and waits until what it did send is either acknowledged or cut off
// (drain, then close) before it reports. The one limit: a peer that stops
// reading (a frozen process) cannot acknowledge, so after the backend's drain
// limit (at most a second without progress, 10 s in all) the connection is
// closed and the batch reported;
// bytes the peer's kernel had already received before the close may still be
// written by it, into the failed batch's target range, as it thaws.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pdkv/status.h"

namespace pdkv {

enum class MemoryKind : uint8_t { kHost, kCuda, kHip };
const char* memory_kind_name(MemoryKind kind);                // "host", "cuda", "hip"
Result<MemoryKind> parse_memory_kind(std::string_view name);  // the inverse

// Registered once at start-up, never per request or per page.
struct MemoryRegion {
  void* base = nullptr;
  uint64_t length = 0;
  MemoryKind kind = MemoryKind::kHost;
  int device = 0;
};

using RegionKey = uint32_t;  // this rank's handle for one of its registered regions
using PeerId = uint64_t;     // a connected peer
using BatchId = uint64_t;    // one submitted batch of writes

// One one-sided write: local region bytes -> remote region bytes. Remote
// regions are numbered by the peer's registration order (its RegionKeys).
struct WriteOp {
  RegionKey local_region = 0;
  uint64_t local_offset = 0;
  RegionKey remote_region = 0;
  uint64_t remote_offset = 0;
  uint64_t length = 0;
};

// A one-sided read has the same fields; its bytes flow remote -> local.
using ReadOp = WriteOp;

// The check every backend makes before a byte moves: every op of a batch,
// against the lengths of the local regions and of the peer's regions. The
// first op out of bounds is named with its bytes and region (kOutOfRange);
// `verb` is "write" or "read".
Status check_ops_bounds(std::string_view verb, std::span<const WriteOp> ops,
                        std::span<const uint64_t> local_lengths,
                        std::span<const uint64_t> remote_lengths);

enum class BatchState : uint8_t {
  kInProgress,
  kDone,    // every byte of the batch is visible at the peer
  kFailed,  // see BatchStatus::error; the batch is over
};

struct BatchStatus {
  BatchState state = BatchState::kInProgress;
  // kFailed: why. kInProgress with an error: the batch has failed, and only
  // waits for what the backend's library still holds of it (its bytes may
  // still be moving); a notification it carries will not be delivered. A
  // backend may say so before kFailed, or go straight to kFailed.
  Status error;
  // kFailed: whether bytes the batch had sent may still be on their way
  // into the peer's memory (a cut connection's kernel queue), so that the
  // peer should fence this source (fence_inbound). True unless the backend
  // knows nothing trails, e.g. a failure it decided after the bytes had
  // all landed.
  bool may_trail = true;
};

struct TransportCapabilities {
  bool host_memory = true;
  bool cuda_memory = false;  // can register and write CUDA device memory directly
  bool hip_memory = false;
  bool reads = false;           // one-sided reads as well as writes
  bool notifications = false;   // write_and_notify / take_notifications
  bool fences_inbound = false;  // fence_inbound drops a lost source's late bytes
  // set_batch_end_callback is called when batches end, so that the caller
  // polls them then instead of on a timer.
  bool batch_end_events = false;
  // What one more write costs beyond moving its bytes (posting it, its
  // completion, its framing), as the bytes one core copies in that time.
  // Staging::kAuto gathers a route when its writes would cost more than the
  // copies staging adds (staging_pays() in pdkv/plan.h). Backends set it
  // from what they measure (docs/benchmarks.md, "auto staging").
  // Where a backend reaches some peers by a cheaper path than others (one on
  // the same host), this is its figure for a peer it knows nothing of, and
  // Transport::write_overhead_bytes_from() gives each peer's.
  uint64_t write_overhead_bytes = 8192;
};

// Settings a backend understands (e.g. {"rails", "4"}); unknown keys are an
// error. Every backend takes two that the engine passes:
//  - "host": the rank's address, on which its data plane listens and from
//    which it connects unless its own options say otherwise
//    (EngineConfig::control_host);
//  - "transfer_timeout_ms" (kTransferTimeoutOption): the engine's transfer
//    timeout (Timeouts::transfer). A backend that also ends batches by a
//    clock of its own (mooncake's request timeout, mori's) runs that clock
//    this long unless its own option says otherwise, so that the engine's
//    setting, not a backend's default, decides how long a transfer may take.
using TransportOptions = std::map<std::string, std::string>;
inline constexpr const char* kTransferTimeoutOption = "transfer_timeout_ms";
// Its range: up to 30 days, which a steady clock still adds without overflow.
inline constexpr uint64_t kMaxTransferTimeoutMs = 30ull * 24 * 3600 * 1000;

// A whole-number option value in [min, max], or kInvalidArgument naming the
// backend, the key and the value.
Result<uint64_t> parse_option_number(std::string_view backend, const std::string& key,
                                     const std::string& value, uint64_t min, uint64_t max);

class Transport {
 public:
  using PeerFailureCallback = std::function<void(PeerId peer, const Status& reason)>;

  virtual ~Transport() = default;

  virtual std::string_view name() const = 0;
  virtual TransportCapabilities capabilities() const = 0;
  // What one more write costs (TransportCapabilities::write_overhead_bytes)
  // on the path by which the rank of `source_descriptor` (its descriptor())
  // writes into this one. The decode side asks it per source when it decides
  // whether to stage a route (Staging::kAuto).
  virtual uint64_t write_overhead_bytes_from(std::string_view source_descriptor) const {
    (void)source_descriptor;
    return capabilities().write_overhead_bytes;
  }

  // Host memory that this transport moves faster than ordinary memory, zeroed
  // and still to be registered; the transport owns it, and it lives as long
  // as the transport. (UCX, for one, writes straight into a peer's memory
  // only when UCX allocated it; ordinary memory takes a copy through the
  // peer's own progress.) kFailedPrecondition where the backend has no such
  // memory; on any error the caller allocates ordinary memory instead.
  virtual Result<MemoryRegion> allocate(uint64_t length) {
    (void)length;
    return Status::failed_precondition(std::string(name()) + " has no memory of its own");
  }
  // Makes a region reachable by peers. Keys are dense, in registration order.
  virtual Result<RegionKey> register_region(const MemoryRegion& region) = 0;
  // Opaque bytes that let a peer reach this rank and all its registered
  // regions; regions registered later need a fresh descriptor.
  virtual std::string descriptor() const = 0;
  virtual Result<PeerId> connect(std::string_view peer_descriptor) = 0;

  // Posts the writes; an op outside a registered region (either side) is
  // refused here with an error, before any byte moves.
  virtual Result<BatchId> write(PeerId peer, std::span<const WriteOp> ops) = 0;
  // Posts one-sided reads (bytes flow from the peer's region into the local
  // one), checked as write() checks. Only with capabilities().reads.
  virtual Result<BatchId> read(PeerId peer, std::span<const ReadOp> ops) {
    (void)peer, (void)ops;
    return Status::failed_precondition(std::string(name()) + " has no one-sided reads");
  }
  // kDone and kFailed end the batch: a later poll of the same id is not_found.
  // kFailed only once the batch is over (see "kFailed means over" above).
  virtual BatchStatus poll(BatchId batch) = 0;

  // As write(), then, once the bytes are visible at the peer, delivers
  // `notification` (kMaxNotificationBytes at most) to it, where
  // take_notifications() returns it. A batch that fails delivers it only if
  // its bytes all landed first. `ops` may be empty (a notification alone).
  // Only with capabilities().notifications.
  virtual Result<BatchId> write_and_notify(PeerId peer, std::span<const WriteOp> ops,
                                           std::string_view notification) {
    (void)peer, (void)ops, (void)notification;
    return Status::failed_precondition(std::string(name()) + " has no notifications");
  }
  static constexpr size_t kMaxNotificationBytes = 512;
  // The check every backend makes of a notification before it sends one:
  // kInvalidArgument "<name> notification of N bytes exceeds 512".
  Status check_notification(std::string_view notification) const;
  // Notifications received since the last call, in arrival order.
  virtual std::vector<std::string> take_notifications() { return {}; }

  // Makes the bytes that peers wrote into this rank's regions, and whose
  // completion the caller learnt of through another channel (a control
  // message), visible to the calling thread before it reads them. A NIC's
  // completion already orders them for the CPU, so most backends do nothing.
  virtual void acquire_remote_writes() {}
  // The other direction: orders the calling thread's earlier accesses to
  // registered memory before what peers do to it (write into it, read from
  // it) once told so through another channel. Call before telling a peer
  // where it may write. As above, most backends do nothing.
  virtual void release_to_peers() {}

  // Only with capabilities().batch_end_events: `callback` runs, on one of
  // the transport's threads and with none of its locks held, soon after a
  // batch ends (poll() would say kDone or kFailed), so that the caller polls
  // then instead of on a timer. It says nothing of which batch, and may run
  // when none ended. A batch that ends by time alone (a failed batch whose
  // drain ran out, a timeout found by poll()) may go unannounced: the caller
  // still polls, rarely. Set once, before the first write.
  using EventCallback = std::function<void()>;
  virtual void set_batch_end_callback(EventCallback callback) { (void)callback; }
  // Only with capabilities().notifications, and every such backend calls it:
  // `callback` runs, as the batch-end callback does (one of the transport's
  // threads, none of its locks held), soon after notifications arrive, so
  // that the caller takes them then. It may run when none did. Set once,
  // before any peer connects.
  virtual void set_notification_callback(EventCallback callback) { (void)callback; }

  // Called once per peer that fails, whether the backend detected it or the
  // protocol layer reported it through fail_peer.
  virtual void set_peer_failure_callback(PeerFailureCallback callback) = 0;
  // The protocol layer's liveness signal: the peer is gone. Its batches in
  // flight end as failed with `reason` (once over, as above), later writes to
  // it are refused, and everything the backend kept for it is released.
  virtual void fail_peer(PeerId peer, const Status& reason) = 0;

  // The receiving side's fence: the rank of `peer_descriptor`, a source of
  // writes into this one, is lost, or said that writes of its to this rank
  // failed part-way (its rooms here fail). What it had sent
  // that has not landed yet (bytes a cut link held back) is dropped, even if
  // the path heals later; what it writes after this returns is a new
  // connection's. `connection`, when the source named the connection whose
  // writes were cut (its PeerId for this rank, RoomStatus.cut_connection):
  // that connection and the source's older ones are enough to fence; without
  // it, every connection the source made before the fence is. A backend
  // whose library offers no way to do it does nothing and says so
  // (capabilities().fences_inbound).
  virtual void fence_inbound(std::string_view peer_descriptor, std::optional<uint64_t> connection) {
    (void)peer_descriptor, (void)connection;
  }
};

// Backends register themselves by name at static-initialisation time
// (PDKV_REGISTER_TRANSPORT); the protocol layer creates them by name.
using TransportFactory =
    std::function<Result<std::unique_ptr<Transport>>(const TransportOptions& options)>;

bool register_transport(const std::string& name, TransportFactory factory);
Result<std::unique_ptr<Transport>> create_transport(std::string_view name,
                                                    const TransportOptions& options = {});
std::vector<std::string> transport_names();

}  // namespace pdkv

// In one .cc of a backend: PDKV_REGISTER_TRANSPORT("name", factory_function);
// Link the backend's library whole-archive so the registration is kept.
#define PDKV_REGISTER_TRANSPORT(name, factory)                                 \
  [[maybe_unused]] static const bool PDKV_CONCAT(pdkv_registered_, __LINE__) = \
      ::pdkv::register_transport(name, factory)

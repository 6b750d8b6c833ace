// The `mooncake` transfer engine, shaped like the Mooncake Transfer Engine:
// one segment per process, named by its address and opened by peers through
// its descriptor; batches of requests {opcode, source, target segment,
// target offset, length} with per-request and per-batch status.
//
// Data moves on its own TCP transport: a request is cut into slices that are
// striped over several connections ("rails", one per local/remote address
// pair where a host has several NICs); a target acknowledges a slice once it
// is in memory, and "completed" means every slice is acknowledged. A slice
// that fails on one rail is retried on another. A peer on the same host is
// written with process_vm_writev (one copy) instead, unless switched off,
// or by copies into its pools where they are shared memory (allocate_shared).
// Only peers that present the session secret of this segment's descriptor
// may write into it, and only inside its registered buffers.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pdkv/status.h"
#include "pdkv/transport.h"
#include "segment.h"

namespace pdkv::backends::mooncake {

enum class SameHost : uint8_t { kAuto, kOff, kRequire };

struct EngineConfig {
  std::vector<std::string> listen = {"127.0.0.1"};  // one rail address each; port optional
  std::vector<std::string> bind;                    // local source addresses of outbound rails
  uint32_t rails = 0;  // connections per peer; 0: max(2, the peer's addresses)
  uint64_t slice_bytes = 256 << 10;
  // A rail that moves no byte for this long while it owes acknowledgements
  // (or is connecting) is down; its slices go to another rail.
  std::chrono::milliseconds slice_timeout{5'000};
  // A request not completed this long after submission ends as kTimeout:
  // option request_timeout_ms, else the engine's transfer timeout.
  std::chrono::milliseconds request_timeout{30'000};
  uint32_t retries = 3;  // further rails one slice may try
  SameHost same_host = SameHost::kAuto;
  uint32_t io_threads = 1;
};

// The configuration the `mooncake` transport's options (TransportOptions)
// ask for; kInvalidArgument names an unknown key or a bad value.
Result<EngineConfig> config_from(const TransportOptions& options);

using SegmentHandle = uint64_t;

// kNotify is internal: the message of submit_notification.
enum class Opcode : uint8_t { kWrite, kRead, kNotify };

struct TransferRequest {
  Opcode opcode = Opcode::kWrite;
  char* source = nullptr;      // local registered bytes (where a read lands)
  SegmentHandle target = 0;    // an open segment
  uint64_t target_offset = 0;  // an address inside one of the target's buffers
  uint64_t length = 0;
};

enum class TransferState : uint8_t { kWaiting, kPending, kCompleted, kFailed, kTimeout };
const char* transfer_state_name(TransferState state);

struct TransferStatus {
  TransferState state = TransferState::kWaiting;
  uint64_t transferred_bytes = 0;
  Status error;  // kFailed, kTimeout
};

class TransferEngine {
 public:
  using FailureCallback = std::function<void(SegmentHandle, const Status&)>;

  static Result<std::unique_ptr<TransferEngine>> create(EngineConfig config);
  ~TransferEngine();

  // Zeroed memory in a sealed memfd, owned by the engine, to register next:
  // a peer on this host maps it and copies into it (shared_pool.h).
  Result<void*> allocate_shared(uint64_t length);
  Status register_local_memory(void* addr, uint64_t length);
  // This segment's descriptor (with the buffers registered so far).
  std::string segment_descriptor() const;
  // Whether the segment of `descriptor` runs on this host, where the
  // same-host path may reach it (permission allowing); false for a
  // descriptor that does not decode.
  bool on_this_host(std::string_view descriptor) const;
  Result<SegmentHandle> open_segment(std::string_view descriptor);
  // The target's buffers, as its descriptor listed them.
  Result<std::vector<SegmentDescriptor::Buffer>> segment_buffers(SegmentHandle segment) const;
  // The segment is gone (liveness learnt elsewhere): its requests fail with
  // `reason` and later ones are refused.
  void close_segment(SegmentHandle segment, const Status& reason);
  // Called once per segment that fails, on an I/O thread.
  void set_segment_failure_callback(FailureCallback callback);
  // Called on an I/O thread, with no lock of the engine held, after a batch
  // completed or a request of one failed (Transport::set_batch_end_callback).
  void set_batch_end_callback(std::function<void()> callback);
  // Runs soon after notifications arrive (Transport::set_notification_callback).
  void set_notification_callback(std::function<void()> callback);

  Result<BatchId> allocate_batch_id(size_t batch_size);
  // Requests are numbered in submission order across calls, up to batch_size.
  Status submit_transfer(BatchId batch, std::span<const TransferRequest> requests);
  // Delivers `message` (512 bytes at most) to `target`'s take_notifications()
  // once every request submitted to the batch so far has completed, as one
  // more request of the batch; the batch completes when it is acknowledged.
  // Delivery is at least once: a rail lost before the ACK sends it again.
  Status submit_notification(BatchId batch, SegmentHandle target, std::string message);
  std::vector<std::string> take_notifications();
  Result<TransferStatus> get_transfer_status(BatchId batch, size_t task_id);
  // kFailed or kTimeout if any request did, once no slice of the batch is
  // still out (its other slices are dropped, never retried; until then
  // kPending); kCompleted when all did.
  Result<TransferStatus> get_batch_status(BatchId batch);
  Status free_batch_id(BatchId batch);

  // Orders the bytes peers wrote into this segment before the caller's reads.
  void acquire_inbound_writes() const;
  // Orders the caller's accesses to this segment's buffers before what
  // peers later write into them or read from them.
  void release_to_peers();

  // Bytes this engine moved on the same-host path since it started: through
  // a peer's shared memory mapped here, and by the kernel (process_vm_*v).
  struct SameHostBytes {
    uint64_t mapped = 0, kernel = 0;
  };
  SameHostBytes same_host_bytes() const;

  struct Impl;

 private:
  explicit TransferEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pdkv::backends::mooncake

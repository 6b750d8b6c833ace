// The `nixl` backend: NVIDIA NIXL's UCX path, on UCX `ucp`.
//
// Regions are mapped with ucp_mem_map and described to peers by a packed
// rkey. Memory from allocate() is UCX's own (ucp_mem_map ALLOCATE, shared
// memory here), which peers on this host write into directly; into other
// memory, UCX 1.13 emulates a put with active messages that the target's
// progress thread copies out. The descriptor carries the worker address and
// every region's (base, length, rkey). A batch is one ucp_put_nbx (or
// ucp_get_nbx) per op followed by an endpoint flush: the flush completing is
// UCX's statement that every put is visible at the peer. Only then is the
// notification (a UCX active message) sent, and the batch is done once UCX
// has taken the message.
//
// Threading (progress_thread.h): every UCX call runs on one progress thread
// that owns the worker (UCS_THREAD_MODE_SINGLE). UCX callbacks, which run
// inside ucp_worker_progress, only record what happened (a flush done, a
// peer failed); the progress pass acts on it after ucp_worker_progress has
// returned, because UCX is not re-entrant: closing an endpoint from its own
// error callback, and progressing the worker to wait for the close, is what
// crashed the TCP transport (docs/backends.md, "UCX over TCP").
//
// State: `mu_` guards what API threads read and write (batch statuses, the
// peer table they check writes against, local regions, notifications). The
// UCX objects (endpoints, rkeys, requests) belong to the progress thread
// alone, and no UCX call is made with `mu_` held.
//
// A failed peer is over at once for its callers (writes refused with the
// reason). Its endpoint is drained, then closed, without waiting inside
// anything: a flush, so that what UCX already sends lands now rather than
// after the batch is reported (over TCP the receiver applies puts as it
// reads them from its socket, whatever the sender does next), then a close,
// forced where UCX can cancel (PEER error handling). Its batches are
// reported failed when the close completes: none of their operations is
// then left with UCX (transport.h, "kFailed means over").
#pragma once

#include <ucp/api/ucp.h>

#include <chrono>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "pdkv/transport.h"
#include "progress_thread.h"

namespace pdkv::backends::nixl {

class NixlTransport final : public Transport {
 public:
  static Result<std::unique_ptr<Transport>> create(const TransportOptions& options);
  ~NixlTransport() override;

  std::string_view name() const override { return "nixl"; }
  TransportCapabilities capabilities() const override { return caps_; }
  Result<MemoryRegion> allocate(uint64_t length) override;
  Result<RegionKey> register_region(const MemoryRegion& region) override;
  std::string descriptor() const override;
  Result<PeerId> connect(std::string_view peer_descriptor) override;
  Result<BatchId> write(PeerId peer, std::span<const WriteOp> ops) override {
    return write_and_notify(peer, ops, {});
  }
  Result<BatchId> write_and_notify(PeerId peer, std::span<const WriteOp> ops,
                                   std::string_view notification) override {
    return submit(peer, ops, notification, Direction::kWrite);
  }
  Result<BatchId> read(PeerId peer, std::span<const ReadOp> ops) override {
    return submit(peer, ops, {}, Direction::kRead);
  }
  BatchStatus poll(BatchId batch) override;
  std::vector<std::string> take_notifications() override;
  void set_peer_failure_callback(PeerFailureCallback callback) override;
  void fail_peer(PeerId peer, const Status& reason) override;
  // The receiver's fence (docs/backends.md, "UCX over TCP"): the endpoint
  // UCX made here for the source's is adopted (a ucp_ep_create to the
  // source's worker address matches it) and force-closed, which releases its
  // id, so that the source's emulated puts that arrive later are dropped.
  // PEER error handling only (a forced close); none otherwise.
  void fence_inbound(std::string_view peer_descriptor) override;

  // A failed peer's endpoint is first drained (flushed: what was handed to
  // UCX lands, or the endpoint fails), for at most kDrainLimit, then closed,
  // for at most kCloseLimit; then its batches are reported failed anyway, so
  // that nothing hangs on a peer that neither answers nor fails (a stopped
  // process).
  static constexpr std::chrono::milliseconds kDrainLimit{500}, kCloseLimit{300};
  static constexpr unsigned kNotifyAmId = 0x7d;
  static constexpr size_t kMaxNotification = 512;

 private:
  enum class Direction { kWrite, kRead };

  struct LocalRegion {
    MemoryRegion region;
    ucp_mem_h memh = nullptr;
    bool owns_memh = true;  // false: the memh of an allocation (allocations_)
    std::string rkey;       // packed
  };
  // What API threads check a write against (mu_).
  struct PeerEntry {
    std::vector<uint64_t> region_lengths;
    std::set<BatchId> batches;  // in progress
  };
  struct Batch {
    PeerId peer = 0;
    BatchStatus status;
    std::string notification;
  };
  // The UCX side of a peer (progress thread).
  struct RemoteRegion {
    uint64_t base = 0;
    ucp_rkey_h rkey = nullptr;
  };
  struct ErrorArg {  // the argument of an endpoint's error handler
    NixlTransport* self;
    PeerId peer;
  };
  struct Wire {
    ucp_ep_h ep = nullptr;
    std::vector<RemoteRegion> regions;
    std::unique_ptr<ErrorArg> error_arg;  // alive as long as the endpoint
  };
  // An endpoint being drained, then closed, with the batches that end when
  // it has.
  struct Closing {
    PeerId peer = 0;
    Wire wire;
    std::set<BatchId> batches;
    Status reason;
    enum class Stage { kDraining, kClosing } stage = Stage::kDraining;
    void* request = nullptr;                        // the stage's, with UCX
    std::chrono::steady_clock::time_point give_up;  // of the stage
    bool late = false;                              // a stage ran out of time
  };
  // The user data of a flush or a notification's send.
  struct Pending {
    NixlTransport* self = nullptr;
    BatchId batch = 0;
    std::string payload;  // a notification's bytes, alive until UCX is done with them
    Status error;         // a flush's: an op that UCX refused
  };

  NixlTransport();
  Status init();
  void set_error_handling(std::string_view mode);
  Result<BatchId> submit(PeerId peer, std::span<const WriteOp> ops, std::string_view notification,
                         Direction direction);
  // The allocation (allocate()) that holds all of `region`, if any.
  ucp_mem_h allocation_holding(const MemoryRegion& region) const;

  // Progress thread only (nixl_batches.cc):
  bool progress();
  bool busy() const;
  void start_batch(BatchId id, std::vector<WriteOp> ops, Direction direction);
  void flushed(Pending& flush, ucs_status_t status);
  void notified(BatchId id, ucs_status_t status);
  void end_batch(BatchId id, BatchStatus status);
  void peer_failed(PeerId id, const Status& reason);
  void fence_source(std::string_view worker_address);
  // An endpoint to `worker_address` in this transport's error handling.
  ucp_ep_params_t endpoint_params(std::string_view worker_address, ErrorArg* error_arg) const;
  void start_drain(Closing& closing);
  void start_close(Closing& closing);
  // Moves every closing endpoint on; `all`: now, the thread is gone.
  void finish_closes(bool all);
  void destroy_wire(Wire& wire);
  static void on_flush(void* request, ucs_status_t status, void* user_data);
  static void on_notified(void* request, ucs_status_t status, void* user_data);
  static void on_peer_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  static ucs_status_t on_notification(void* arg, const void* header, size_t header_length,
                                      void* data, size_t length, const ucp_am_recv_param_t* param);

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string worker_address_;
  TransportCapabilities caps_;
  // UCP_ERR_HANDLING_MODE_PEER lets UCX report a dead peer and cancel what
  // was sent to it, but in UCX 1.13 it excludes the shared-memory
  // transports. Option error_handling=auto (the default) turns it on when
  // UCX_TLS names network transports only (docs/backends.md).
  bool peer_error_handling_ = false;
  std::string host_;  // option host: the rank's address
  std::string tls_;   // option tls, else UCX_TLS: the UCX transports asked for

  ProgressThread thread_{"nixl progress thread"};
  PeerFailures<PeerId> failures_{thread_};

  mutable std::mutex mu_;
  std::vector<LocalRegion> regions_;
  std::map<uintptr_t, std::pair<uint64_t, ucp_mem_h>> allocations_;  // base -> (length, memh)
  std::map<PeerId, PeerEntry> peers_;
  std::map<BatchId, Batch> batches_;
  std::vector<std::string> notifications_;
  PeerId next_peer_ = 1;
  BatchId next_batch_ = 1;
  uint64_t in_flight_ = 0;  // batches not yet ended

  // Progress thread only.
  std::map<PeerId, Wire> wires_;
  std::list<Closing> closing_;
  std::map<BatchId, std::unique_ptr<Pending>> pending_;  // a flush or notification with UCX
  // Of endpoints UCX did not close in time: kept until the worker goes.
  std::vector<ucp_rkey_h> abandoned_rkeys_;
  std::vector<std::unique_ptr<ErrorArg>> abandoned_args_;
  std::vector<std::pair<BatchId, ucs_status_t>> flushes_done_, notes_done_;  // from callbacks
  std::vector<std::pair<PeerId, ucs_status_t>> peers_errored_;               // from callbacks
};

}  // namespace pdkv::backends::nixl

// The `nixl` backend: NVIDIA NIXL's UCX path, on UCX `ucp`.
//
// Regions are mapped with ucp_mem_map and described to peers by a packed
// rkey. Memory from allocate() is UCX's own (ucp_mem_map ALLOCATE, shared
// memory here), which peers on this host write into directly; into other
// memory, UCX 1.13 emulates a put with active messages that the target's
// progress thread copies out. The descriptor carries the worker address,
// this transport's instance token and every region's (base, length, rkey).
//
// Two data paths (option data_path, docs/backends.md):
// - put: a batch is one ucp_put_nbx (or ucp_get_nbx) per op followed by an
//   endpoint flush: the flush completing is UCX's statement that every put
//   is visible at the peer. Only then is the notification (a UCX active
//   message) sent, and the batch is done once UCX has taken the message.
// - message (the default where UCX would emulate puts anyway: TCP with PEER
//   error handling): every op goes as eager active messages that name the
//   source's connection and the target address, and a last message ends the
//   batch with its byte count and notification. The target copies the bytes
//   in itself, after checking them against its regions and its fence, and
//   acknowledges the end once it has counted every byte; the batch is done
//   on that acknowledgement. Being the target's own code, the copy is what
//   the receiver's fence gates (fence_inbound), without touching any UCX
//   endpoint: closing the target's endpoint for the source, the fence of
//   put mode, sent a UCX TCP connection-close that crossed the source's own
//   and crashed it (UCX 1.13.1's uct_tcp_iface_handle_events uses an
//   endpoint its receive handler has just destroyed; docs/backends.md).
//   Reads stay ucp_get_nbx.
//
// Threading (progress_thread.h): every UCX call runs on one progress thread
// that owns the worker (UCS_THREAD_MODE_SINGLE). UCX callbacks, which run
// inside ucp_worker_progress, only record what happened (a flush done, a
// peer failed) or, for active messages, do their own small job (copy bytes
// in, answer an end of batch); the progress pass acts on the rest after
// ucp_worker_progress has returned, because UCX is not re-entrant: closing
// an endpoint from its own error callback, and progressing the worker to
// wait for the close, is what crashed the TCP transport (docs/backends.md,
// "UCX over TCP").
//
// State: `mu_` guards what API threads read and write (batch statuses, the
// peer table they check writes against, local regions, notifications). The
// UCX objects (endpoints, rkeys, requests) and the message path's receiving
// state belong to the progress thread alone, and no UCX call is made with
// `mu_` held.
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

#include "drain_deadline.h"
#include "pdkv/transport.h"
#include "progress_thread.h"
#include "spare_vectors.h"
#include "transport_signal.h"

namespace pdkv::backends::nixl {

// "what: UCX's words for status", as an internal error.
Status ucx_error(const std::string& what, ucs_status_t status);

// A peer's descriptor, read (views into its bytes): what connect() uses.
struct ParsedDescriptor {
  struct Region {
    uint64_t base = 0, length = 0;
    std::string_view rkey;  // packed by ucp_rkey_pack
  };
  std::string_view worker_address;
  uint64_t instance = 0;  // the transport's token
  bool messages = false;  // its data path is the message path
  std::vector<Region> regions;
};
Result<ParsedDescriptor> parse_descriptor(std::string_view desc);

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
  void set_batch_end_callback(EventCallback callback) override {
    batch_ends_.set(std::move(callback));
  }
  void set_notification_callback(EventCallback callback) override {
    notes_arrived_.set(std::move(callback));
  }
  void set_peer_failure_callback(PeerFailureCallback callback) override;
  void fail_peer(PeerId peer, const Status& reason) override;
  // The receiver's fence, message path only (docs/backends.md): the
  // source's connections up to `connection`, or without it all it made
  // before the fence (its fence generation moves on), are fenced: their
  // later messages are dropped, and an end of batch on one is answered
  // "fenced", which fails the source's endpoint there so that it writes
  // again over a new one, of the new generation.
  void fence_inbound(std::string_view peer_descriptor, std::optional<uint64_t> connection) override;

  // A failed peer's endpoint is first drained (flushed: what was handed to
  // UCX lands, or the endpoint fails; on the message path, where a flush
  // only means sent, also until the target has answered the end of every
  // batch in flight, which it handles after their bytes) while it makes
  // progress: until kDrainLimit passes without any (a frozen peer; on the
  // put path, any op of the worker completing counts), never beyond
  // kDrainCap; then closed,
  // for at most kCloseLimit; then its batches are reported failed anyway, so
  // that nothing hangs on a peer that neither answers nor fails (a stopped
  // process).
  static constexpr std::chrono::milliseconds kDrainLimit{500}, kCloseLimit{300}, kDrainCap{10000};
  static constexpr unsigned kNotifyAmId = 0x7d;  // put path: the notification
  // Message path: bytes, the end of a batch, and the target's answer to it.
  static constexpr unsigned kDataAmId = 0x7e, kEndAmId = 0x7f, kAnswerAmId = 0x80;
  // The message path's largest message: above it an op is split.
  static constexpr uint64_t kMessageChunk = 64 << 10;
  static constexpr int kProgressCallsPerPass = 16;

  enum class DataPath { kPut, kMessage };

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
    bool messages = false;    // the target's data path (its descriptor) is the message path
    uint64_t target = 0;      // its instance token
    uint64_t generation = 0;  // its fence generation this connection was made in
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
    void* request = nullptr;    // the stage's, with UCX
    bool flush_failed = false;  // the drain's flush: the endpoint is gone
    DrainDeadline limit;        // of the stage (drain_deadline.h)
    uint64_t puts_seen = 0;     // put path: puts_done_ when last looked
    bool late = false;          // a stage ran out of time
  };
  // Message path: what names a sending connection, in every message.
  struct Connection {
    uint64_t instance = 0;    // the sending transport's token (its descriptor)
    uint64_t number = 0;      // its PeerId for the target: 1, 2, ... per instance
    uint64_t generation = 0;  // the target's fence generation it was made in
  };
  struct DataHeader {
    Connection from;
    uint64_t batch = 0;
    uint64_t address = 0;  // where the bytes go, in the target's memory
  };
  struct EndHeader {
    Connection from;
    uint64_t batch = 0;
    uint64_t bytes = 0;   // every data message's bytes, together
    uint64_t notify = 0;  // 1: the payload is a notification to deliver
  };
  struct Answer {
    uint64_t batch = 0;
    uint64_t outcome = 0;     // an Outcome
    uint64_t generation = 0;  // kFenced: the generation to make connections in
  };
  enum Outcome : uint64_t { kLanded = 0, kFenced = 1, kShort = 2, kRefused = 3 };
  // The user data of a batch's flush, notification or messages.
  struct Pending {
    Pending(NixlTransport* owner, BatchId id) : self(owner), batch(id) {}
    NixlTransport* self = nullptr;
    BatchId batch = 0;
    std::string payload;  // a notification's bytes, alive until UCX is done with them
    Status error;         // a flush's: an op that UCX refused
    // Message path: the headers UCX reads until each send completes, and
    // how many sends it still has.
    bool messages = false;  // released by release_finished, not by a flush or send callback
    std::vector<DataHeader> data;
    EndHeader end;
    uint64_t sends = 0;
  };
  // Message path, target side: what a connection's batch has brought so far
  // (a connection's batches arrive one after another), and per source
  // instance the connections seen and fenced.
  struct Arriving {
    uint64_t batch = 0, bytes = 0;
    bool refused = false;  // a message fell outside every region
  };
  struct Source {
    uint64_t generation = 0;  // connections made in an earlier one are fenced
    uint64_t cut = 0;         // and so are those numbered up to this one
    bool fenced(const Connection& c) const { return c.generation < generation || c.number <= cut; }
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
  void start_batch(BatchId id, const std::vector<WriteOp>& ops, Direction direction);
  // Message path (nixl_messages.cc).
  void send_messages(BatchId id, PeerId peer, const std::vector<WriteOp>& ops);
  void answered(const Answer& answer);
  void message_sent(Pending* pending);
  void release_finished(BatchId id);
  void fence_source(uint64_t instance, std::optional<uint64_t> cut);
  bool lands_in_region(uint64_t address, uint64_t length) const;
  void answer(ucp_ep_h reply_ep, uint64_t batch, Outcome outcome, uint64_t generation);
  static void on_message_sent(void* request, ucs_status_t status, void* user_data);
  static void on_answer_sent(void* request, ucs_status_t status, void* user_data);
  static Status outcome_error(uint64_t outcome);
  static ucs_status_t on_data(void* arg, const void* header, size_t header_length, void* data,
                              size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t on_end(void* arg, const void* header, size_t header_length, void* data,
                             size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t on_answer(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param);
  void flushed(Pending& flush, ucs_status_t status);
  void notified(BatchId id, ucs_status_t status);
  void end_batch(BatchId id, BatchStatus status);
  void peer_failed(PeerId id, const Status& reason);
  // An endpoint to `worker_address` in this transport's error handling.
  ucp_ep_params_t endpoint_params(std::string_view worker_address, ErrorArg* error_arg) const;
  void start_drain(Closing& closing);
  void start_close(Closing& closing);
  // Moves every closing endpoint on; `all`: now, the thread is gone.
  void finish_closes(bool all);
  // Whether a stage of `closing` is still under way: its UCX request, and
  // while draining over a live endpoint, message batches not yet answered.
  // (It notes the put path's progress on the way.)
  bool stage_in_progress(Closing& closing);
  // A draining endpoint made progress: its drain may last kDrainLimit more,
  // up to its cap.
  static void keep_draining(Closing& closing);
  // A message of batch `id` was sent or answered: a draining endpoint that
  // carries it is making progress, so its drain goes on.
  void drain_progressed(BatchId id);
  void destroy_wire(Wire& wire);
  static void on_flush(void* request, ucs_status_t status, void* user_data);
  static void on_op_done(void* request, ucs_status_t status, void* user_data);
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
  // Option data_path=auto|put|message; auto: message where UCX would
  // emulate puts and can report a failed peer (PEER handling, UCX_TLS of
  // tcp and self only), put otherwise.
  DataPath data_path_ = DataPath::kPut;
  uint64_t instance_ = 0;  // this transport's token, random
  std::string host_;       // option host: the rank's address
  std::string tls_;        // option tls, else UCX_TLS: the UCX transports asked for

  ProgressThread thread_{"nixl progress thread"};
  PeerFailures<PeerId> failures_{thread_};
  TransportSignal batch_ends_;  // end_batch marks and announces
  // The AM handlers mark when they queue a notification; progress()
  // announces after its pass, once UCX has returned.
  TransportSignal notes_arrived_;
  // The copies of batches' ops that submit() hands the thread, kept from
  // batch to batch.
  SpareVectors<WriteOp> spare_ops_;

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
  std::vector<Answer> answers_;          // message path, from callbacks
  std::vector<Pending*> messages_sent_;  // message path, from callbacks
  uint64_t puts_done_ = 0;               // put path: ops completed, ever (progress thread)
  // Message path, target side.
  std::map<std::pair<uint64_t, uint64_t>, Arriving> arriving_;  // (instance, connection)
  std::map<uint64_t, Source> sources_;                          // by instance
  // Sender side: each target's fence generation, as its answers told it.
  std::map<uint64_t, uint64_t> generations_;  // by target instance
};

}  // namespace pdkv::backends::nixl

// Internals of the mooncake transfer engine, shared by its .cc files.
//
// Threads: API calls run on the caller's thread and touch only what mu_
// guards (batches, segments' failure state) or post work to an event loop.
// Each open segment (Peer) lives on one loop, with all its rails; inbound
// connections are spread over the loops. Rails, peers' queues and inbound
// connections are touched only on their loop's thread.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <vector>

#include "event_loop.h"
#include "frame_io.h"
#include "shared_pool.h"
#include "spare_vectors.h"
#include "transfer_engine.h"
#include "transport_signal.h"

namespace pdkv::backends::mooncake {

using Clock = std::chrono::steady_clock;

// One piece of a request, sent (and acknowledged) as a whole on one rail.
struct Slice {
  BatchId batch = 0;
  uint32_t request = 0;
  Opcode opcode = Opcode::kWrite;
  char* local = nullptr;
  uint64_t remote = 0;  // target address
  uint64_t length = 0;
  uint32_t attempts = 0;  // rails tried so far
  uint64_t seq = 0;       // on its current rail
  std::string message;    // kNotify's payload
};
using SlicePtr = std::unique_ptr<Slice>;
using Slices = std::vector<SlicePtr>;

class Peer;
struct LoopContext;

// One outbound connection to a peer, reused across reconnects.
class Rail final : public EventLoop::Handler {
 public:
  // kHandshake: connected, waiting for the target's CHALLENGE (slices queue).
  enum class State { kDown, kConnecting, kHandshake, kOpen };
  Rail(Peer& peer, size_t index, SocketAddress remote, std::optional<SocketAddress> local);
  ~Rail() override;

  State state() const { return state_; }
  uint64_t queued_bytes() const { return queued_bytes_; }
  const std::string& label() const { return label_; }
  const Status& last_failure() const { return last_failure_; }
  // Whether the last failure was setting up the connection (or a refusal).
  bool failed_connecting() const { return failed_connecting_; }

  void connect();  // kDown -> kConnecting (or kDown with last_failure set)
  void enqueue(SlicePtr slice);
  // Takes the rail down and hands back every slice not acknowledged.
  Slices shut(const Status& reason, bool connecting);
  // Whether a slice of `batch` is queued or unacknowledged here.
  bool holds(BatchId batch) const;
  // The slices of `batch` whose frames have not begun to go: taken back.
  // (The target acknowledges cumulatively, so a gap in sequence numbers is
  // fine.)
  Slices drop_unsent(BatchId batch);
  // The peer failed: frames not yet begun are dropped (their slices handed
  // back); what was sent is drained, its ACKs awaited until `until`, then
  // the rail is reset. Over TCP the target applies what it reads whatever
  // the sender does next, so the batch is reported only after this.
  Slices stop_sending(Clock::time_point until);
  // The slices sent and not yet acknowledged.
  const std::deque<SlicePtr>& unacked() const { return unacked_; }
  void fail(const Status& reason, bool connecting);  // shut + hand slices to the peer
  // Loop tick: fails the rail if it owes progress and made none. Returns
  // whether it has work with a deadline.
  bool check_progress(Clock::time_point now);
  void on_events(uint32_t events) override;

 private:
  void on_connected();
  // Answers the target's CHALLENGE with HELLO, ahead of the queued slices.
  Status on_challenge(std::string target_nonce);
  void flush();
  void update_interest();
  Status on_header(const wire::FrameHeader& h, PayloadSink& sink);
  Status on_frame(const wire::FrameHeader& h, std::string& kept);
  Status complete_writes_before(uint64_t seq);

  Peer& peer_;
  std::string label_;
  SocketAddress remote_;
  std::optional<SocketAddress> local_;
  State state_ = State::kDown;
  int fd_ = -1;
  uint64_t next_seq_ = 1;
  std::deque<SlicePtr> unacked_;  // queued or sent, in seq order
  uint64_t queued_bytes_ = 0;
  FrameReader reader_;
  FrameWriter writer_;
  Slices done_;  // completed during one pump, reported together
  Clock::time_point last_progress_;
  std::optional<Clock::time_point> draining_until_;  // stop_sending()
  Status last_failure_;
  bool failed_connecting_ = false;
  std::string nonce_, target_nonce_;  // this connection's handshake
  bool proven_ = false;               // HELLO_OK proved the target holds the secret
};

// An open segment: where its requests go and how.
class Peer {
 public:
  // `mapped`: the peer's shared buffers, mapped by the caller of
  // open_segment (empty off the same-host path).
  Peer(TransferEngine::Impl& core, SegmentHandle handle, SegmentDescriptor desc, LoopContext& loop,
       PeerMappings mapped);
  ~Peer();

  TransferEngine::Impl& core() { return core_; }
  LoopContext& loop() { return loop_; }
  SegmentHandle handle() const { return handle_; }
  const SegmentDescriptor& descriptor() const { return desc_; }
  // The peer's buffer holding [addr, addr + length), or nullptr; any thread.
  const SegmentDescriptor::Buffer* find_buffer(uint64_t addr, uint64_t length) const {
    return buffer_index_.find(addr, length);
  }

  // Loop thread only, from here on.
  void start(bool same_host, int pidfd);
  void dispatch(Slices slices);
  // dispatch() on this peer's loop; any thread.
  void post_dispatch(Slices slices);
  void post_dispatch(SlicePtr slice);
  // Batch `batch` failed: none of its slices goes any more. What has not
  // begun to go is dropped; what has is left to be acknowledged, so that it
  // lands before the batch is reported, never after; a rail still owing
  // one after kDrainLimit is reset (a target that reads nothing).
  void cancel(BatchId batch);
  void rail_failed(Rail& rail, Slices slices);
  // The peer is gone: everything fails, once. `noticed_here` as for
  // Impl::segment_failed.
  void fail(const Status& reason, bool noticed_here = true);
  bool tick(Clock::time_point now);

 private:
  class ExitWatch;
  Rail* pick_rail();
  // Fails the peer when every rail failed to connect or was refused;
  // returns whether it did.
  bool fail_if_unreachable();
  std::string rails_report() const;
  void drain_same_host();
  // Copies queued slices whose target lies in a mapped shared buffer, up to
  // the budget of one turn; returns them.
  Slices copy_mapped();
  void fall_back_to_tcp(const std::string& why);

  TransferEngine::Impl& core_;
  const SegmentHandle handle_;
  const SegmentDescriptor desc_;
  const BufferIndex buffer_index_;  // of desc_.buffers
  LoopContext& loop_;
  std::vector<std::unique_ptr<Rail>> rails_;
  std::optional<Clock::time_point> last_reconnect_;
  bool same_host_ = false;
  std::deque<SlicePtr> same_host_queue_;
  bool draining_ = false;
  size_t one_at_a_time_ = 0;  // same-host slices to copy singly, after a bad address
  int pidfd_ = -1;
  PeerMappings mapped_;  // the peer's shared buffers, on the same-host path
  std::unique_ptr<ExitWatch> exit_watch_;
  std::map<BatchId, Clock::time_point> cancelled_;  // batch -> end of its drain
  Status failure_;
};

class Inbound;

// One event loop and what lives on it.
struct LoopContext {
  EventLoop loop;
  std::vector<Peer*> peers;
  std::map<Inbound*, std::unique_ptr<Inbound>> inbound;
};

class Listener final : public EventLoop::Handler {
 public:
  Listener(TransferEngine::Impl& core, int fd) : core_(core), fd_(fd) {}
  ~Listener() override;
  int fd() const { return fd_; }
  void on_events(uint32_t events) override;

 private:
  TransferEngine::Impl& core_;
  int fd_;
};

// A connection a peer opened to this segment.
class Inbound final : public EventLoop::Handler {
 public:
  Inbound(TransferEngine::Impl& core, LoopContext& loop, int fd, std::string from);
  ~Inbound() override;
  void on_events(uint32_t events) override;
  // Loop tick: refuses a connection that has not said HELLO in time.
  bool check_handshake(Clock::time_point now);

 private:
  Status on_header(const wire::FrameHeader& h, PayloadSink& sink);
  Status on_frame(const wire::FrameHeader& h, std::string& kept);
  void refuse(const Status& reason);
  void close();
  // Sends what is queued; then closes (`then_close`, or on a send error) or
  // watches for room to send the rest.
  void send_queued(bool then_close);

 public:
  // Sends CHALLENGE; called once the loop watches the connection.
  void start();

 private:
  TransferEngine::Impl& core_;
  LoopContext& loop_;
  int fd_;
  const std::string from_;  // the peer's address, for logs
  std::string peer_name_;   // its segment name, once it said HELLO
  bool authenticated_ = false;
  std::string nonce_;  // this connection's challenge
  const Clock::time_point accepted_ = Clock::now();
  uint64_t last_applied_ = 0;
  bool ack_due_ = false;
  FrameReader reader_;
  FrameWriter writer_;
};

struct TransferEngine::Impl {
  struct Request {
    TransferState state = TransferState::kWaiting;
    uint64_t slices_left = 0;
    uint64_t transferred = 0;
    Status error;
  };
  // A batch keeps counts, so that its status costs O(1) however many
  // requests it holds; every state change goes through advance().
  struct Batch {
    size_t capacity = 0;
    std::vector<Request> requests;
    size_t started = 0;    // requests no longer waiting
    size_t completed = 0;  // requests completed
    uint64_t transferred = 0;
    std::optional<size_t> first_failure;  // the first request that failed or timed out
    // Moves request `index` on (never back, never out of an end state).
    // Returns whether it moved.
    bool advance(size_t index, TransferState to, Status error = {});
    // Whether get_batch_status has news: every request completed, or one
    // failed (its peers are told to drop the rest when it is polled) and
    // maybe no slice is out any more.
    bool announcing() const { return first_failure || completed == requests.size(); }
    Clock::time_point deadline = Clock::time_point::max();
    // The notification, held until every other request has completed.
    SlicePtr notification;
    Peer* notify_peer = nullptr;
    // Slices handed to peers and not yet completed or failed: a failed
    // batch is reported once none is left (kFailed means over).
    uint64_t slices_out = 0;
    std::set<Peer*> peers;   // that got its slices
    bool cancelled = false;  // its peers were told to drop its slices
  };

  EngineConfig config;
  std::string secret;
  std::string host_identity;
  std::vector<std::string> rail_addresses;  // what this segment listens on
  std::vector<SocketAddress> bind_addresses;
  std::vector<std::unique_ptr<LoopContext>> loops;
  std::vector<std::unique_ptr<Listener>> listeners;
  std::atomic<size_t> next_loop{0};

  mutable std::shared_mutex buffers_mu;
  std::vector<SegmentDescriptor::Buffer> buffers;  // registered local memory, in order
  BufferIndex buffer_index;                        // of `buffers`, for local_contains()
  SharedPools shared_pools;                        // allocate_shared()

  // Loop threads count; any thread reads (same_host_bytes()).
  std::atomic<uint64_t> same_host_mapped_bytes{0}, same_host_kernel_bytes{0};

  mutable std::mutex mu;
  std::map<BatchId, Batch> batches;
  std::map<SegmentHandle, std::unique_ptr<Peer>> peers;
  std::map<SegmentHandle, Status> failed_segments;
  std::vector<std::string> notifications;  // received, not yet taken
  // Completed slices kept for the next submission: a 2 -> 4 request is
  // 65,536 slices, made on the caller's thread and ended on a loop thread,
  // and malloc's cross-thread frees cost more than the copies they carry.
  Slices spare_slices;
  static constexpr size_t kMaxSpareSlices = 1 << 16;
  // A spare slice, or a new one; mu held. A spare one still holds its last
  // use: the caller assigns the whole of it.
  SlicePtr new_slice();
  // Batches' request lists, kept from batch to batch (spare_vectors.h).
  SpareVectors<Request> spare_requests;
  // submit_transfer's halves, mu held: why the submission is refused whole,
  // if it is; then the slices for each segment (one that check_requests
  // found open).
  Status check_requests(std::span<const TransferRequest> requests) const;
  std::map<Peer*, Slices> slice_requests(BatchId batch_id, Batch& batch,
                                         std::span<const TransferRequest> requests);
  FailureCallback on_failure;
  // Marked under mu as batches end or fail; announced by the loop thread
  // that did it once mu is released (complete, fail, fail_request).
  TransportSignal batch_ends;
  TransportSignal notes_arrived;  // deliver_notification marks and announces
  BatchId next_batch = 1;
  SegmentHandle next_segment = 1;

  // Orders this process's accesses to registered memory against peers'
  // writes and reads over the rails: an inbound connection acquires it before
  // it applies a WRITE or serves a READ, and bumps it (release) after a WRITE
  // is in memory; acquire_inbound_writes() acquires, release_to_peers()
  // bumps.
  std::atomic<uint64_t> memory_order{0};

  ~Impl();
  std::string segment_name() const { return rail_addresses.front(); }
  LoopContext& pick_loop() { return *loops[next_loop++ % loops.size()]; }
  bool local_contains(uint64_t addr, uint64_t length) const;

  // Loop threads report here.
  void mark_pending(const Slices& slices);
  void complete(Slices& slices);
  // Releases a batch's held notification when its other requests are done
  // (mu held); the caller dispatches what it returns.
  void release_notification(Batch& batch, std::vector<std::pair<Peer*, SlicePtr>>& out);
  void fail(const Slice& slice, TransferState state, const Status& reason);
  // Fails the slice's request, the slice still out (a drain awaits it).
  void fail_request(const Slice& slice, const Status& reason);
  // Whether a slice is still wanted: its batch is live and has not failed
  // (a slice of a failed batch is dropped, never retried).
  bool wanted(const Slice& slice);
  void segment_failed(SegmentHandle segment, const Status& reason);
  // From a loop thread, which holds none of our locks.
  void deliver_notification(std::string message) {
    {
      std::lock_guard lock(mu);
      notifications.push_back(std::move(message));
      notes_arrived.mark();
    }
    notes_arrived.announce();
  }
};

}  // namespace pdkv::backends::mooncake

// The state behind IoEngine (io_engine.h) and who owns each piece of it,
// with the posted operation (Op). Its code is in three files, by what it
// does:
//  - io_engine.cc: the API (creation, registration, peers, submissions,
//    status), on the callers' threads or handed to the progress thread;
//  - io_engine_progress.cc: the progress thread's passes (posting,
//    completions, deadlines, drains of failed transfers);
//  - io_engine_peer_loss.cc: peers that fail or whose process exits, and
//    giving up a progress thread stuck for good.
// Private to the mori backend.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "drain_deadline.h"
#include "fabric_endpoint.h"
#include "io_engine.h"
#include "peer_doorbell.h"
#include "peer_process.h"
#include "progress_thread.h"
#include "shared_pool.h"
#include "transport_signal.h"

namespace pdkv::backends::mori {

// One posted (or to be posted) operation. The provider's context comes first
// (FI_CONTEXT2 mode lets it use that space).
struct Op {
  fi_context2 provider_context;
  TransferId transfer = 0;
  size_t endpoint = 0;  // once posted: where, and to whom
  fi_addr_t addr = FI_ADDR_UNSPEC;
  bool cancelled = false;
  bool read = false;
  // The write that carries the transfer id as remote CQ data: the last
  // body, or a write of no bytes after them all (signal_after).
  bool signal = false;
  // A message (fi_sendmsg of `payload`), of no transfer: sent once the
  // transfers it follows succeeded (PendingMessage), never reported.
  bool message = false;
  std::string payload;
  // The peer's endpoint places this write before any posted after it: the
  // transfer's signal need not wait for its completion.
  bool ordered = false;
  // Where the progress thread copies this body (or read) instead, in a
  // same-host peer's mapped pool: set as it is taken into a burst, under
  // mu (take_queued); the copy is done in post_burst, and the operation
  // with it.
  char* mapped = nullptr;
  char* local = nullptr;
  void* local_desc = nullptr;
  uint64_t length = 0;
  uint64_t remote_addr = 0;
  uint64_t key = 0;
};

// Each message between engines begins with the inbox key of its target
// (EngineDesc::inbox_key) and one byte of its kind.
enum class MessageKind : uint8_t {
  kNotice = 1,  // a message of send_after's caller
  kLanded = 2,  // ids (u64 each) of the sender's transfers that landed here
};
constexpr size_t kMessageHeader = sizeof(uint64_t) + 1;
constexpr size_t kMaxLandedIds = (InboxSlot::kBytes - kMessageHeader) / sizeof(TransferId);
std::string message_header(uint64_t inbox_key, MessageKind kind);

struct IoEngine::Impl {
  using Clock = std::chrono::steady_clock;

  struct Registered {
    MemoryDesc desc;
    std::vector<fid_mr*> mrs;  // per endpoint
  };
  struct Peer {
    EngineDesc desc;
    size_t endpoint = 0;
    fi_addr_t addr = FI_ADDR_UNSPEC;
    std::deque<std::unique_ptr<Op>> queue;       // to post, in order: its own, so that a
                                                 // peer the provider stalls stalls no other
    std::shared_ptr<const PeerProcess> process;  // shm peers' process, watched
    // Its pools mapped here (shared_pool.h), fixed at registration; a burst
    // holds them while it copies, in case the peer goes meanwhile.
    std::shared_ptr<const PeerMappings> mapped;
    // Rung after each burst posted to it; null where it was not taken.
    std::shared_ptr<const PeerDoorbell> doorbell;
  };
  // A failed peer's address, removed from its AV once no operation of its
  // transfers is with the provider.
  struct Retired {
    size_t endpoint = 0;
    fi_addr_t addr = FI_ADDR_UNSPEC;
    // Its pools, unmapped as the entry is dropped (remove_retired), with no
    // lock held: unmapping gigabytes takes a while.
    std::shared_ptr<const PeerMappings> mapped;
  };
  struct Transfer {
    TransferId id = 0;
    std::string peer;
    size_t endpoint = 0;
    fi_addr_t addr = FI_ADDR_UNSPEC;
    uint64_t outstanding = 0;    // posted or queued, not completed
    uint64_t with_provider = 0;  // posted, not yet returned by the provider
    // Taken into a burst to be copied, not yet settled. A copy may be
    // landing now and always ends: while one is due, no drain limit makes
    // the transfer over.
    uint64_t copying = 0;
    std::unique_ptr<Op> held_signal;  // posted once the others completed
    // A write whose every body is copied into the peer's mapped pools: it
    // has no signal, it succeeds once the copies are done, and the target
    // hears that it landed from a landed message (queue_landed).
    bool lands_by_message = false;
    TransferStatus status;
    Clock::time_point deadline;
    DrainDeadline drain;      // failed: how long to wait for what the provider holds
    bool cancel_due = false;  // failed with operations posted: cancel them
    // Failed and nothing of it left with the provider (or out of time);
    // `returned`: when its endpoint's provider last returned an operation.
    bool over(Clock::time_point now, Clock::time_point returned) {
      if (status.state != TransferState::kFailed || with_provider == 0) return true;
      if (copying > 0) return false;
      drain.progressed(returned);
      return drain.passed(now);
    }
  };

  // A peer's operations taken off its queue to post in one pass.
  struct Burst {
    std::string peer;
    size_t endpoint = 0;
    std::shared_ptr<const PeerProcess> process;
    std::shared_ptr<const PeerMappings> mapped;
    std::shared_ptr<const PeerDoorbell> doorbell;
    std::vector<std::unique_ptr<Op>> ops;
    size_t posted = 0;   // ops[0, posted) went to the provider (or were copied)
    bool rings = false;  // the provider took one of them: the peer's doorbell rings
    int refused_rc = 0;  // else: it refused ops[posted] with this, and the burst stopped
  };
  struct Finished {
    std::unique_ptr<Op> op;
    Status error;
    int err = 0;
  };
  // What peers told this engine in one read of a completion queue.
  struct Arrivals {
    std::vector<TransferId> landed;     // their transfers in place here
    std::vector<std::string> messages;  // their messages (send_after)
  };
  // A message to `peer` that waits for the transfers it follows: queued
  // once they all succeeded, dropped as soon as one fails.
  struct PendingMessage {
    std::string peer;
    std::set<TransferId> waiting;
    std::string payload;
  };

  IoEngineConfig config;
  EngineDesc desc;
  std::string host_identity;
  uint32_t next_transfer = 1;
  int wake_fd = -1;  // eventfd: tasks and submissions wake the idle thread

  // Stopped by ~IoEngine (and ~Impl), before anything its tasks touch goes;
  // given up when stuck (give_up_if_stuck), and then ~Impl never runs.
  ProgressThread thread{"mori progress thread"};
  PeerFailures<std::string> failures{thread};
  // Marked (mu held) as transfers end or fail, announced by the progress
  // thread after each pass, holding no lock.
  TransportSignal batch_ends;
  // Marked (mu held) as peers' messages arrive, announced likewise.
  TransportSignal messages_in;

  // Fixed once the engine runs; their provider objects are used on the
  // progress thread only (FI_THREAD_DOMAIN), with round_mu or no lock held.
  std::vector<std::unique_ptr<Endpoint>> endpoints;
  // The progress thread's own:
  std::map<Op*, std::unique_ptr<Op>> posted;            // handed to the provider
  std::vector<std::pair<size_t, InboxSlot*>> unposted;  // (endpoint, receive) to post again
  Clock::time_point next_deadline_check = Clock::now();
  // Whether the thread last woke because its sleep ran out, no file
  // descriptor having said anything; and until when it polls without
  // sleeping, since peers' traffic came so (a peer that does not ring our
  // doorbell: see idle_wait).
  bool woke_unannounced = false;
  Clock::time_point spin_until{};

  // Held by the progress thread for each round of provider calls, in which
  // providers copy peers' bytes into our memory; see acquire_inbound_writes.
  // Timed: a round stuck for good holds it for good (wait_round).
  std::timed_mutex round_mu;

  // The progress thread's post to a watched peer, and whether the engine
  // gave the thread up, stuck in one (give_up_if_stuck).
  PostWatch post_watch;
  std::atomic<bool> lost{false};
  std::thread late_reports;  // delivers the failures reported as it gave up

  // allocate()'s pools: their own lock, since filling gigabytes of pages
  // takes a while and the progress thread has no use for them.
  std::mutex pools_mu;
  SharedPools shared_pools;

  // mu guards what other threads share with the progress thread, and is
  // held only while that state is read or changed, never across a call
  // into the provider.
  std::mutex mu;
  std::vector<Registered> registered;
  std::map<std::string, Peer> peers;
  std::map<TransferId, Transfer> transfers;
  std::map<uint32_t, std::string> nonces;  // peer nonce -> engine key
  std::set<TransferId> inbound;            // landed, not yet popped (config.keep_inbound)
  std::vector<PendingMessage> pending_messages;
  std::vector<std::string> messages;  // peers' messages, not yet taken
  uint64_t dropped_messages = 0;      // without our inbox key
  // Whether this process may take files from a peer's (engine key, start
  // time): IoEngine::copies_from's probe, remembered.
  std::map<std::pair<std::string, uint64_t>, bool> may_take_from;
  // The progress thread's copies into peers' mapped pools (post_burst).
  std::atomic<uint64_t> copied_bytes{0};
  std::atomic<uint64_t> rung_doorbells{0};
  // Per endpoint: when its provider last returned one of our operations.
  // Draining transfers count it as progress: a provider busy with other
  // transfers' operations ahead of theirs is not stuck.
  std::vector<Clock::time_point> returned_at;
  std::vector<Retired> retired;

  ~Impl() {
    thread.stop();
    if (wake_fd >= 0) ::close(wake_fd);
    // Memory regions before their domains (the endpoints close the rest).
    for (auto& r : registered) {
      for (fid_mr* mr : r.mrs) {
        if (mr) fi_close(&mr->fid);
      }
    }
    endpoints.clear();  // closing the endpoints drops what was still posted
  }

  // Every endpoint carries messages (FI_MSG, its inbox posted).
  bool takes_messages() const {
    return std::all_of(endpoints.begin(), endpoints.end(),
                       [](const auto& e) { return e->messages; });
  }
  void start_thread();
  // Any thread, no lock held: true once the progress thread is given up.
  bool give_up_if_stuck();
  void wait_round();
  bool progress();  // one pass, on the progress thread
  bool busy();
  void idle_wait(std::chrono::microseconds limit);
  void notify() {
    const uint64_t one = 1;
    if (wake_fd >= 0) (void)!::write(wake_fd, &one, sizeof one);
  }
  // Progress thread: takes wake_fd's count (notify()s and peers' rings since
  // the last take); true when there was any.
  bool take_wakes() {
    uint64_t count;
    return ::read(wake_fd, &count, sizeof count) == static_cast<ssize_t>(sizeof count);
  }
  // Progress thread, round_mu held; each takes mu only around shared state:
  bool post_queued();
  std::vector<Burst> take_queued();
  void post_burst(Burst& burst);
  static ssize_t post(Endpoint& endpoint, Op& op, uint64_t flags);
  static char* copy_target(const PeerMappings* mapped, const Op& op);
  void settle_burst(Burst& burst);
  // True when anything completed or landed; `arrived` set when peers'
  // messages or transfers did.
  bool read_completions(size_t endpoint, bool& arrived);
  // A receive completed (or failed): what it says kept, the slot posted again.
  void take_receive(size_t endpoint, InboxSlot* slot, size_t length, Arrivals& got);
  void post_receives_again();
  void cancel_failed();
  bool inbound_traffic();
  void remove_retired();
  // mu held, progress thread:
  void finish_op(std::unique_ptr<Op> op, const Status& error, int err);
  void settle_copy(const Op& op);
  // Transfer `id` ended: the messages that waited for it go, or are dropped.
  void release_messages(TransferId id, bool succeeded);
  void queue_message(const std::string& peer, std::string payload);
  // Transfer `id`, copied into `peer`'s pools, succeeded: its id joins the
  // landed message queued last to the peer, or starts one.
  void queue_landed(const std::string& peer, TransferId id);
  // The peer reached at (`endpoint`, `addr`), if any, failed (mu held).
  void fail_peer_at(size_t endpoint, fi_addr_t addr, const Status& reason);
  void check_deadlines(Clock::time_point now);
  Result<std::pair<size_t, size_t>> endpoint_for(const EngineDesc& remote) const;
  // Any thread, no lock held: those of `memory` that name a memfd, mapped
  // through the peer's pidfd; nullptr when none is.
  std::shared_ptr<const PeerMappings> map_pools(const std::string& key, const PeerProcess& process,
                                                std::span<const MemoryDesc> memory) const;
  std::vector<std::string> provider_names() const;
  // mu held, any thread:
  void fail_exited_peers(bool queued_only);
  void fail_transfer(Transfer& t, const Status& reason);
  void fail_peer_locked(const std::string& key, const Status& reason);
  static std::unique_ptr<Op> signal_after(const Op& last);
  static void add_signal(Transfer& t, std::vector<std::unique_ptr<Op>>& ops, bool signal_apart,
                         bool ordered);
  static Status check_pieces(TransferId id, std::span<const Piece> pieces);
  // mu held: `local` names memory registered here (create_session, add_ops).
  Status check_ours(const MemoryDesc& local) const;
  // mu held: the piece's buffers are ours and the peer's, and its operations.
  Status add_ops(const Piece& piece, const Peer& peer, bool read, TransferId id,
                 std::vector<std::unique_ptr<Op>>& ops);
  Status submit(bool read, std::span<const Piece> pieces, TransferId id);
};

}  // namespace pdkv::backends::mori

#include "io_engine.h"

#include <fmt/format.h>
#include <poll.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "crypto.h"
#include "drain_deadline.h"
#include "fabric_endpoint.h"
#include "host_identity.h"
#include "log.h"
#include "peer_process.h"
#include "progress_thread.h"

namespace pdkv::backends::mori {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kKeyTries = 4;

// A memory key of the provider's key size drawn from the kernel's random
// bytes (never 0): a peer that did not get our descriptor cannot guess it.
Result<uint64_t> random_key(const Endpoint& e) {
  PDKV_ASSIGN_OR_RETURN(const std::string bytes, crypto::random_bytes(sizeof(uint64_t)));
  uint64_t key = 0;
  std::memcpy(&key, bytes.data(), sizeof key);
  if (e.key_bytes < sizeof key) key &= (uint64_t{1} << (8 * e.key_bytes)) - 1;
  return key == 0 ? 1 : key;
}

// Idle, the progress thread still reads the completion queues this often:
// manual-progress providers move inbound data only when polled.
constexpr auto kIdleTick = std::chrono::milliseconds(1);
// After peers' traffic was last seen, the thread keeps polling without
// sleeping this long: on shm every small write waits for the target's poll.
constexpr auto kHotWindow = std::chrono::milliseconds(5);
// At most this many operations of one peer are taken off its queue per
// pass: what the provider refuses (-FI_EAGAIN) goes back, and a burst
// bounds that work.
constexpr size_t kPostBurst = 256;
// A failed transfer's operations still with the provider are cancelled; it
// is over when the provider has returned them all, or once it returned none
// for kDrainQuiet, or kDrainCap after the failure (drain_deadline.h).
constexpr auto kDrainQuiet = std::chrono::milliseconds(1000);
constexpr auto kDrainCap = std::chrono::milliseconds(10000);
// A post that waits this long on a peer whose process is gone is stuck for
// good (peer_process.h): the engine gives its progress thread up.
constexpr auto kStuckLimit = std::chrono::milliseconds(1000);

// Errors that mean the peer is gone (or cannot be reached), not a bad request.
bool peer_is_gone(int err) {
  switch (err) {
    case ECONNREFUSED:
    case ECONNRESET:
    case ECONNABORTED:
    case EPIPE:
    case ENOTCONN:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ESRCH:
      return true;
    default:
      return false;
  }
}

// One posted (or to be posted) operation. The provider's context comes first
// (FI_CONTEXT2 mode lets it use that space).
struct Op {
  fi_context2 provider_context;
  TransferId transfer = 0;
  size_t endpoint = 0;  // once posted: where, and to whom
  fi_addr_t addr = FI_ADDR_UNSPEC;
  bool cancelled = false;
  bool read = false;
  bool signal = false;  // the write that carries the transfer id as remote CQ data
  // The peer's endpoint places this write before any posted after it: the
  // transfer's signal need not wait for its completion.
  bool ordered = false;
  char* local = nullptr;
  void* local_desc = nullptr;
  uint64_t length = 0;
  uint64_t remote_addr = 0;
  uint64_t key = 0;
};

}  // namespace

struct IoEngine::Impl {
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
  };
  // A failed peer's address, removed from its AV once no operation of its
  // transfers is with the provider.
  struct Retired {
    size_t endpoint = 0;
    fi_addr_t addr = FI_ADDR_UNSPEC;
  };
  struct Transfer {
    std::string peer;
    size_t endpoint = 0;
    fi_addr_t addr = FI_ADDR_UNSPEC;
    uint64_t outstanding = 0;         // posted or queued, not completed
    uint64_t with_provider = 0;       // posted, not yet returned by the provider
    std::unique_ptr<Op> held_signal;  // posted once the others completed
    TransferStatus status;
    Clock::time_point deadline;
    DrainDeadline drain;      // failed: how long to wait for what the provider holds
    bool cancel_due = false;  // failed with operations posted: cancel them
    // Failed and nothing of it left with the provider (or out of time).
    bool over(Clock::time_point now) const {
      return status.state != TransferState::kFailed || with_provider == 0 || drain.passed(now);
    }
  };

  // A peer's operations taken off its queue to post in one pass.
  struct Burst {
    std::string peer;
    size_t endpoint = 0;
    std::shared_ptr<const PeerProcess> process;
    std::vector<std::unique_ptr<Op>> ops;
    size_t posted = 0;   // ops[0, posted) went to the provider
    int refused_rc = 0;  // else: it refused ops[posted] with this, and the burst stopped
  };
  struct Finished {
    std::unique_ptr<Op> op;
    Status error;
    int err = 0;
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

  // Fixed once the engine runs; their provider objects are used on the
  // progress thread only (FI_THREAD_DOMAIN), with round_mu or no lock held.
  std::vector<std::unique_ptr<Endpoint>> endpoints;
  // The progress thread's own:
  std::map<Op*, std::unique_ptr<Op>> posted;  // handed to the provider
  Clock::time_point next_deadline_check = Clock::now();

  // Held by the progress thread for each round of provider calls, in which
  // providers copy peers' bytes into our memory; see acquire_inbound_writes.
  // Timed: a round stuck for good holds it for good (wait_round).
  std::timed_mutex round_mu;

  // The progress thread's post to a watched peer, and whether the engine
  // gave the thread up, stuck in one (give_up_if_stuck).
  PostWatch post_watch;
  std::atomic<bool> lost{false};
  std::thread late_reports;  // delivers the failures reported as it gave up

  // mu guards what other threads share with the progress thread, and is
  // held only while that state is read or changed, never across a call
  // into the provider.
  std::mutex mu;
  std::vector<Registered> registered;
  std::map<std::string, Peer> peers;
  std::map<TransferId, Transfer> transfers;
  std::map<uint32_t, std::string> nonces;  // peer nonce -> engine key
  std::set<TransferId> inbound;            // landed, not yet popped
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
  // Progress thread, round_mu held; each takes mu only around shared state:
  bool post_queued();
  std::vector<Burst> take_queued();
  void post_burst(Burst& burst);
  void settle_burst(Burst& burst);
  bool read_completions(Endpoint& e);
  void cancel_failed();
  bool inbound_traffic();
  void remove_retired();
  // mu held, progress thread:
  void finish_op(std::unique_ptr<Op> op, const Status& error, int err);
  void check_deadlines(Clock::time_point now);
  Result<std::pair<size_t, size_t>> endpoint_for(const EngineDesc& remote) const;
  std::vector<std::string> provider_names() const;
  // mu held, any thread:
  void fail_exited_peers(bool queued_only);
  void fail_transfer(Transfer& t, const Status& reason);
  void fail_peer_locked(const std::string& key, const Status& reason);
  Status submit(bool read, std::span<const uint64_t> local_offsets,
                std::span<const uint64_t> remote_offsets, std::span<const uint64_t> sizes,
                TransferId id, const MemoryDesc& local, const MemoryDesc& remote);
};

void IoEngine::Impl::start_thread() {
  ProgressThread::Driver driver;
  driver.progress = [this] { return progress(); };
  driver.busy = [this] { return busy(); };
  driver.sleep = [this](std::chrono::microseconds limit) { idle_wait(limit); };
  driver.wake = [this] { notify(); };
  driver.idle_tick = kIdleTick;
  driver.hot_tick = std::chrono::microseconds(0);  // no sleep at all while traffic is hot
  driver.hot_window = kHotWindow;
  driver.stuck = [this] { return give_up_if_stuck(); };
  thread.start(std::move(driver));
}

bool IoEngine::Impl::progress() {
  std::lock_guard round(round_mu);
  cancel_failed();
  bool active = post_queued();
  for (auto& e : endpoints) active |= read_completions(*e);
  active |= inbound_traffic();  // peers' traffic: keep polling for a while (kHotWindow)
  const auto now = Clock::now();
  if (now >= next_deadline_check) {
    next_deadline_check = now + std::chrono::milliseconds(10);
    std::lock_guard lock(mu);
    check_deadlines(now);
    fail_exited_peers(/*queued_only=*/false);
  }
  remove_retired();
  return active;
}

bool IoEngine::Impl::busy() {
  if (!posted.empty()) return true;
  std::lock_guard lock(mu);
  for (const auto& [key, peer] : peers) {
    if (!peer.queue.empty()) return true;
  }
  return false;
}

// Sleeps until a CQ's file descriptor or wake_fd says there is work, or
// `limit` passes (kIdleTick when a provider has no descriptor).
void IoEngine::Impl::idle_wait(std::chrono::microseconds limit) {
  if (limit <= std::chrono::microseconds::zero()) {
    std::this_thread::yield();  // hot: poll again at once
    return;
  }
  std::vector<pollfd> fds = {{wake_fd, POLLIN, 0}};
  bool all_waitable = wake_fd >= 0;
  {
    std::lock_guard round(round_mu);  // fi_trywait may progress the provider
    for (auto& e : endpoints) {
      if (e->wait_fd < 0) {
        all_waitable = false;
        continue;
      }
      fid* cq = &e->cq->fid;
      // Only when nothing is pending in the provider may we block on its fd.
      if (fi_trywait(e->fabric, &cq, 1) != FI_SUCCESS) return;
      fds.push_back({e->wait_fd, POLLIN, 0});
    }
  }
  const auto wait = all_waitable ? std::chrono::milliseconds(100)
                                 : std::chrono::duration_cast<std::chrono::milliseconds>(limit);
  ::poll(fds.data(), fds.size(), std::max<int>(static_cast<int>(wait.count()), 1));
  uint64_t count;
  if (fds[0].revents & POLLIN) (void)!::read(wake_fd, &count, sizeof count);
}

// One pass over the peers' queues: up to kPostBurst operations of each are
// taken under mu, posted without it, and settled under it again. True when
// any went to the provider.
bool IoEngine::Impl::post_queued() {
  std::vector<Burst> bursts = take_queued();
  if (bursts.empty()) return false;
  bool any = false;
  for (auto& b : bursts) {
    if (b.process) post_watch.begin(b.process);
    post_burst(b);
    if (b.process) post_watch.end();
    any |= b.posted > 0;
  }
  std::lock_guard lock(mu);
  for (auto& b : bursts) settle_burst(b);
  return any;
}

// An operation taken counts as with the provider from here on: its
// transfer, failed meanwhile, is not reported over while it is in our hands.
std::vector<IoEngine::Impl::Burst> IoEngine::Impl::take_queued() {
  std::vector<Burst> bursts;
  std::lock_guard lock(mu);
  fail_exited_peers(/*queued_only=*/true);  // no write starts to a peer that is gone
  for (auto& [key, peer] : peers) {
    if (peer.queue.empty()) continue;
    Burst b{key, peer.endpoint, peer.process, {}, 0, 0};
    while (!peer.queue.empty() && b.ops.size() < kPostBurst) {
      std::unique_ptr<Op> op = std::move(peer.queue.front());
      peer.queue.pop_front();
      auto t = transfers.find(op->transfer);
      if (t == transfers.end() || t->second.status.state != TransferState::kInProgress) {
        continue;  // its transfer ended (failed) meanwhile: dropped, never posted
      }
      ++t->second.with_provider;
      op->endpoint = peer.endpoint;
      op->addr = peer.addr;
      b.ops.push_back(std::move(op));
    }
    if (!b.ops.empty()) bursts.push_back(std::move(b));
  }
  return bursts;
}

// Posts in order until the provider says -FI_EAGAIN (the rest wait for the
// next pass) or refuses one: nothing behind a refused write may go, for a
// signal there would say it landed. Each but the last of a burst says
// FI_MORE: another follows at once, and what a provider defers for it is
// flushed by a later post.
void IoEngine::Impl::post_burst(Burst& b) {
  Endpoint& e = *endpoints[b.endpoint];
  for (; b.posted < b.ops.size(); ++b.posted) {
    Op& op = *b.ops[b.posted];
    iovec iov{op.local, op.length};
    fi_rma_iov rma{op.remote_addr, op.length, op.key};
    fi_msg_rma msg{};
    msg.msg_iov = &iov;
    msg.desc = &op.local_desc;
    msg.iov_count = 1;
    msg.addr = op.addr;
    msg.rma_iov = &rma;
    msg.rma_iov_count = 1;
    msg.context = &op;
    uint64_t flags = FI_COMPLETION | (b.posted + 1 < b.ops.size() ? FI_MORE : 0);
    ssize_t rc;
    if (op.read) {
      rc = fi_readmsg(e.ep, &msg, flags);
    } else {
      // Not FI_INJECT_COMPLETE, even where the signal makes it safe: a
      // write must stay ours until the peer has it, so that a failed
      // transfer is reported once nothing of it can land any more.
      if (op.signal) {
        flags |= FI_DELIVERY_COMPLETE | FI_REMOTE_CQ_DATA;
        msg.data = op.transfer;
      } else {
        flags |= FI_TRANSMIT_COMPLETE;
      }
      rc = fi_writemsg(e.ep, &msg, flags);
    }
    if (rc == -FI_EAGAIN) return;  // the provider needs progress first
    if (rc != 0) {
      b.refused_rc = static_cast<int>(rc);
      return;
    }
  }
}

// mu held. Posted operations are the provider's now; refused ones fail
// their transfer; the rest go back to the front of their peer's queue.
void IoEngine::Impl::settle_burst(Burst& b) {
  for (size_t i = 0; i < b.posted; ++i) {
    Op* raw = b.ops[i].get();
    posted.emplace(raw, std::move(b.ops[i]));
  }
  if (b.refused_rc != 0) {
    const Op& op = *b.ops[b.posted];
    Transfer& t = transfers.find(op.transfer)->second;
    --t.with_provider;
    fail_transfer(t, ofi_error(op.read ? "fi_readmsg" : "fi_writemsg", b.refused_rc));
  }
  auto p = peers.find(b.peer);
  const size_t settled = b.posted + (b.refused_rc != 0 ? 1 : 0);
  for (size_t i = b.ops.size(); i-- > settled;) {
    auto t = transfers.find(b.ops[i]->transfer);
    --t->second.with_provider;
    const bool live = t->second.status.state == TransferState::kInProgress;
    if (p != peers.end() && live) p->second.queue.push_front(std::move(b.ops[i]));
  }
}

// Reads the CQ without mu; what it finished is settled under mu. True when
// anything completed or landed.
bool IoEngine::Impl::read_completions(Endpoint& e) {
  std::vector<Finished> finished;
  std::vector<TransferId> landed;
  fi_cq_data_entry entries[64];
  while (true) {
    const ssize_t n = fi_cq_read(e.cq, entries, 64);
    if (n == -FI_EAGAIN) break;
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(e.cq, &err, 0) != 1) break;
      char detail[256] = {};
      fi_cq_strerror(e.cq, err.prov_errno, err.err_data, detail, sizeof detail);
      auto it = posted.find(static_cast<Op*>(err.op_context));
      if (it == posted.end()) {
        logger("mori")->warn("{}: completion error for no operation of ours: {} ({})", e.provider,
                             fi_strerror(err.err), detail);
        continue;
      }
      Finished f{std::move(it->second), Status::ok(), err.err};
      posted.erase(it);
      f.error = Status::unavailable(fmt::format("{} {}: {} ({})", e.provider,
                                                f.op->read ? "read" : "write", fi_strerror(err.err),
                                                detail));
      finished.push_back(std::move(f));
      continue;
    }
    if (n < 0) {
      logger("mori")->warn("{}: fi_cq_read: {}", e.provider, fi_strerror(int(-n)));
      break;
    }
    for (ssize_t i = 0; i < n; ++i) {
      const fi_cq_data_entry& c = entries[i];
      if (c.flags & FI_REMOTE_CQ_DATA) {  // a peer's transfer has landed here
        landed.push_back(c.data);
        continue;
      }
      auto it = posted.find(static_cast<Op*>(c.op_context));
      if (it == posted.end()) continue;
      finished.push_back({std::move(it->second), Status::ok(), 0});
      posted.erase(it);
    }
  }
  if (finished.empty() && landed.empty()) return false;
  std::lock_guard lock(mu);
  inbound.insert(landed.begin(), landed.end());
  for (auto& f : finished) finish_op(std::move(f.op), f.error, f.err);
  return true;
}

bool IoEngine::Impl::inbound_traffic() {
  bool seen_new = false;
  for (auto& e : endpoints) {
    if (e->inbound == nullptr) continue;
    const uint64_t seen = fi_cntr_read(e->inbound);
    seen_new |= seen != e->inbound_seen;
    e->inbound_seen = seen;
  }
  return seen_new;
}

void IoEngine::Impl::finish_op(std::unique_ptr<Op> op, const Status& error, int err) {
  auto it = transfers.find(op->transfer);
  if (it == transfers.end()) return;
  Transfer& t = it->second;
  --t.with_provider;
  if (t.status.state != TransferState::kInProgress) {  // failed earlier; now accounted for
    t.drain.progressed(Clock::now());
    return;
  }
  if (!error.is_ok()) {
    fail_transfer(t, error);
    if (peer_is_gone(err)) fail_peer_locked(t.peer, error);
    return;
  }
  if (--t.outstanding > 0) return;
  if (t.held_signal) {  // every other write is in place: now the one that says so
    t.outstanding = 1;
    auto p = peers.find(t.peer);
    if (p == peers.end()) return fail_transfer(t, Status::aborted("its peer was forgotten"));
    p->second.queue.push_back(std::move(t.held_signal));
    return;
  }
  t.status.state = TransferState::kSuccess;
}

void IoEngine::Impl::fail_transfer(Transfer& t, const Status& reason) {
  if (t.status.state != TransferState::kInProgress) return;
  t.status = {TransferState::kFailed, reason};
  t.held_signal.reset();
  t.drain = DrainDeadline(Clock::now(), kDrainQuiet, kDrainCap);
  t.cancel_due = t.with_provider > 0;
}

// The operations of failed transfers that are still with the provider:
// asked back (fi_cancel), so that the transfer is over sooner. What the
// provider cannot cancel it returns when done, within the drain or not.
void IoEngine::Impl::cancel_failed() {
  std::set<TransferId> due;
  {
    std::lock_guard lock(mu);
    for (auto& [id, t] : transfers) {
      if (t.cancel_due) due.insert(id);
      t.cancel_due = false;
    }
  }
  if (due.empty()) return;
  for (auto& [raw, op] : posted) {
    if (op->cancelled || due.count(op->transfer) == 0) continue;
    op->cancelled = true;
    (void)fi_cancel(&endpoints[op->endpoint]->ep->fid, &op->provider_context);
  }
}

void IoEngine::Impl::check_deadlines(Clock::time_point now) {
  for (auto& [id, t] : transfers) {
    if (t.status.state == TransferState::kInProgress && now >= t.deadline) {
      fail_transfer(
          t, Status::deadline_exceeded(fmt::format("transfer {:#x} to {} not done within {} ms", id,
                                                   t.peer, config.transfer_timeout.count())));
    }
  }
}

// Same-host peers whose process has exited fail at once, named by it: all
// of them, or only those with writes to post (a poll each, every pass).
void IoEngine::Impl::fail_exited_peers(bool queued_only) {
  std::vector<std::pair<std::string, pid_t>> gone;
  for (const auto& [key, peer] : peers) {
    if (queued_only && peer.queue.empty()) continue;
    if (peer.process && peer.process->exited()) gone.emplace_back(key, peer.process->pid());
  }
  for (const auto& [key, pid] : gone) {
    fail_peer_locked(key, Status::unavailable(fmt::format(
                              "mori engine '{}': its process {} has exited", key, pid)));
  }
}

// A peer killed while it held the lock of its shared memory leaves a post
// to it waiting forever (peer_process.h). Then every transfer fails and
// every peer is reported failed (their callbacks on late_reports: the
// progress thread never runs them now), and the thread is given up: its
// engine is kept, leaked, by ~IoEngine, for the stuck call still reads it.
// No peer comes after: registering one needs the progress thread.
bool IoEngine::Impl::give_up_if_stuck() {
  if (lost.load()) return true;
  const std::optional<pid_t> pid = post_watch.stuck(kStuckLimit);
  if (!pid) return false;
  const Status reason = Status::unavailable(
      fmt::format("mori: the progress thread is stuck in libfabric's shm provider, in a write to "
                  "process {}, which died holding the lock of its shared memory (libfabric 1.17 "
                  "takes it to post); this engine moves nothing more",
                  *pid));
  std::lock_guard lock(mu);
  if (lost) return true;
  logger("mori")->error("{}", reason.message());
  const auto now = Clock::now();
  for (auto& [id, t] : transfers) {
    fail_transfer(t, reason);
    t.drain.end(now);  // the provider returns nothing any more
  }
  std::vector<std::string> keys;
  for (const auto& [key, peer] : peers) keys.push_back(key);
  for (const auto& key : keys) fail_peer_locked(key, reason);
  thread.abandon();
  // The callbacks, on a thread of their own: the caller here may hold its
  // own lock around this call (MoriTransport's poll does). Started before
  // `lost` is set, so that whoever sees it set finds the thread to join.
  try {
    late_reports = std::thread([this] { failures.deliver_pending(); });
  } catch (const std::system_error& e) {
    logger("mori")->error("no thread to report the failures on: {}", e.what());
  }
  lost = true;
  return true;
}

// Waits for the progress thread's round in progress to end (see
// acquire_inbound_writes), unless the thread is given up meanwhile.
void IoEngine::Impl::wait_round() {
  if (lost) return;
  while (!round_mu.try_lock_for(std::chrono::milliseconds(100))) {
    if (give_up_if_stuck()) return;
  }
  round_mu.unlock();
}

void IoEngine::Impl::fail_peer_locked(const std::string& key, const Status& reason) {
  auto p = peers.find(key);
  if (p == peers.end()) return;
  if (!failures.report(key, reason)) return;  // once; the callback runs on the thread
  for (auto& [id, t] : transfers) {
    if (t.peer == key) fail_transfer(t, reason);
  }
  // What this peer leaves behind: its address (once the provider holds
  // nothing of it), its nonce and what landed from it unasked for.
  const uint32_t nonce = p->second.desc.nonce;
  nonces.erase(nonce);
  std::erase_if(inbound,
                [nonce](TransferId id) { return static_cast<uint32_t>(id >> 32) == nonce; });
  retired.push_back({p->second.endpoint, p->second.addr});
  peers.erase(p);
  notify();
}

// Failed peers' addresses leave their AV once nothing of theirs is posted.
void IoEngine::Impl::remove_retired() {
  std::vector<Retired> due;
  {
    std::lock_guard lock(mu);
    if (retired.empty()) return;
    due.swap(retired);
  }
  std::erase_if(due, [this](const Retired& r) {
    for (const auto& [raw, op] : posted) {
      if (op->endpoint == r.endpoint && op->addr == r.addr) return false;
    }
    fi_addr_t addr = r.addr;
    (void)fi_av_remove(endpoints[r.endpoint]->av, &addr, 1, 0);
    return true;
  });
  if (due.empty()) return;
  std::lock_guard lock(mu);
  retired.insert(retired.end(), due.begin(), due.end());
}

IoEngine::IoEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
IoEngine::~IoEngine() {
  if (impl_->thread.stop()) return;
  // Its thread is stuck in a provider call that reads the engine: kept,
  // where a leak checker still sees it.
  if (impl_->late_reports.joinable()) impl_->late_reports.join();
  static std::mutex kept_mu;
  static auto* kept = new std::vector<std::unique_ptr<Impl>>;
  std::lock_guard lock(kept_mu);
  kept->push_back(std::move(impl_));
}

Result<std::unique_ptr<IoEngine>> IoEngine::create(IoEngineConfig config) {
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->host_identity = local_host_identity();
  std::vector<std::string> wanted;
  if (const char* env = std::getenv("FI_PROVIDER"); env != nullptr && config.provider == "auto") {
    wanted = {env};  // the operator's choice, for every peer
  } else if (config.provider == "auto") {
    wanted = {"shm", "tcp;ofi_rxm"};
  } else {
    wanted = {config.provider};
  }
  std::string why;
  for (const auto& name : wanted) {
    auto e = std::make_unique<Endpoint>();
    if (Status st = e->open(name, config.host); !st.is_ok()) {
      why += (why.empty() ? "" : "; ") + st.message();
      logger("mori")->debug("provider {} unavailable: {}", name, st.message());
      continue;
    }
    impl->desc.endpoints.push_back({name, e->address});
    impl->endpoints.push_back(std::move(e));
  }
  if (impl->endpoints.empty()) {
    // A provider named by the user that is not here is bad input; "auto"
    // finding nothing is this machine's problem.
    const std::string message = fmt::format(
        "mori: no libfabric provider could be opened ({}); `fi_info -l` lists this host's", why);
    return config.provider == "auto" ? Status::unavailable(message)
                                     : Status::invalid_argument(message);
  }
  uint32_t nonce = 0;
  if (getrandom(&nonce, sizeof nonce, 0) != sizeof nonce) {
    return Status::internal("getrandom failed: no transfer-id nonce");
  }
  impl->desc.key = config.key;
  impl->desc.nonce = nonce;
  impl->desc.host_identity = impl->host_identity;
  impl->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  impl->start_thread();
  return std::unique_ptr<IoEngine>(new IoEngine(std::move(impl)));
}

const EngineDesc& IoEngine::desc() const { return impl_->desc; }

std::vector<std::string> IoEngine::Impl::provider_names() const {
  std::vector<std::string> names;
  for (const auto& e : endpoints) names.push_back(e->provider);
  return names;
}

std::vector<std::string> IoEngine::providers() const { return impl_->provider_names(); }

Result<MemoryDesc> IoEngine::register_memory(void* base, uint64_t length) {
  if (base == nullptr || length == 0) return Status::invalid_argument("mori: empty buffer");
  return impl_->thread.run([&]() -> Result<MemoryDesc> {
    Impl::Registered reg;
    reg.desc.engine_key = impl_->desc.key;
    reg.desc.base = reinterpret_cast<uint64_t>(base);
    reg.desc.length = length;
    for (auto& e : impl_->endpoints) {
      fid_mr* mr = nullptr;
      int rc = -FI_ENOKEY;
      // A key nobody can guess (a key in use already is drawn again).
      for (int tries = 0; rc == -FI_ENOKEY && tries < kKeyTries; ++tries) {
        PDKV_ASSIGN_OR_RETURN(const uint64_t requested,
                              e->prov_key ? Result<uint64_t>(uint64_t{0}) : random_key(*e));
        rc = fi_mr_reg(e->domain, base, length,
                       FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE, 0, requested, 0, &mr,
                       nullptr);
      }
      if (rc == 0 && e->endpoint_mr) {
        rc = fi_mr_bind(mr, &e->ep->fid, 0);
        if (rc == 0) rc = fi_mr_enable(mr);
      }
      if (rc != 0) {
        if (mr) fi_close(&mr->fid);
        for (fid_mr* m : reg.mrs) fi_close(&m->fid);
        return ofi_error(fmt::format("fi_mr_reg of {} bytes on {}", length, e->provider), rc);
      }
      reg.mrs.push_back(mr);
      reg.desc.keys.push_back(fi_mr_key(mr));
    }
    std::lock_guard lock(impl_->mu);
    reg.desc.id = static_cast<uint32_t>(impl_->registered.size());
    impl_->registered.push_back(reg);
    return reg.desc;
  });
}

// The endpoint a peer is reached by, ours and its: shm for a peer on this
// host, when both have it; else the first provider both have (tcp;ofi_rxm in
// auto mode).
Result<std::pair<size_t, size_t>> IoEngine::Impl::endpoint_for(const EngineDesc& remote) const {
  std::optional<size_t> local, theirs;
  const bool same_host = !host_identity.empty() && remote.host_identity == host_identity;
  for (size_t i = 0; i < endpoints.size() && !local; ++i) {
    const std::string& p = endpoints[i]->provider;
    if (p == "shm" && !same_host) continue;
    for (size_t j = 0; j < remote.endpoints.size(); ++j) {
      if (remote.endpoints[j].provider == p) {
        local = i;
        theirs = j;
        break;
      }
    }
  }
  if (!local) {
    std::vector<std::string> ours = provider_names(), peer;
    for (const auto& e : remote.endpoints) peer.push_back(e.provider);
    return Status::failed_precondition(fmt::format(
        "mori engine '{}' shares no usable provider with this one (ours: {}; its: {}{})",
        remote.key, fmt::join(ours, ", "), fmt::join(peer, ", "),
        same_host ? "" : "; shm only reaches this host"));
  }
  return std::pair{*local, *theirs};
}

Status IoEngine::register_remote_engine(const EngineDesc& remote) {
  PDKV_ASSIGN_OR_RETURN(const auto chosen, impl_->endpoint_for(remote));
  // Named, not a structured binding: lambdas capture these (clang 14).
  const auto local = chosen.first, theirs = chosen.second;
  return impl_->thread.run([&]() -> Status {
    Endpoint& e = *impl_->endpoints[local];
    fi_addr_t addr = FI_ADDR_UNSPEC;
    const int n = fi_av_insert(e.av, remote.endpoints[theirs].address.data(), 1, &addr, 0, nullptr);
    if (n != 1) {
      return Status::invalid_argument(
          fmt::format("mori engine '{}': its {} address was not accepted", remote.key, e.provider));
    }
    std::optional<Impl::Retired> replaced;
    {
      std::lock_guard lock(impl_->mu);
      Impl::Peer& peer = impl_->peers[remote.key];
      if (peer.addr != FI_ADDR_UNSPEC && peer.addr != addr) replaced = {peer.endpoint, peer.addr};
      peer.desc = remote;
      peer.endpoint = local;
      peer.addr = addr;
      peer.process.reset();
      if (const pid_t pid = shm_address_pid(remote.endpoints[theirs].address);
          e.provider == "shm" && pid > 0) {
        peer.process = std::make_shared<const PeerProcess>(pid);
      }
      impl_->nonces[remote.nonce] = remote.key;
      impl_->failures.forget(remote.key);  // a new engine by that key from now on
    }
    if (replaced) {  // registered again: one entry
      (void)fi_av_remove(impl_->endpoints[replaced->endpoint]->av, &replaced->addr, 1, 0);
    }
    return Status::ok();
  });
}

bool IoEngine::fence_peer(const EngineDesc& remote) {
  auto chosen = impl_->endpoint_for(remote);
  if (!chosen.is_ok()) return false;
  const auto local = chosen->first, theirs = chosen->second;
  Result<bool> fenced = impl_->thread.run([&]() -> Result<bool> {
    return impl_->endpoints[local]->fence(remote.endpoints[theirs].address);
  });
  return fenced.is_ok() && *fenced;
}

bool IoEngine::can_fence() const {
  return std::any_of(impl_->endpoints.begin(), impl_->endpoints.end(),
                     [](const auto& e) { return e->can_fence; });
}

Result<std::string> IoEngine::provider_for(const std::string& engine_key) const {
  std::lock_guard lock(impl_->mu);
  auto p = impl_->peers.find(engine_key);
  if (p == impl_->peers.end()) {
    return Status::not_found(fmt::format("no mori engine '{}' registered", engine_key));
  }
  return impl_->endpoints[p->second.endpoint]->provider;
}

TransferId IoEngine::allocate_transfer_id() {
  std::lock_guard lock(impl_->mu);
  return (TransferId{impl_->desc.nonce} << 32) | impl_->next_transfer++;
}

Result<IoEngine::Session> IoEngine::create_session(const MemoryDesc& local,
                                                   const MemoryDesc& remote) {
  std::lock_guard lock(impl_->mu);
  if (local.engine_key != impl_->desc.key || local.id >= impl_->registered.size()) {
    return Status::invalid_argument(
        fmt::format("memory {} of engine '{}' is not registered here", local.id, local.engine_key));
  }
  if (impl_->peers.count(remote.engine_key) == 0) {
    return Status::not_found(fmt::format("no mori engine '{}' registered", remote.engine_key));
  }
  Session s;
  s.engine_ = this;
  s.local_ = local;
  s.remote_ = remote;
  return s;
}

Status IoEngine::Session::batch_write(std::span<const uint64_t> local_offsets,
                                      std::span<const uint64_t> remote_offsets,
                                      std::span<const uint64_t> sizes, TransferId id) {
  return engine_->impl_->submit(false, local_offsets, remote_offsets, sizes, id, local_, remote_);
}

Status IoEngine::Session::batch_read(std::span<const uint64_t> local_offsets,
                                     std::span<const uint64_t> remote_offsets,
                                     std::span<const uint64_t> sizes, TransferId id) {
  return engine_->impl_->submit(true, local_offsets, remote_offsets, sizes, id, local_, remote_);
}

Status IoEngine::Impl::submit(bool read, std::span<const uint64_t> local_offsets,
                              std::span<const uint64_t> remote_offsets,
                              std::span<const uint64_t> sizes, TransferId id,
                              const MemoryDesc& local, const MemoryDesc& remote) {
  if (local_offsets.size() != sizes.size() || remote_offsets.size() != sizes.size()) {
    return Status::invalid_argument(
        fmt::format("transfer {:#x}: {} local offsets, {} remote offsets, {} sizes", id,
                    local_offsets.size(), remote_offsets.size(), sizes.size()));
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (local_offsets[i] > local.length || sizes[i] > local.length - local_offsets[i] ||
        remote_offsets[i] > remote.length || sizes[i] > remote.length - remote_offsets[i]) {
      return Status::out_of_range(fmt::format(
          "transfer {:#x} op {}: {} bytes at local {} / remote {} leave the buffers ({} / {})", id,
          i, sizes[i], local_offsets[i], remote_offsets[i], local.length, remote.length));
    }
  }
  {
    std::lock_guard lock(mu);
    auto p = peers.find(remote.engine_key);
    if (lost) {
      return Status::unavailable("mori: this engine's progress thread was given up (see its log)");
    }
    if (p == peers.end()) {
      if (auto failure = failures.failure(remote.engine_key)) return *failure;
      return Status::not_found(fmt::format("no mori engine '{}' registered", remote.engine_key));
    }
    if (transfers.count(id)) {
      return Status::already_exists(fmt::format("transfer {:#x} is already in use", id));
    }
    const size_t ep = p->second.endpoint;
    Endpoint& e = *endpoints[ep];
    const Registered& reg = registered.at(local.id);
    // The remote key of the provider this peer is reached by.
    size_t theirs = 0;
    for (size_t j = 0; j < p->second.desc.endpoints.size(); ++j) {
      if (p->second.desc.endpoints[j].provider == e.provider) theirs = j;
    }
    if (theirs >= remote.keys.size()) {
      return Status::invalid_argument(fmt::format("memory {} of engine '{}' has no {} key",
                                                  remote.id, remote.engine_key, e.provider));
    }
    Transfer& t = transfers[id];
    t.peer = remote.engine_key;
    t.endpoint = ep;
    t.addr = p->second.addr;
    t.deadline = Clock::now() + config.transfer_timeout;
    const uint64_t remote_base = e.virt_addr ? remote.base : 0;
    // Where the peer's endpoint keeps writes in order, the signal may follow
    // the others at once; else it waits for their completions.
    const bool ordered = !read && std::all_of(sizes.begin(), sizes.end(), [&](uint64_t size) {
      return size <= e.ordered_write_bytes;
    });
    std::vector<std::unique_ptr<Op>> ops;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (sizes[i] == 0) continue;
      auto op = std::make_unique<Op>();
      op->transfer = id;
      op->read = read;
      op->local = reinterpret_cast<char*>(local.base) + local_offsets[i];
      op->local_desc = fi_mr_desc(reg.mrs[ep]);
      op->length = sizes[i];
      op->remote_addr = remote_base + remote_offsets[i];
      op->key = remote.keys[theirs];
      op->ordered = ordered;
      ops.push_back(std::move(op));
    }
    if (ops.empty()) {
      t.status.state = TransferState::kSuccess;
      return Status::ok();
    }
    if (!read) {  // the last write tells the target, after all the others
      ops.back()->signal = true;
      if (ops.size() > 1 && !ordered) {
        t.held_signal = std::move(ops.back());
        ops.pop_back();
      }
    }
    t.outstanding = ops.size();
    for (auto& op : ops) p->second.queue.push_back(std::move(op));
  }
  notify();
  return Status::ok();
}

TransferStatus IoEngine::transfer_status(TransferId id) {
  (void)impl_->give_up_if_stuck();
  std::lock_guard lock(impl_->mu);
  auto t = impl_->transfers.find(id);
  if (t == impl_->transfers.end()) {
    return {TransferState::kFailed, Status::not_found(fmt::format("no transfer {:#x}", id))};
  }
  // A failed transfer is reported once it is over: nothing of it is left
  // with the provider (its Ops stay in `posted` until the provider returns
  // them, when the drain ran out of time).
  if (!t->second.over(Clock::now())) return {TransferState::kInProgress, {}};
  TransferStatus st = t->second.status;
  if (st.state != TransferState::kInProgress) impl_->transfers.erase(t);
  return st;
}

bool IoEngine::pop_inbound_transfer_status(const std::string& remote_key, TransferId id) {
  std::lock_guard lock(impl_->mu);
  auto n = impl_->nonces.find(static_cast<uint32_t>(id >> 32));
  if (n == impl_->nonces.end() || n->second != remote_key) return false;
  return impl_->inbound.erase(id) > 0;
}

void IoEngine::cancel_transfer(TransferId id, const Status& reason) {
  std::lock_guard lock(impl_->mu);
  auto t = impl_->transfers.find(id);
  if (t != impl_->transfers.end()) impl_->fail_transfer(t->second, reason);
  impl_->notify();
}

void IoEngine::fail_peer(const std::string& engine_key, const Status& reason) {
  {
    std::lock_guard lock(impl_->mu);
    impl_->fail_peer_locked(engine_key, reason);
  }
  (void)impl_->give_up_if_stuck();
}

// Providers copy peers' bytes into our memory inside the progress thread's
// provider calls (shm inline writes, tcp), always in a round under round_mu.
// Taking round_mu orders the caller after the round that moved bytes it
// learnt of, and before the rounds that will move bytes into memory it
// touched. (An atomic flag would not do: a provider may acknowledge bytes
// inside a call, before any release that follows it.)
void IoEngine::acquire_inbound_writes() const { impl_->wait_round(); }

void IoEngine::release_to_peers() { impl_->wait_round(); }

void IoEngine::set_peer_failure_callback(PeerFailureCallback callback) {
  impl_->failures.set_callback(std::move(callback));
}

}  // namespace pdkv::backends::mori

// The progress thread's passes of IoEngine (io_engine_impl.h): what is
// queued goes to the provider in bursts, completions settle transfers,
// deadlines and drains end them.
#include <fmt/format.h>
#include <poll.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <algorithm>
#include <cstring>

#include "io_engine_impl.h"
#include "log.h"

namespace pdkv::backends::mori {
namespace {

// Idle, the progress thread still reads the completion queues this often:
// manual-progress providers move inbound data only when polled.
constexpr auto kIdleTick = std::chrono::milliseconds(1);
// After peers' traffic that nothing announced was last seen (idle_wait),
// the thread polls without sleeping this long: on shm a peer that does not
// ring our doorbell is heard only when we poll.
constexpr auto kHotWindow = std::chrono::milliseconds(5);
// At most this many operations of one peer are taken off its queue per
// pass: what the provider refuses (-FI_EAGAIN) goes back, and a burst
// bounds that work.
constexpr size_t kPostBurst = 256;
// A failed transfer's operations still with the provider are cancelled; it
// is over when the provider has returned them all, or once it returned no
// operation on the transfer's endpoint for kDrainQuiet, or kDrainCap after
// the failure (drain_deadline.h).
constexpr auto kDrainQuiet = std::chrono::milliseconds(1000);
constexpr auto kDrainCap = std::chrono::milliseconds(10000);

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

}  // namespace

void IoEngine::Impl::start_thread() {
  ProgressThread::Driver driver;
  driver.progress = [this] {
    const bool active = progress();
    batch_ends.announce();  // round_mu and mu released
    messages_in.announce();
    return active;
  };
  driver.busy = [this] { return busy(); };
  driver.sleep = [this](std::chrono::microseconds limit) { idle_wait(limit); };
  driver.wake = [this] { notify(); };
  driver.idle_tick = kIdleTick;
  // No hot phase after traffic as such: idle_wait polls without sleeping
  // only after traffic that came unannounced.
  driver.hot_window = std::chrono::microseconds(0);
  driver.stuck = [this] { return give_up_if_stuck(); };
  thread.start(std::move(driver));
}

bool IoEngine::Impl::progress() {
  std::lock_guard round(round_mu);
  cancel_failed();
  post_receives_again();
  bool active = post_queued();
  bool arrived = false;
  for (size_t i = 0; i < endpoints.size(); ++i) active |= read_completions(i, arrived);
  arrived |= inbound_traffic();
  active |= arrived;
  const auto now = Clock::now();
  if (arrived && woke_unannounced) spin_until = now + kHotWindow;
  woke_unannounced = false;
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
//
// It polls again at once instead while peers' traffic keeps coming that
// nothing announced: shm has no descriptor, and a peer that does not ring
// our doorbell is heard only by polling. Traffic that rang, or woke a
// descriptor (tcp;ofi_rxm's), lets the thread sleep (peer_doorbell.h says
// why that is faster).
void IoEngine::Impl::idle_wait(std::chrono::microseconds limit) {
  if (Clock::now() < spin_until) {
    // What the next pass finds came unannounced, unless a ring is here.
    woke_unannounced = !take_wakes();
    std::this_thread::yield();
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
  const std::chrono::microseconds wait = all_waitable ? std::chrono::milliseconds(100) : limit;
  const timespec timeout{static_cast<time_t>(wait.count() / 1000000),
                         static_cast<long>(wait.count() % 1000000) * 1000};
  woke_unannounced = ::ppoll(fds.data(), fds.size(), &timeout, nullptr) == 0;
  if (fds[0].revents & POLLIN) take_wakes();
}

// One pass over the peers' queues: up to kPostBurst operations of each are
// taken under mu, posted without it, and settled under it again. True when
// any went to the provider.
bool IoEngine::Impl::post_queued() {
  std::vector<Burst> bursts = take_queued();
  if (bursts.empty()) return false;
  bool any = false;
  for (auto& b : bursts) {
    if (lost) break;  // given up (give_up_if_stuck): nothing more goes
    post_burst(b);
    if (b.rings && b.doorbell) {
      b.doorbell->ring();
      rung_doorbells.fetch_add(1, std::memory_order_relaxed);
    }
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
    Burst b{key, peer.endpoint, peer.process, peer.mapped, peer.doorbell, {}, 0, false, 0};
    while (!peer.queue.empty() && b.ops.size() < kPostBurst) {
      std::unique_ptr<Op> op = std::move(peer.queue.front());
      peer.queue.pop_front();
      op->endpoint = peer.endpoint;
      op->addr = peer.addr;
      if (op->message) {
        b.ops.push_back(std::move(op));
        continue;
      }
      auto t = transfers.find(op->transfer);
      if (t == transfers.end() || t->second.status.state != TransferState::kInProgress) {
        continue;  // its transfer ended (failed) meanwhile: dropped, never posted
      }
      op->mapped = copy_target(peer.mapped.get(), *op);
      if (op->mapped == nullptr && t->second.lands_by_message) {
        // Its peer registered again meanwhile, and its pools are no longer
        // mapped: without its signal the write would say nothing of delivery.
        fail_transfer(t->second, Status::unavailable(fmt::format(
                                     "transfer {:#x}: {}'s pools are no longer mapped here",
                                     op->transfer, key)));
        continue;
      }
      ++t->second.with_provider;
      if (op->mapped != nullptr) ++t->second.copying;
      b.ops.push_back(std::move(op));
    }
    if (!b.ops.empty()) bursts.push_back(std::move(b));
  }
  return bursts;
}

// Where `op` goes in the peer's mapped pools (`mapped`), if it is copied
// there: never the signal, which tells the target, through the provider,
// once the copies before it are done.
char* IoEngine::Impl::copy_target(const PeerMappings* mapped, const Op& op) {
  if (mapped == nullptr || op.message || op.signal) return nullptr;
  return mapped->local(op.remote_addr, op.length);
}

// Posts in order until the provider says -FI_EAGAIN (the rest wait for the
// next pass) or refuses one: nothing behind a refused write may go, for a
// signal there would say it landed. An operation into (or out of) the
// peer's mapped pools is a memcpy, done here. Each post but the burst's
// last says FI_MORE: another follows at once, and what a provider defers
// for it is flushed by a later post. The post watch covers the provider's
// calls only: a copy always ends, even into a peer that died.
void IoEngine::Impl::post_burst(Burst& b) {
  Endpoint& e = *endpoints[b.endpoint];
  size_t provider_end = 0;  // after the last operation the provider takes
  for (size_t i = 0; i < b.ops.size(); ++i) {
    if (b.ops[i]->mapped == nullptr) provider_end = i + 1;
  }
  for (; b.posted < b.ops.size(); ++b.posted) {
    Op& op = *b.ops[b.posted];
    if (op.mapped != nullptr) {
      if (op.read) {
        std::memcpy(op.local, op.mapped, op.length);
      } else {
        copy_into_peer(op.mapped, op.local, op.length);
      }
      // Counted with a release: the copy is ordered before what tells the
      // target to read these bytes, which follows (a signal, a landed
      // message, a notice).
      copied_bytes.fetch_add(op.length, std::memory_order_release);
      continue;
    }
    const uint64_t flags = FI_COMPLETION | (b.posted + 1 < provider_end ? FI_MORE : 0);
    if (b.process) post_watch.begin(b.process);
    const ssize_t rc = post(e, op, flags);
    if (b.process) post_watch.end();
    if (rc == -FI_EAGAIN) return;  // the provider needs progress first
    if (rc != 0) {
      b.refused_rc = static_cast<int>(rc);
      return;
    }
    b.rings = true;
  }
}

// One fi_sendmsg, fi_readmsg or fi_writemsg of `op`.
ssize_t IoEngine::Impl::post(Endpoint& e, Op& op, uint64_t flags) {
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
  if (op.message) {
    iov = {op.payload.data(), op.payload.size()};
    fi_msg message{&iov, nullptr, 1, op.addr, &op, 0};
    return fi_sendmsg(e.ep, &message, flags);
  }
  if (op.read) return fi_readmsg(e.ep, &msg, flags);
  // Not FI_INJECT_COMPLETE, even where the signal makes it safe: a write
  // must stay ours until the peer has it, so that a failed transfer is
  // reported once nothing of it can land any more.
  if (op.signal) {
    flags |= FI_DELIVERY_COMPLETE | FI_REMOTE_CQ_DATA;
    msg.data = op.transfer;
  } else {
    flags |= FI_TRANSMIT_COMPLETE;
  }
  return fi_writemsg(e.ep, &msg, flags);
}

// mu held. Posted operations are the provider's now, copied ones done;
// refused ones fail their transfer; the rest go back to the front of their
// peer's queue.
void IoEngine::Impl::settle_burst(Burst& b) {
  for (size_t i = 0; i < b.posted; ++i) {
    std::unique_ptr<Op>& op = b.ops[i];
    if (op->mapped != nullptr) {
      settle_copy(*op);
      finish_op(std::move(op), Status::ok(), 0);
      continue;
    }
    Op* raw = op.get();
    posted.emplace(raw, std::move(op));
  }
  if (b.refused_rc != 0) {
    const Op& op = *b.ops[b.posted];
    if (op.message) {
      logger("mori")->debug("a message to {} not sent: {}", b.peer,
                            ofi_error("fi_sendmsg", b.refused_rc).message());
    } else {
      Transfer& t = transfers.find(op.transfer)->second;
      --t.with_provider;
      fail_transfer(t, ofi_error(op.read ? "fi_readmsg" : "fi_writemsg", b.refused_rc));
    }
  }
  auto p = peers.find(b.peer);
  const size_t settled = b.posted + (b.refused_rc != 0 ? 1 : 0);
  for (size_t i = b.ops.size(); i-- > settled;) {
    if (b.ops[i]->message) {
      if (p != peers.end()) p->second.queue.push_front(std::move(b.ops[i]));
      continue;
    }
    auto t = transfers.find(b.ops[i]->transfer);
    --t->second.with_provider;
    if (b.ops[i]->mapped != nullptr) settle_copy(*b.ops[i]);
    const bool live = t->second.status.state == TransferState::kInProgress;
    if (p != peers.end() && live) p->second.queue.push_front(std::move(b.ops[i]));
  }
}

// mu held: a copy taken into a burst is settled (done, or put back).
void IoEngine::Impl::settle_copy(const Op& op) {
  auto t = transfers.find(op.transfer);
  if (t != transfers.end() && t->second.copying > 0) --t->second.copying;
}

// Reads the CQ without mu; what it finished is settled under mu.
bool IoEngine::Impl::read_completions(size_t index, bool& arrived) {
  Endpoint& e = *endpoints[index];
  std::vector<Finished> finished;
  Arrivals got;
  fi_cq_data_entry entries[64];
  while (true) {
    const ssize_t n = fi_cq_read(e.cq, entries, 64);
    if (n == -FI_EAGAIN) break;
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(e.cq, &err, 0) != 1) break;
      char detail[256] = {};
      fi_cq_strerror(e.cq, err.prov_errno, err.err_data, detail, sizeof detail);
      if (InboxSlot* slot = e.inbox_slot(err.op_context)) {  // a message we could not take
        logger("mori")->warn("{}: a peer's message dropped: {} ({})", e.provider,
                             fi_strerror(err.err), detail);
        take_receive(index, slot, 0, got);
        continue;
      }
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
        got.landed.push_back(c.data);
        continue;
      }
      if (c.flags & FI_RECV) {
        take_receive(index, static_cast<InboxSlot*>(c.op_context), c.len, got);
        continue;
      }
      auto it = posted.find(static_cast<Op*>(c.op_context));
      if (it == posted.end()) continue;
      finished.push_back({std::move(it->second), Status::ok(), 0});
      posted.erase(it);
    }
  }
  const bool peers_spoke = !got.landed.empty() || !got.messages.empty();
  arrived |= peers_spoke;
  if (finished.empty() && !peers_spoke) return false;
  const auto now = Clock::now();
  std::lock_guard lock(mu);
  if (config.keep_inbound) inbound.insert(got.landed.begin(), got.landed.end());
  if (!got.messages.empty()) {
    for (auto& m : got.messages) messages.push_back(std::move(m));
    messages_in.mark();
  }
  for (auto& f : finished) {
    returned_at[f.op->endpoint] = now;
    finish_op(std::move(f.op), f.error, f.err);
  }
  return true;
}

// Keeps what a message that begins with our inbox key says, and posts the
// slot again. `length` 0: a failed receive.
void IoEngine::Impl::take_receive(size_t endpoint, InboxSlot* slot, size_t length, Arrivals& got) {
  length = std::min(length, InboxSlot::kBytes);
  const bool ours =
      length >= kMessageHeader && std::memcmp(slot->bytes, &desc.inbox_key, sizeof(uint64_t)) == 0;
  const auto kind = ours ? static_cast<MessageKind>(slot->bytes[sizeof(uint64_t)]) : MessageKind{};
  const char* body = slot->bytes + kMessageHeader;
  const size_t body_length = ours ? length - kMessageHeader : 0;
  if (ours && kind == MessageKind::kNotice) {
    got.messages.emplace_back(body, body_length);
  } else if (ours && kind == MessageKind::kLanded && body_length % sizeof(TransferId) == 0) {
    for (size_t at = 0; at < body_length; at += sizeof(TransferId)) {
      TransferId id;
      std::memcpy(&id, body + at, sizeof id);
      got.landed.push_back(id);
    }
  } else if (length > 0) {
    logger("mori")->warn("{}: dropped a message of {} bytes without this engine's inbox key{}",
                         endpoints[endpoint]->provider, length, ours ? " or of no known kind" : "");
    std::lock_guard lock(mu);
    ++dropped_messages;
  }
  if (!endpoints[endpoint]->post_receive(*slot)) unposted.emplace_back(endpoint, slot);
}

// Receives the provider could not take back at once (-FI_EAGAIN).
void IoEngine::Impl::post_receives_again() {
  std::erase_if(unposted,
                [this](const auto& r) { return endpoints[r.first]->post_receive(*r.second); });
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
  if (op->message) {  // never reported: the call that follows the notice confirms
    if (error.is_ok()) return;
    logger("mori")->debug("a message not delivered: {}", error.message());
    // A write copied whole sends nothing else through the provider: a
    // message is what finds its peer gone.
    if (peer_is_gone(err)) fail_peer_at(op->endpoint, op->addr, error);
    return;
  }
  auto it = transfers.find(op->transfer);
  if (it == transfers.end()) return;
  Transfer& t = it->second;
  --t.with_provider;
  if (t.status.state != TransferState::kInProgress) {  // failed earlier; now accounted for
    if (t.with_provider == 0) batch_ends.mark();       // and over
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
  batch_ends.mark();
  if (t.lands_by_message) queue_landed(t.peer, it->first);  // ahead of the notices it frees
  release_messages(it->first, /*succeeded=*/true);
}

void IoEngine::Impl::release_messages(TransferId id, bool succeeded) {
  for (auto it = pending_messages.begin(); it != pending_messages.end();) {
    if (it->waiting.erase(id) == 0) {
      ++it;
      continue;
    }
    if (succeeded && it->waiting.empty()) queue_message(it->peer, std::move(it->payload));
    if (!succeeded || it->waiting.empty()) {
      it = pending_messages.erase(it);
    } else {
      ++it;
    }
  }
}

void IoEngine::Impl::queue_message(const std::string& peer, std::string payload) {
  auto p = peers.find(peer);
  if (p == peers.end()) return;  // failed meanwhile: nobody to tell
  auto op = std::make_unique<Op>();
  op->message = true;
  op->payload = std::move(payload);
  p->second.queue.push_back(std::move(op));
}

void IoEngine::Impl::fail_peer_at(size_t endpoint, fi_addr_t addr, const Status& reason) {
  const auto p = std::find_if(peers.begin(), peers.end(), [&](const auto& entry) {
    return entry.second.endpoint == endpoint && entry.second.addr == addr;
  });
  if (p != peers.end()) fail_peer_locked(p->first, reason);
}

void IoEngine::Impl::queue_landed(const std::string& peer, TransferId id) {
  auto p = peers.find(peer);
  // Failed meanwhile, or it keeps no inbound statuses: nobody to tell.
  if (p == peers.end() || !p->second.desc.keeps_inbound) return;
  auto& queue = p->second.queue;
  const auto has_room = [](const Op& op) {
    return op.message &&
           static_cast<MessageKind>(op.payload[sizeof(uint64_t)]) == MessageKind::kLanded &&
           op.payload.size() + sizeof id <= kMessageHeader + kMaxLandedIds * sizeof id;
  };
  if (queue.empty() || !has_room(*queue.back())) {
    queue_message(peer, message_header(p->second.desc.inbox_key, MessageKind::kLanded));
  }
  queue.back()->payload.append(reinterpret_cast<const char*>(&id), sizeof id);
}

void IoEngine::Impl::fail_transfer(Transfer& t, const Status& reason) {
  if (t.status.state != TransferState::kInProgress) return;
  t.status = {TransferState::kFailed, reason};
  batch_ends.mark();  // its failure is heard of at once, while it drains
  t.held_signal.reset();
  release_messages(t.id, /*succeeded=*/false);
  t.drain = DrainDeadline(Clock::now(), kDrainQuiet, kDrainCap);
  t.cancel_due = t.with_provider > 0;
}

// The operations of failed transfers that are still with the provider:
// asked back (fi_cancel), so that the transfer is over sooner. What the
// provider cannot cancel it returns when done, within the drain or not.
void IoEngine::Impl::cancel_failed() {
  std::set<TransferId> due;
  // Failed peers' addresses (not their mappings): messages to them are
  // asked back too.
  std::vector<std::pair<size_t, fi_addr_t>> gone;
  {
    std::lock_guard lock(mu);
    for (auto& [id, t] : transfers) {
      if (t.cancel_due) due.insert(id);
      t.cancel_due = false;
    }
    for (const Retired& r : retired) gone.emplace_back(r.endpoint, r.addr);
  }
  if (due.empty() && gone.empty()) return;
  const auto to_gone = [&gone](const Op& op) {
    return op.message && std::any_of(gone.begin(), gone.end(), [&op](const auto& r) {
             return r.first == op.endpoint && r.second == op.addr;
           });
  };
  for (auto& [raw, op] : posted) {
    if (op->cancelled || (due.count(op->transfer) == 0 && !to_gone(*op))) continue;
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

}  // namespace pdkv::backends::mori

// Peers that IoEngine loses (io_engine_impl.h): a failed peer's transfers,
// nonce and address go (fail_peer_locked, remove_retired); same-host peers
// whose process exited are failed; and the engine gives its progress thread
// up when a post to a dead peer is stuck for good (give_up_if_stuck,
// wait_round).
#include <fmt/format.h>
#include <rdma/fi_domain.h>

#include <system_error>

#include "io_engine_impl.h"
#include "log.h"

namespace pdkv::backends::mori {
namespace {

// A post that waits this long on a peer whose process is gone is stuck for
// good (peer_process.h): the engine gives its progress thread up.
constexpr auto kStuckLimit = std::chrono::milliseconds(1000);

}  // namespace

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
    // Nor does the thread copy: it is in a provider's call (the post watch
    // covers nothing else), and never comes back.
    t.copying = 0;
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
  // By the system clock: libstdc++ waits for a steady-clock deadline in
  // pthread_mutex_clocklock, which GCC 12's ThreadSanitizer does not see
  // (it then reports the unlock below as one of a mutex never locked). A
  // clock step only makes one 100 ms round longer or shorter.
  while (
      !round_mu.try_lock_until(std::chrono::system_clock::now() + std::chrono::milliseconds(100))) {
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
  retired.push_back({p->second.endpoint, p->second.addr, std::move(p->second.mapped)});
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

}  // namespace pdkv::backends::mori

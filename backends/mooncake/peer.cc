// A peer segment: which rail each slice takes, what happens when a rail
// fails (retry elsewhere, or give up with every rail's reason), and the
// same-host path, where slices are copied with memcpy into the peer's
// shared pools, or else by the kernel (process_vm_writev), instead.
#include <fmt/format.h>
#include <sys/epoll.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "engine_impl.h"
#include "log.h"

namespace pdkv::backends::mooncake {
namespace {

// A rail that went down is tried again at most this often.
constexpr auto kReconnectInterval = std::chrono::seconds(1);
// A failed segment's rails wait this long for the ACKs of what they sent.
constexpr auto kDrainLimit = std::chrono::milliseconds(500);
// One same-host copy call moves at most this much before the loop serves
// its sockets again.
constexpr uint64_t kSameHostBudget = 16 << 20;

}  // namespace

// Readable when the peer's process has exited (a pidfd).
class Peer::ExitWatch final : public EventLoop::Handler {
 public:
  explicit ExitWatch(Peer& peer) : peer_(peer) {}
  void on_events(uint32_t) override {
    peer_.fail(Status::unavailable(
        fmt::format("segment {}: process {} exited", peer_.desc_.name, peer_.desc_.pid)));
  }

 private:
  Peer& peer_;
};

Peer::Peer(TransferEngine::Impl& core, SegmentHandle handle, SegmentDescriptor desc,
           LoopContext& loop, PeerMappings mapped)
    : core_(core),
      handle_(handle),
      desc_(std::move(desc)),
      buffer_index_(desc_.buffers),
      loop_(loop),
      mapped_(std::move(mapped)) {
  const auto& bind = core_.bind_addresses;
  const size_t count =
      core_.config.rails > 0 ? core_.config.rails : std::max<size_t>(2, desc_.rails.size());
  for (size_t i = 0; i < count; ++i) {
    // Validated by open_segment.
    const SocketAddress remote = parse_address(desc_.rails[i % desc_.rails.size()], true).value();
    std::optional<SocketAddress> local;
    if (!bind.empty()) local = bind[i % bind.size()];
    rails_.push_back(std::make_unique<Rail>(*this, i, remote, local));
  }
}

Peer::~Peer() {
  if (pidfd_ >= 0) ::close(pidfd_);
}

void Peer::start(bool same_host, int pidfd) {
  loop_.peers.push_back(this);
  same_host_ = same_host;
  pidfd_ = pidfd;
  if (pidfd_ >= 0) {
    exit_watch_ = std::make_unique<ExitWatch>(*this);
    loop_.loop.add(pidfd_, EPOLLIN, exit_watch_.get());
  }
  if (!same_host_) {
    for (auto& rail : rails_) rail->connect();  // early, so that the first request finds them up
  }
}

Rail* Peer::pick_rail() {
  const auto least_loaded = [this]() -> Rail* {
    Rail* best = nullptr;
    for (auto& r : rails_) {
      if (r->state() != Rail::State::kDown &&
          (best == nullptr || r->queued_bytes() < best->queued_bytes())) {
        best = r.get();
      }
    }
    return best;
  };
  if (Rail* r = least_loaded()) return r;
  const auto now = Clock::now();
  if (last_reconnect_ && now - *last_reconnect_ < kReconnectInterval) return nullptr;
  last_reconnect_ = now;
  for (auto& r : rails_) r->connect();
  return least_loaded();
}

bool Peer::fail_if_unreachable() {
  // Every rail failed to connect, or was refused: nobody is there.
  const bool nobody = std::all_of(rails_.begin(), rails_.end(), [](const auto& r) {
    return r->state() == Rail::State::kDown && r->failed_connecting();
  });
  if (nobody) {
    fail(Status::unavailable(
        fmt::format("segment {} unreachable on every rail: {}", desc_.name, rails_report())));
  }
  return nobody;
}

std::string Peer::rails_report() const {
  std::string report;
  for (const auto& r : rails_) {
    if (!report.empty()) report += "; ";
    report += r->last_failure().is_ok() ? r->label() + ": down" : r->last_failure().message();
  }
  return report;
}

void Peer::dispatch(Slices slices) {
  if (slices.empty()) return;
  if (!failure_.is_ok()) {
    for (auto& s : slices) core_.fail(*s, TransferState::kFailed, failure_);
    return;
  }
  core_.mark_pending(slices);
  if (same_host_) {
    // Notifications are for the target's application: only a rail reaches it.
    Slices by_rail;
    for (auto& s : slices) {
      if (s->opcode == Opcode::kNotify) {
        by_rail.push_back(std::move(s));
      } else {
        same_host_queue_.push_back(std::move(s));
      }
    }
    slices = std::move(by_rail);
  }
  if (!same_host_queue_.empty() && !draining_) {
    draining_ = true;
    loop_.loop.post([this] { drain_same_host(); });
  }
  for (auto& s : slices) {
    Rail* rail = pick_rail();
    if (rail == nullptr) {
      if (fail_if_unreachable()) {
        core_.fail(*s, TransferState::kFailed, failure_);
      } else {
        core_.fail(*s, TransferState::kFailed,
                   Status::unavailable(
                       fmt::format("segment {}: no rail left: {}", desc_.name, rails_report())));
      }
      continue;
    }
    rail->enqueue(std::move(s));
  }
}

void Peer::post_dispatch(Slices slices) {
  // std::function needs a copyable task: the slices travel behind a shared_ptr.
  loop_.loop.post(
      [this, s = std::make_shared<Slices>(std::move(slices))] { dispatch(std::move(*s)); });
}

void Peer::post_dispatch(SlicePtr slice) {
  Slices one;
  one.push_back(std::move(slice));
  post_dispatch(std::move(one));
}

void Peer::rail_failed(Rail& rail, Slices slices) {
  // An idle rail closing (the target went away between transfers) is routine.
  logger("mooncake")
      ->log(slices.empty() ? spdlog::level::debug : spdlog::level::warn, "segment {}: {}{}",
            desc_.name, rail.last_failure().message(),
            slices.empty() ? "" : fmt::format("; {} slices move", slices.size()));
  if (!failure_.is_ok()) {  // a rail that was draining: what it still owed is lost
    for (auto& s : slices) core_.fail(*s, TransferState::kFailed, failure_);
    return;
  }
  if (fail_if_unreachable()) {
    for (auto& s : slices) core_.fail(*s, TransferState::kFailed, failure_);
    return;
  }
  Slices retry;
  for (auto& s : slices) {
    if (!core_.wanted(*s)) {  // its batch failed: dropped, never sent again
      core_.fail(*s, TransferState::kFailed, Status::aborted("its batch failed"));
    } else if (++s->attempts > core_.config.retries) {
      core_.fail(*s, TransferState::kFailed,
                 Status::unavailable(fmt::format(
                     "segment {}: a slice of {} bytes failed on {} rails; last: {}", desc_.name,
                     s->length, s->attempts, rail.last_failure().message())));
    } else {
      retry.push_back(std::move(s));
    }
  }
  dispatch(std::move(retry));
}

void Peer::cancel(BatchId batch) {
  const Status dropped = Status::aborted(fmt::format("batch {} failed", batch));
  for (auto it = same_host_queue_.begin(); it != same_host_queue_.end();) {
    if ((*it)->batch != batch) {
      ++it;
      continue;
    }
    core_.fail(**it, TransferState::kFailed, dropped);
    it = same_host_queue_.erase(it);
  }
  for (auto& rail : rails_) {
    for (auto& s : rail->drop_unsent(batch)) core_.fail(*s, TransferState::kFailed, dropped);
  }
  cancelled_[batch] = Clock::now() + kDrainLimit;
}

void Peer::fail(const Status& reason, bool noticed_here) {
  if (!failure_.is_ok()) return;
  failure_ = reason;
  Slices lost;
  // Unsent slices are dropped; what the target may already be applying is
  // drained (Rail::stop_sending): its requests fail now, its batches are
  // reported once the drain is over.
  const auto until = Clock::now() + kDrainLimit;
  for (auto& r : rails_) {
    for (auto& s : r->stop_sending(until)) lost.push_back(std::move(s));
    for (const auto& s : r->unacked()) core_.fail_request(*s, reason);
  }
  for (auto& s : same_host_queue_) lost.push_back(std::move(s));
  same_host_queue_.clear();
  if (pidfd_ >= 0) {
    loop_.loop.remove(pidfd_);
    ::close(pidfd_);
    pidfd_ = -1;
  }
  for (auto& s : lost) core_.fail(*s, TransferState::kFailed, reason);
  // Loud when this engine found it and work was lost; the caller already
  // knows what it told us, and a peer that leaves idle is routine.
  logger("mooncake")
      ->log(noticed_here && !lost.empty() ? spdlog::level::warn : spdlog::level::debug,
            "segment {} failed with {} slices in flight: {}", desc_.name, lost.size(),
            reason.message());
  core_.segment_failed(handle_, reason);
}

bool Peer::tick(Clock::time_point now) {
  bool pending = false;
  for (auto& r : rails_) pending |= r->check_progress(now);
  for (auto it = cancelled_.begin(); it != cancelled_.end();) {
    const BatchId batch = it->first;
    const bool owed = std::any_of(rails_.begin(), rails_.end(),
                                  [batch](const auto& r) { return r->holds(batch); });
    if (owed && now < it->second) {
      pending = true;
      ++it;
      continue;
    }
    it = cancelled_.erase(it);
    for (auto& r : rails_) {
      if (!r->holds(batch)) continue;
      r->fail(Status::aborted(fmt::format(
                  "{}: reset: the target did not acknowledge failed batch {} within {} ms",
                  r->label(), batch, kDrainLimit.count())),
              false);
    }
  }
  return pending;
}

void Peer::fall_back_to_tcp(const std::string& why) {
  logger("mooncake")
      ->warn("segment {}: same-host path unavailable ({}); using TCP", desc_.name, why);
  same_host_ = false;
  Slices queued;
  for (auto& s : same_host_queue_) queued.push_back(std::move(s));
  same_host_queue_.clear();
  dispatch(std::move(queued));
}

// Copies queued slices with process_vm_writev/readv, many per call, up to a
// budget per turn of the loop.
void Peer::drain_same_host() {
  draining_ = false;
  if (!same_host_ || !failure_.is_ok() || same_host_queue_.empty()) return;
  if (Slices copied = copy_mapped(); !copied.empty()) {
    core_.complete(copied);
    if (!same_host_queue_.empty()) {
      draining_ = true;
      loop_.loop.post([this] { drain_same_host(); });
    }
    return;
  }
  std::vector<iovec> local, remote;
  const Opcode opcode = same_host_queue_.front()->opcode;
  uint64_t bytes = 0;
  size_t n = 0;
  // After a bad address, slices go one per call until past it: only the
  // slice at fault fails, not the others (other batches') copied with it.
  const size_t most = one_at_a_time_ > 0 ? 1 : IOV_MAX;
  if (one_at_a_time_ > 0) --one_at_a_time_;
  for (; n < same_host_queue_.size() && n < most && bytes < kSameHostBudget; ++n) {
    const Slice& s = *same_host_queue_[n];
    if (s.opcode != opcode || mapped_.local(s.remote, s.length) != nullptr) break;
    local.push_back({s.local, s.length});
    remote.push_back({reinterpret_cast<void*>(s.remote), s.length});
    bytes += s.length;
  }
  const pid_t pid = static_cast<pid_t>(desc_.pid);
  const ssize_t r = opcode == Opcode::kWrite
                        ? process_vm_writev(pid, local.data(), n, remote.data(), n, 0)
                        : process_vm_readv(pid, local.data(), n, remote.data(), n, 0);
  if (r < 0) {
    const int err = errno;
    const std::string what =
        fmt::format("process_vm_{}v to process {}: {}", opcode == Opcode::kWrite ? "write" : "read",
                    pid, std::strerror(err));
    if (err == ESRCH) {
      return fail(Status::unavailable(fmt::format("segment {}: {}", desc_.name, what)));
    }
    if ((err == EPERM || err == EACCES) && core_.config.same_host != SameHost::kRequire) {
      return fall_back_to_tcp(what);
    }
    if (n > 1) {
      one_at_a_time_ = n;  // find the slice at fault; the others go through
    } else {
      // The addresses were checked against the descriptor: the peer broke its word.
      core_.fail(*same_host_queue_.front(), TransferState::kFailed,
                 Status::internal(fmt::format("segment {}: {}", desc_.name, what)));
      same_host_queue_.pop_front();
    }
  } else {
    core_.same_host_kernel_bytes += static_cast<uint64_t>(r);
    // A short count stops at a failing slice; the next call reports its error.
    Slices done;
    uint64_t left = static_cast<uint64_t>(r);
    while (!same_host_queue_.empty() && same_host_queue_.front()->length <= left &&
           done.size() < n) {
      left -= same_host_queue_.front()->length;
      done.push_back(std::move(same_host_queue_.front()));
      same_host_queue_.pop_front();
    }
    if (done.empty()) {  // no progress at all: do not spin on it
      const Status reason = Status::internal(
          fmt::format("segment {}: process_vm copy to process {} moved no bytes", desc_.name, pid));
      core_.fail(*same_host_queue_.front(), TransferState::kFailed, reason);
      same_host_queue_.pop_front();
    }
    core_.complete(done);
  }
  if (!same_host_queue_.empty()) {
    draining_ = true;
    loop_.loop.post([this] { drain_same_host(); });
  }
}

Slices Peer::copy_mapped() {
  Slices done;
  uint64_t bytes = 0;
  while (!same_host_queue_.empty() && bytes < kSameHostBudget) {
    Slice& s = *same_host_queue_.front();
    char* there = mapped_.local(s.remote, s.length);
    if (there == nullptr) break;
    if (s.opcode == Opcode::kWrite) {
      copy_into_peer(there, s.local, s.length);
    } else {
      std::memcpy(s.local, there, s.length);
    }
    bytes += s.length;
    done.push_back(std::move(same_host_queue_.front()));
    same_host_queue_.pop_front();
  }
  // No more fence than copy_into_peer's own: the peer learns that these
  // bytes landed only from a frame this process sends later, and that send
  // is a system call, which orders the copies before it (as the kernel's
  // own copy is ordered by its call).
  core_.same_host_mapped_bytes += bytes;
  return done;
}

}  // namespace pdkv::backends::mooncake

// A same-host peer's process, watched through a pidfd: whether it has
// exited (killed, crashed, or ended) is a poll away, with no signal and no
// reuse of its pid to mistake it for another. For shm peers, whose
// provider (libfabric 1.17) takes a lock in the peer's shared memory to
// post to it: a write must never start to a peer that is gone, and a
// thread found waiting on a gone peer's lock is stuck for good.
#pragma once

#include <poll.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434  // the same on every architecture (Linux 5.3)
#endif

namespace pdkv::backends::mori {

class PeerProcess {
 public:
  PeerProcess() = default;
  // Watches `pid`; a pid that is not (or no longer) a live process reads as
  // exited at once. A kernel without pidfd_open (before 5.3) watches nothing.
  explicit PeerProcess(pid_t pid) : pid_(pid) {
    fd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    gone_at_start_ = fd_ < 0 && errno == ESRCH;
  }
  PeerProcess(PeerProcess&& other) noexcept { *this = std::move(other); }
  PeerProcess& operator=(PeerProcess&& other) noexcept {
    std::swap(fd_, other.fd_);
    std::swap(pid_, other.pid_);
    std::swap(gone_at_start_, other.gone_at_start_);
    return *this;
  }
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;
  ~PeerProcess() {
    if (fd_ >= 0) ::close(fd_);
  }

  bool watched() const { return fd_ >= 0 || gone_at_start_; }
  pid_t pid() const { return pid_; }
  // Its pidfd (pidfd_getfd takes a peer's memfds through it); -1 if none.
  int fd() const { return fd_; }
  // A pidfd is readable once its process has exited (a zombie too).
  bool exited() const {
    if (gone_at_start_) return true;
    if (fd_ < 0) return false;
    pollfd p{fd_, POLLIN, 0};
    return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
  }

 private:
  int fd_ = -1;
  pid_t pid_ = 0;
  bool gone_at_start_ = false;
};

// The progress thread's post to a watched peer in progress, as the engine's
// other threads see it. A post still running `limit` after its peer's
// process was first seen gone will never return: shm would have failed a
// write to a dead process at once (process_vm_writev: ESRCH); what never
// ends is the wait for the lock that process held when it died.
class PostWatch {
 public:
  using Clock = std::chrono::steady_clock;

  // Progress thread, around each burst to a watched peer.
  void begin(std::shared_ptr<const PeerProcess> peer) {
    std::lock_guard lock(mu_);
    peer_ = std::move(peer);
    ++post_;
  }
  void end() {
    std::lock_guard lock(mu_);
    peer_.reset();
  }
  // Any thread: the pid of the gone peer the post in progress waits for,
  // once it has for `limit`; else nothing.
  std::optional<pid_t> stuck(Clock::duration limit) {
    std::lock_guard lock(mu_);
    if (!peer_ || !peer_->exited()) return std::nullopt;
    const auto now = Clock::now();
    if (gone_post_ != post_) {  // first seen gone during this post
      gone_post_ = post_;
      gone_seen_ = now;
    }
    if (now - gone_seen_ < limit) return std::nullopt;
    return peer_->pid();
  }

 private:
  std::mutex mu_;
  std::shared_ptr<const PeerProcess> peer_;  // posting to it now
  uint64_t post_ = 0;                        // begin()s so far
  uint64_t gone_post_ = 0;                   // the post during which peer_ was seen gone
  Clock::time_point gone_seen_;
};

}  // namespace pdkv::backends::mori

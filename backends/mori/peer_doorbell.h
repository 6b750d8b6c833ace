// A same-host peer's doorbell: the eventfd that wakes its progress thread,
// taken from its process with pidfd_getfd (as its pools are, shared_pool.h).
//
// Why: libfabric 1.17's shm has no wait object, so a target hears what a
// peer posted to it (a message, a write's signal) only when its progress
// thread polls. Polling without sleep after traffic (kHotWindow) costs a
// core per engine, and on a host with more engines than cores it made
// things slower, not faster: a thread that yields without end is the last
// the scheduler picks, and a notice waited 1.2 ms p50 to be read at 4 -> 1
// on this 2-core VM (docs/benchmarks.md). A source rings the doorbell after
// each burst that posted anything to the peer through the provider; the
// peer's thread, asleep in poll() on that eventfd, wakes at once.
//
// Thread-safety: immutable once taken; ring() may be called from any thread.
#pragma once

#include <fmt/format.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "pdkv/status.h"

#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438  // the same on every architecture (Linux 5.6)
#endif

namespace pdkv::backends::mori {

class PeerDoorbell {
 public:
  // The eventfd numbered `number` in the process of `pidfd`. An error names
  // the number when it cannot be taken, or is no eventfd: a descriptor that
  // names another file (a socket, a pipe) must never have 8 bytes written
  // into it.
  static Result<std::unique_ptr<PeerDoorbell>> take(int pidfd, int32_t number) {
    const int fd = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, number, 0));
    if (fd < 0) {
      return Status::unavailable(
          fmt::format("pidfd_getfd of its doorbell {}: {}", number, std::strerror(errno)));
    }
    std::unique_ptr<PeerDoorbell> bell(new PeerDoorbell(fd));
    char target[64] = {};
    const std::string link = fmt::format("/proc/self/fd/{}", fd);
    const ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
    if (n < 0 || std::string_view(target, static_cast<size_t>(n)) != "anon_inode:[eventfd]") {
      return Status::invalid_argument(
          fmt::format("its doorbell {} is no eventfd ({})", number,
                      n < 0 ? std::string(std::strerror(errno)) : std::string(target, n)));
    }
    return bell;
  }
  PeerDoorbell(const PeerDoorbell&) = delete;
  PeerDoorbell& operator=(const PeerDoorbell&) = delete;
  ~PeerDoorbell() { ::close(fd_); }

  // Wakes the peer's progress thread. Never blocks: the peer made its
  // eventfd non-blocking, and a full counter (2^64 - 2 rings unread) only
  // means the peer is awake already.
  void ring() const {
    const uint64_t one = 1;
    (void)!::write(fd_, &one, sizeof one);
  }

 private:
  explicit PeerDoorbell(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace pdkv::backends::mori

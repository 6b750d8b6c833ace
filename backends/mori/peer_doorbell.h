// A same-host peer's doorbell: the eventfd that wakes its progress thread,
// taken from its process with pidfd_getfd (as its pools are, shared_pool.h).
//
// Why: libfabric 1.17's shm has no wait object, so a target hears what a
// peer posted to it (a message, a write's signal, a read to serve) only
// when its progress thread polls. Polling without sleep after traffic
// costs a core per engine, and on a host with more engines than cores it
// made things slower, not faster: a thread that yields without end is the
// last the scheduler picks, and a notice waited 1.2 ms p50 to be read at
// 4 -> 1 on this 2-core VM (docs/benchmarks.md). A source rings the
// doorbell after each burst it posted to the peer through the provider;
// the peer's thread, asleep in poll() on that eventfd, wakes at once.
//
// What a ring covers: the work a post hands the target. shm moves a write
// or read with CMA (process_vm_readv/writev) in one step; without CMA
// (FI_SHM_DISABLE_CMA=1) it moves large ones in chunks that its sender
// refills from its own progress, unrung, and the target then hears each
// chunk only on its 1 ms tick. CMA and pidfd_getfd need the same ptrace
// permission, so where one is refused so is the other, and a target with no
// doorbell taken polls as it always did (io_engine_progress.cc, idle_wait).
//
// Thread-safety: immutable once taken; ring() may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>

#include "pdkv/status.h"

namespace pdkv::backends::mori {

class PeerDoorbell {
 public:
  // The eventfd numbered `number` in the process of `pidfd`, which must be
  // the one its engine described: `id` is its eventfd-id (id_of). An error
  // names the number when it cannot be taken, is no eventfd, another eventfd
  // than described, or one that would block: a descriptor that names
  // another file, or another eventfd of that process (a library's, used as
  // a semaphore), must never have anything written into it.
  static Result<std::unique_ptr<PeerDoorbell>> take(int pidfd, int32_t number, uint64_t id);
  // The eventfd-id the kernel gives `fd` (/proc/self/fdinfo, Linux 5.16 and
  // later): unique among the eventfds of the host while it is open. 0 when
  // `fd` is no eventfd, or the kernel does not say.
  static uint64_t id_of(int fd);

  PeerDoorbell(const PeerDoorbell&) = delete;
  PeerDoorbell& operator=(const PeerDoorbell&) = delete;
  ~PeerDoorbell();

  // Wakes the peer's progress thread. Never blocks (take() refuses an
  // eventfd without O_NONBLOCK); a full counter only means the peer is
  // awake already.
  void ring() const;

 private:
  explicit PeerDoorbell(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace pdkv::backends::mori

// The same-host fast lane of the backends that have one (mooncake, mori):
// pools in shared memory that a peer on the same host maps and copies into
// itself (copy_into_peer), instead of asking the kernel or a provider for each slice
// (process_vm_writev pins and copies page by page, and moved 0.55-0.6 x one
// core's memcpy here).
//
// A segment's own side: allocate() hands out memory backed by a memfd; its
// descriptor lists the memfd's number beside the buffer. A writer's side:
// PeerMappings takes those memfds from the peer's process with
// pidfd_getfd (the same permission process_vm_writev needs: it grants no
// access the same-host path did not have) and maps them shared.
//
// Thread-safety: each is guarded by its owner (mooncake: the engine's
// buffers_mu, and a Peer on its loop's thread; mori: the engine's mu, and
// the progress thread while it copies).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <span>
#include <string_view>
#include <vector>

#include "pdkv/status.h"

namespace pdkv {

// A buffer as its owner's peers learn of it.
struct SharedBuffer {
  uint64_t base = 0, length = 0;  // virtual addresses in the owner's process
  // The number, in the owner's process, of a sealed memfd whose offset 0
  // holds `base`; -1 when the buffer is not shared.
  int32_t memfd = -1;
  // That memfd's inode: what proves, once a peer took the file by its
  // number, that it is the file described (a number is reused once closed).
  uint64_t memfd_inode = 0;
  // Whether it holds all of [addr, addr + length) (written so that no sum
  // can overflow).
  bool holds(uint64_t addr, uint64_t bytes) const {
    return addr >= base && addr - base <= length && bytes <= length - (addr - base);
  }
};

// A file descriptor's number in a descriptor (a buffer's memfd, mori's
// doorbell): -1 (none) travels as all ones. Reading refuses a number no file
// descriptor can have, naming it as `what` ("memfd").
uint64_t fd_to_wire(int32_t fd);
Result<int32_t> fd_from_wire(uint64_t field, std::string_view what);

// The file numbered `number` in the process of `pidfd`, as a new descriptor
// of this process (close-on-exec) that the caller closes: pidfd_getfd, which
// needs the ptrace permission process_vm_writev needs. An error names
// `what` ("memfd") and the number.
Result<int> take_peer_fd(int pidfd, int32_t number, std::string_view what);

// Of `sorted`, in order of base_of(entry), the entry with the greatest base
// at or below `addr` (the only one that can hold it where entries do not
// overlap), or nullptr.
template <typename T, typename BaseOf>
const T* last_at_or_below(std::span<const T> sorted, uint64_t addr, BaseOf base_of) {
  auto after = std::upper_bound(sorted.begin(), sorted.end(), addr,
                                [&](uint64_t a, const T& e) { return a < base_of(e); });
  return after == sorted.begin() ? nullptr : &*std::prev(after);
}

// Copies `length` bytes into a peer's mapped pool. Copies of 1 KiB and more
// use non-temporal stores where the CPU has them (SSE2): the destination is
// another process's memory that this one will not read again, and a store
// that bypasses the cache spares reading each destination line first (32
// KiB copies into cold shared memory: 13.6-15.4 GB/s against 9.7-11.0 for
// memcpy on this VM). Ends with a store fence: non-temporal stores are not
// ordered with later ones, and whatever tells the peer of these bytes
// comes later.
void copy_into_peer(char* dst, const char* src, size_t length);

// Memory this segment allocated in memfds; unmapped and closed with it.
class SharedPools {
 public:
  SharedPools() = default;
  SharedPools(const SharedPools&) = delete;
  SharedPools& operator=(const SharedPools&) = delete;
  ~SharedPools();

  // `length` zeroed bytes, shared, page-aligned, their pages allocated.
  Result<void*> allocate(uint64_t length);
  // [addr, addr + length) as peers learn of it: with the memfd (and its
  // inode) that holds it from its offset 0, if one does.
  SharedBuffer describe(uint64_t addr, uint64_t length) const;

 private:
  struct Pool {
    uint64_t base, length;
    int memfd;
    uint64_t inode;
  };
  std::vector<Pool> pools_;
};

// A peer's shared buffers, mapped into this process.
class PeerMappings {
 public:
  PeerMappings() = default;
  PeerMappings(const PeerMappings&) = delete;
  PeerMappings& operator=(const PeerMappings&) = delete;
  PeerMappings(PeerMappings&&) = default;  // the moved-from one maps nothing
  ~PeerMappings();

  // Maps every buffer of `buffers` that names a memfd, taken through the
  // peer's `pidfd` and found to be the file described (its inode), with its page tables filled in
  // now (MAP_POPULATE): with a fault on every 4 KiB page at the first write, a cold 4 GiB request
  // took 16-19 s on this VM instead of 9 (docs/benchmarks.md). Filling the
  // tables of gigabytes of pools takes a while: call it on no event loop. A buffer that cannot
  // be mapped is left to the kernel's copy; the first reason is returned for
  // the log.
  Status map(int pidfd, std::span<const SharedBuffer> buffers);
  // Where [remote, remote + length) of the peer lies in this process, or
  // nullptr when no mapping holds all of it.
  char* local(uint64_t remote, uint64_t length) const;
  bool empty() const { return mappings_.empty(); }

 private:
  struct Mapping {
    SharedBuffer remote;
    char* local;
  };
  std::vector<Mapping> mappings_;  // by remote.base: local() runs once per slice
};

}  // namespace pdkv

#include "shared_pool.h"

#include <fcntl.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>

#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438  // the same on every architecture (Linux 5.6)
#endif

namespace pdkv {
namespace {

std::string errno_text() { return std::strerror(errno); }

// "" when `fd` is the memfd `b` describes (its inode), of at least its
// length, and can never shrink; else why not. Only such a mapping is safe
// to write into: the peer controls the file, and a page beyond its end
// would kill this process; and a number its owner closed and opened again
// would name another file, perhaps another engine's pool.
std::string check_sealed(int fd, const SharedBuffer& b) {
  const uint64_t length = b.length;
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) return "not a sealable memfd: " + errno_text();
  if ((seals & F_SEAL_SHRINK) == 0) return "not sealed against shrinking";
  struct stat st {};
  if (::fstat(fd, &st) != 0) return "fstat: " + errno_text();
  if (static_cast<uint64_t>(st.st_ino) != b.memfd_inode) {
    return fmt::format("inode {}, not the {} its owner described", st.st_ino, b.memfd_inode);
  }
  if (static_cast<uint64_t>(st.st_size) < length) {
    return fmt::format("{} bytes, less than the buffer's {}", st.st_size, length);
  }
  return "";
}

}  // namespace

namespace {
constexpr uint64_t kNoFd = ~uint64_t{0};
}  // namespace

uint64_t fd_to_wire(int32_t fd) { return fd < 0 ? kNoFd : static_cast<uint64_t>(fd); }

Result<int> take_peer_fd(int pidfd, int32_t number, std::string_view what) {
  const int fd = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, number, 0));
  if (fd < 0) {
    return Status::unavailable(
        fmt::format("pidfd_getfd of its {} {}: {}", what, number, errno_text()));
  }
  return fd;
}

Result<int32_t> fd_from_wire(uint64_t field, std::string_view what) {
  if (field == kNoFd) return -1;
  if (field > uint64_t{INT32_MAX}) {
    return Status::invalid_argument(fmt::format("{} {} is no file descriptor", what, field));
  }
  return static_cast<int32_t>(field);
}

void copy_into_peer(char* dst, const char* src, size_t length) {
#if defined(__SSE2__)
  constexpr size_t kStreamFrom = 1024;  // below, memcpy's own stores are as good
  constexpr size_t kLine = 64;
  if (length >= kStreamFrom) {
    // Up to the destination's first cache-line boundary, then whole lines.
    const size_t head = (kLine - (reinterpret_cast<uintptr_t>(dst) & (kLine - 1))) & (kLine - 1);
    std::memcpy(dst, src, head);
    size_t at = head;
    for (; at + kLine <= length; at += kLine) {
      const auto* from = reinterpret_cast<const __m128i*>(src + at);
      auto* to = reinterpret_cast<__m128i*>(dst + at);
      const __m128i a = _mm_loadu_si128(from), b = _mm_loadu_si128(from + 1);
      const __m128i c = _mm_loadu_si128(from + 2), d = _mm_loadu_si128(from + 3);
      _mm_stream_si128(to, a);
      _mm_stream_si128(to + 1, b);
      _mm_stream_si128(to + 2, c);
      _mm_stream_si128(to + 3, d);
    }
    std::memcpy(dst + at, src + at, length - at);
    _mm_sfence();
    return;
  }
#endif
  std::memcpy(dst, src, length);
}

SharedPools::~SharedPools() {
  for (const Pool& p : pools_) {
    ::munmap(reinterpret_cast<void*>(p.base), p.length);
    ::close(p.memfd);
  }
}

Result<void*> SharedPools::allocate(uint64_t length) {
  if (length == 0) return Status::invalid_argument("a shared pool of 0 bytes");
  const int fd = ::memfd_create("pdkv-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Status::unavailable("memfd_create: " + errno_text());
  // Sealed at its size: a peer that maps it can trust that no page it
  // writes will vanish under it (a shrunk memfd would raise SIGBUS there).
  if (::ftruncate(fd, static_cast<off_t>(length)) != 0 ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    const std::string why = errno_text();
    ::close(fd);
    return Status::unavailable(fmt::format("sizing and sealing a {}-byte memfd: {}", length, why));
  }
  // Populated now, at start-up: the first request would otherwise pay for
  // every page's allocation (4 GiB took a 32k-token request past 30 s here).
  void* base = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (base == MAP_FAILED) {
    const std::string why = errno_text();
    ::close(fd);
    return Status::unavailable(fmt::format("mmap of a {}-byte memfd: {}", length, why));
  }
  struct stat st {};
  (void)::fstat(fd, &st);  // of a memfd just made: it has an inode
  pools_.push_back(
      {reinterpret_cast<uint64_t>(base), length, fd, static_cast<uint64_t>(st.st_ino)});
  return base;
}

SharedBuffer SharedPools::describe(uint64_t addr, uint64_t length) const {
  for (const Pool& p : pools_) {
    if (addr == p.base && length <= p.length) return {addr, length, p.memfd, p.inode};
  }
  return {addr, length, -1, 0};
}

PeerMappings::~PeerMappings() {
  for (const Mapping& m : mappings_) ::munmap(m.local, m.remote.length);
}

Status PeerMappings::map(int pidfd, std::span<const SharedBuffer> buffers) {
  Status first_failure;
  for (const auto& b : buffers) {
    if (b.memfd < 0) continue;
    const Result<int> taken = take_peer_fd(pidfd, b.memfd, "memfd");
    void* local = MAP_FAILED;
    std::string why;
    if (!taken.is_ok()) {
      why = taken.status().message();
    } else {
      const int fd = *taken;
      why = check_sealed(fd, b);
      if (why.empty()) {
        local = ::mmap(nullptr, b.length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
        if (local == MAP_FAILED) why = "mmap: " + errno_text();
      }
      ::close(fd);  // the mapping keeps the memory
      if (!why.empty()) why = fmt::format("its memfd {}: {}", b.memfd, why);
    }
    if (local == MAP_FAILED) {
      if (first_failure.is_ok()) first_failure = Status::unavailable(why);
      continue;
    }
    mappings_.push_back({b, static_cast<char*>(local)});
  }
  std::sort(mappings_.begin(), mappings_.end(),
            [](const Mapping& a, const Mapping& b) { return a.remote.base < b.remote.base; });
  return first_failure;
}

char* PeerMappings::local(uint64_t remote, uint64_t length) const {
  // The mapping with the greatest base at or below `remote` is the only one
  // that can hold it (a process's buffers do not overlap; if they did, a
  // miss here leaves the slice to the kernel's copy, which is as right).
  const Mapping* m =
      last_at_or_below<Mapping>(mappings_, remote, [](const Mapping& e) { return e.remote.base; });
  if (m == nullptr || !m->remote.holds(remote, length)) return nullptr;
  return m->local + (remote - m->remote.base);
}

}  // namespace pdkv

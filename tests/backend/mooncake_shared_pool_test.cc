// The same-host path's shared pools (shared_pool.h): a target's pools in
// sealed memfds are mapped by the initiator and copied into with memcpy;
// other memory is still copied by the kernel; a memfd that could shrink
// under a mapping, or a descriptor naming no file descriptor, is refused.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "segment.h"
#include "shared_pool.h"
#include "support/poll.h"
#include "transfer_engine.h"

namespace pdkv::backends::mooncake {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kBytes = 3 << 20;

// Writes src[0, kBytes) to `dst` of `target`, then reads its first 64 KiB
// back into src + kBytes; returns once both completed.
void write_then_read(TransferEngine& initiator, TransferEngine& target, char* src, char* dst) {
  const SegmentHandle segment = initiator.open_segment(target.segment_descriptor()).value();
  const auto base = reinterpret_cast<uint64_t>(dst);
  for (Opcode op : {Opcode::kWrite, Opcode::kRead}) {
    const BatchId batch = initiator.allocate_batch_id(1).value();
    const TransferRequest request = op == Opcode::kWrite
                                        ? TransferRequest{op, src, segment, base, kBytes}
                                        : TransferRequest{op, src + kBytes, segment, base, 65536};
    ASSERT_TRUE(initiator.submit_transfer(batch, {&request, 1}).is_ok());
    ASSERT_TRUE(testing::poll_until(
        [&] { return initiator.get_batch_status(batch)->state == TransferState::kCompleted; },
        10s));
    ASSERT_TRUE(initiator.free_batch_id(batch).is_ok());
    if (op == Opcode::kWrite) target.acquire_inbound_writes();
  }
}

std::vector<char> pattern(uint64_t bytes) {
  std::vector<char> v(bytes);
  for (uint64_t i = 0; i < bytes; ++i) v[i] = static_cast<char>(i * 29 + 3);
  return v;
}

TEST(MooncakeSharedPool, APoolInSharedMemoryIsWrittenAndReadThroughItsMapping) {
  std::vector<char> src = pattern(kBytes);
  src.resize(kBytes + 65536, 0);
  auto initiator = TransferEngine::create({}).value();
  auto target = TransferEngine::create({}).value();
  auto* pool = static_cast<char*>(target->allocate_shared(kBytes).value());
  ASSERT_TRUE(target->register_local_memory(pool, kBytes).is_ok());
  ASSERT_TRUE(initiator->register_local_memory(src.data(), src.size()).is_ok());
  target->release_to_peers();

  write_then_read(*initiator, *target, src.data(), pool);
  EXPECT_EQ(std::memcmp(pool, src.data(), kBytes), 0);
  EXPECT_EQ(std::memcmp(src.data() + kBytes, src.data(), 65536), 0);
  const auto moved = initiator->same_host_bytes();
  EXPECT_EQ(moved.mapped, kBytes + 65536);
  EXPECT_EQ(moved.kernel, 0u);
}

TEST(MooncakeSharedPool, OrdinaryMemoryIsStillCopiedByTheKernel) {
  std::vector<char> src = pattern(kBytes);
  src.resize(kBytes + 65536, 0);
  std::vector<char> dst(kBytes, 0);
  auto initiator = TransferEngine::create({}).value();
  auto target = TransferEngine::create({}).value();
  ASSERT_TRUE(target->register_local_memory(dst.data(), dst.size()).is_ok());
  ASSERT_TRUE(initiator->register_local_memory(src.data(), src.size()).is_ok());
  target->release_to_peers();

  write_then_read(*initiator, *target, src.data(), dst.data());
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), kBytes), 0);
  EXPECT_EQ(std::memcmp(src.data() + kBytes, src.data(), 65536), 0);
  const auto moved = initiator->same_host_bytes();
  EXPECT_EQ(moved.mapped, 0u);
  EXPECT_EQ(moved.kernel, kBytes + 65536);
}

TEST(MooncakeSharedPool, TheDescriptorCarriesEachBuffersMemfd) {
  SegmentDescriptor d;
  d.name = "127.0.0.1:1";
  d.secret = std::string(32, 's');
  d.rails = {"127.0.0.1:1"};
  d.buffers = {{0x10000, 4096, 7}, {0x20000, 8192, -1}};
  const auto back = SegmentDescriptor::decode(d.encode()).value();
  ASSERT_EQ(back.buffers.size(), 2u);
  EXPECT_EQ(back.buffers[0].memfd, 7);
  EXPECT_EQ(back.buffers[1].memfd, -1);

  // A number no file descriptor can have is refused, by name.
  std::string blob = d.encode();
  const std::string seven(reinterpret_cast<const char*>(&d.buffers[0].length), 8);
  const size_t at = blob.find(seven) + 8;  // the first buffer's memfd field
  const uint64_t huge = uint64_t{1} << 40;
  std::memcpy(blob.data() + at, &huge, 8);
  const auto refused = SegmentDescriptor::decode(blob);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("memfd 1099511627776"), std::string::npos)
      << refused.status().message();
}

// A memfd of this process, as a peer would name it, with `seals` added.
struct OwnMemfd {
  int fd = -1, pidfd = -1;
  OwnMemfd(uint64_t size, unsigned seals) {
    fd = ::memfd_create("test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(size)), 0);
    if (seals != 0) {
      EXPECT_EQ(::fcntl(fd, F_ADD_SEALS, seals), 0);
    }
    pidfd = static_cast<int>(::syscall(SYS_pidfd_open, ::getpid(), 0));
  }
  // As its owner's descriptor names it: by number and inode.
  SegmentDescriptor::Buffer buffer(uint64_t base, uint64_t length) const {
    struct stat st {};
    EXPECT_EQ(::fstat(fd, &st), 0);
    return {base, length, fd, static_cast<uint64_t>(st.st_ino)};
  }
  ~OwnMemfd() {
    ::close(fd);
    ::close(pidfd);
  }
};

TEST(MooncakeSharedPool, AMemfdThatCouldShrinkOrIsTooSmallIsNotMapped) {
  // The writer would take SIGBUS past a memfd's end: only a memfd sealed
  // against shrinking, at least as long as the buffer, is mapped.
  const uint64_t base = 0x10000;
  {
    OwnMemfd unsealed(65536, 0);
    PeerMappings m;
    const SegmentDescriptor::Buffer b = unsealed.buffer(base, 65536);
    const Status st = m.map(unsealed.pidfd, {&b, 1});
    EXPECT_NE(st.message().find("not sealed against shrinking"), std::string::npos)
        << st.to_string();
    EXPECT_EQ(m.local(base, 4096), nullptr);
  }
  {
    OwnMemfd small(4096, F_SEAL_SHRINK);
    PeerMappings m;
    const SegmentDescriptor::Buffer b = small.buffer(base, 65536);
    const Status st = m.map(small.pidfd, {&b, 1});
    EXPECT_NE(st.message().find("4096 bytes, less than the buffer's 65536"), std::string::npos)
        << st.to_string();
    EXPECT_EQ(m.local(base, 4096), nullptr);
  }
  {
    // A number its owner closed and used again names another file: the
    // inode of the one described tells them apart.
    OwnMemfd described(65536, F_SEAL_SHRINK), now(65536, F_SEAL_SHRINK);
    PeerMappings m;
    SegmentDescriptor::Buffer b = described.buffer(base, 65536);
    b.memfd = now.fd;
    const Status st = m.map(now.pidfd, {&b, 1});
    EXPECT_NE(
        st.message().find("not the " + std::to_string(b.memfd_inode) + " its owner described"),
        std::string::npos)
        << st.to_string();
    EXPECT_EQ(m.local(base, 4096), nullptr);
  }
  {
    OwnMemfd sealed(65536, F_SEAL_SHRINK);
    PeerMappings m;
    const SegmentDescriptor::Buffer b = sealed.buffer(base, 65536);
    ASSERT_TRUE(m.map(sealed.pidfd, {&b, 1}).is_ok());
    EXPECT_NE(m.local(base + 4096, 4096), nullptr);
    EXPECT_EQ(m.local(base + 61440, 8192), nullptr);  // runs past the buffer
  }
}

// Bit 63 of /proc/self/pagemap (`fd`): this process's page table maps the
// page at `address`.
bool page_present(int fd, const char* address, uint64_t page) {
  uint64_t entry = 0;
  const off_t at = static_cast<off_t>(reinterpret_cast<uintptr_t>(address) / page * 8);
  EXPECT_EQ(::pread(fd, &entry, sizeof entry, at), static_cast<ssize_t>(sizeof entry));
  return (entry >> 63) & 1;
}

TEST(MooncakeSharedPool, APeersBufferIsMappedWithItsPageTablesFilledIn) {
  // The first write into a peer's pool must not fault on each of its pages
  // (a cold 4 GiB request took 16-19 s that way here, docs/benchmarks.md).
  const int pagemap = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (pagemap < 0) GTEST_SKIP() << "no /proc/self/pagemap to read page tables from";
  constexpr uint64_t kPages = 64;
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  OwnMemfd pool(kPages * page, F_SEAL_SHRINK);
  const SegmentDescriptor::Buffer b = pool.buffer(0x10000, kPages * page);
  PeerMappings m;
  ASSERT_TRUE(m.map(pool.pidfd, {&b, 1}).is_ok());
  const char* local = m.local(b.base, b.length);
  ASSERT_NE(local, nullptr);
  uint64_t present = 0;
  for (uint64_t i = 0; i < kPages; ++i) present += page_present(pagemap, local + i * page, page);
  ::close(pagemap);
  EXPECT_EQ(present, kPages);
}

TEST(MooncakeSharedPool, EachOfSeveralMappedBuffersIsFoundByAddress) {
  // Listed out of address order, with a gap between them.
  OwnMemfd high(8192, F_SEAL_SHRINK), low(4096, F_SEAL_SHRINK);
  const SegmentDescriptor::Buffer buffers[] = {high.buffer(0x40000, 8192),
                                               low.buffer(0x10000, 4096)};
  PeerMappings m;
  ASSERT_TRUE(m.map(low.pidfd, buffers).is_ok());
  char* in_low = m.local(0x10000, 4096);
  char* in_high = m.local(0x40000 + 4096, 4096);
  ASSERT_NE(in_low, nullptr);
  ASSERT_NE(in_high, nullptr);
  // Each address reaches its own memfd: what is copied there is in the file.
  std::memcpy(in_low, "low", 3);
  std::memcpy(in_high, "high", 4);
  char got[4] = {};
  ASSERT_EQ(::pread(low.fd, got, 3, 0), 3);
  EXPECT_EQ(std::string(got, 3), "low");
  ASSERT_EQ(::pread(high.fd, got, 4, 4096), 4);
  EXPECT_EQ(std::string(got, 4), "high");
  EXPECT_EQ(m.local(0x10000 + 4096, 1), nullptr);  // the gap
  EXPECT_EQ(m.local(0x0fff0, 32), nullptr);        // starts below the first
  EXPECT_EQ(m.local(0x40000 + 8192, 1), nullptr);  // past the last
}

}  // namespace
}  // namespace pdkv::backends::mooncake

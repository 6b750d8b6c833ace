// The same-host path's fall-back: when the kernel will not let us touch the
// peer's memory (here the peer is non-dumpable and this thread has dropped
// CAP_SYS_PTRACE, as an unprivileged process would lack it), the backend says
// so in one log line and moves the bytes over TCP instead; with
// same_host=require it refuses to connect, naming the reason. And what auto
// staging is told a write from a peer costs, by the path it comes by.
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <future>

#include "pdkv/transport.h"
#include "segment.h"
#include "support/child_process.h"
#include "support/transport_pair.h"

namespace pdkv {
namespace {

constexpr size_t kPeerBytes = 1 << 20;

// Drops CAP_SYS_PTRACE from the calling thread (and the threads it starts).
bool drop_ptrace_capability() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capget, &header, data) != 0) return false;
  const uint32_t bit = 1u << CAP_SYS_PTRACE;  // < 32: in data[0]
  data[0].effective &= ~bit;
  data[0].permitted &= ~bit;
  data[0].inheritable &= ~bit;
  return syscall(SYS_capset, &header, data) == 0;
}

TEST(MooncakeSameHost, AWriteCostsWhatThePathItComesByCosts) {
  // The figures of docs/benchmarks.md: a same-host slice costs about what
  // copying 1 KiB does, one over TCP 256 KiB.
  constexpr uint64_t kSameHost = 1024, kTcp = 262144;
  auto peer = create_transport("mooncake", {}).value();
  const std::string here = peer->descriptor();
  auto moved = backends::mooncake::SegmentDescriptor::decode(here).value();
  moved.host_identity = "another boot id";
  const std::string elsewhere = moved.encode();

  auto automatic = create_transport("mooncake", {}).value();
  EXPECT_EQ(automatic->write_overhead_bytes_from(here), kSameHost);
  EXPECT_EQ(automatic->write_overhead_bytes_from(elsewhere), kTcp);
  EXPECT_EQ(automatic->write_overhead_bytes_from("no descriptor"), kTcp);
  auto off = create_transport("mooncake", {{"same_host", "off"}}).value();
  EXPECT_EQ(off->write_overhead_bytes_from(here), kTcp);
  auto require = create_transport("mooncake", {{"same_host", "require"}}).value();
  EXPECT_EQ(require->write_overhead_bytes_from(here), kSameHost);
}

TEST(MooncakeSameHost, APeerTheKernelGuardsIsReachedOverTcp) {
  testing::ChildProcess peer({PDKV_BACKEND_PEER, "mooncake", std::to_string(kPeerBytes)},
                             {{"PDKV_TEST_UNDUMPABLE", "1"}});
  const std::string desc = testing::from_hex(peer.read_line());
  ASSERT_FALSE(desc.empty()) << "the peer process printed no descriptor";

  // Everything on one thread without CAP_SYS_PTRACE; the transport's I/O
  // threads, started there, inherit that.
  std::async(std::launch::async, [&] {
    ASSERT_TRUE(drop_ptrace_capability()) << std::strerror(errno);
    ::testing::internal::CaptureStderr();
    auto t = create_transport("mooncake", {}).value();
    std::vector<uint8_t> mine(2 * kPeerBytes);
    for (size_t i = 0; i < kPeerBytes; ++i) mine[i] = static_cast<uint8_t>(i * 13 + 5);
    const RegionKey key = t->register_region({mine.data(), mine.size()}).value();
    auto connected = t->connect(desc);
    const std::string log = ::testing::internal::GetCapturedStderr();
    ASSERT_TRUE(connected.is_ok()) << connected.status().to_string();
    EXPECT_NE(log.find("same-host path unavailable"), std::string::npos) << log;
    EXPECT_NE(log.find("Operation not permitted"), std::string::npos) << log;
    EXPECT_NE(log.find("using TCP"), std::string::npos) << log;

    // Write 64 KiB of ours, then read back 128 KiB: ours, then the peer's own
    // pattern (byte i = i * 37 + 11, set by pdkv_backend_peer).
    auto w = t->write(*connected, std::vector<WriteOp>{{key, 0, 0, 0, 64 << 10}});
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    const BatchStatus ws = testing::wait_batch(*t, *w);
    ASSERT_EQ(ws.state, BatchState::kDone) << ws.error.to_string();
    auto r = t->read(*connected, std::vector<ReadOp>{{key, kPeerBytes, 0, 0, 128 << 10}});
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    const BatchStatus rs = testing::wait_batch(*t, *r);
    ASSERT_EQ(rs.state, BatchState::kDone) << rs.error.to_string();
    for (size_t i = 0; i < (128 << 10); ++i) {
      const uint8_t expected =
          i < (64 << 10) ? static_cast<uint8_t>(i * 13 + 5) : static_cast<uint8_t>(i * 37 + 11);
      ASSERT_EQ(mine[kPeerBytes + i], expected) << "byte " << i;
    }

    // same_host=require: no silent fall-back.
    auto strict = create_transport("mooncake", {{"same_host", "require"}}).value();
    auto refused = strict->connect(desc);
    EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(refused.status().message().find("Operation not permitted"), std::string::npos)
        << refused.status().message();
  }).get();
}

}  // namespace
}  // namespace pdkv

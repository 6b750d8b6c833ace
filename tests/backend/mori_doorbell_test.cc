// mori's doorbells (peer_doorbell.h): an engine's descriptor names the
// eventfd that wakes its progress thread; a peer on this host whose process
// it proved (start time) takes it and rings it after each burst it posted.
// A number that names no eventfd is never written to, and a peer without a
// doorbell is still heard (its target polls). The test processes' own
// eventfds and pipes are the oracles: what a ring wrote is read back here.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "io_engine.h"
#include "mori_test_support.h"
#include "peer_doorbell.h"
#include "support/poll.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

namespace pdkv::backends::mori {
namespace {

using namespace std::chrono_literals;

// A file descriptor of this test, closed with it.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

int own_pidfd() { return static_cast<int>(::syscall(SYS_pidfd_open, ::getpid(), 0)); }

TEST(MoriDoorbell, ARingIsReadFromTheEventfdItWasTakenFrom) {
  Fd pidfd(own_pidfd());
  ASSERT_GE(pidfd.fd, 0) << std::strerror(errno);
  Fd bell_fd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  auto bell = PeerDoorbell::take(pidfd.fd, bell_fd.fd);
  ASSERT_TRUE(bell.is_ok()) << bell.status().to_string();
  (*bell)->ring();
  (*bell)->ring();
  uint64_t count = 0;
  ASSERT_EQ(::read(bell_fd.fd, &count, sizeof count), static_cast<ssize_t>(sizeof count));
  EXPECT_EQ(count, 2u);
}

TEST(MoriDoorbell, ANumberThatNamesNoEventfdIsRefusedByNumber) {
  Fd pidfd(own_pidfd());
  ASSERT_GE(pidfd.fd, 0) << std::strerror(errno);
  int ends[2];
  ASSERT_EQ(::pipe2(ends, O_NONBLOCK | O_CLOEXEC), 0);
  Fd read_end(ends[0]), write_end(ends[1]);
  auto pipe_bell = PeerDoorbell::take(pidfd.fd, write_end.fd);
  ASSERT_FALSE(pipe_bell.is_ok());
  EXPECT_EQ(pipe_bell.status().code(), StatusCode::kInvalidArgument);
  const std::string number = std::to_string(write_end.fd);
  EXPECT_NE(pipe_bell.status().message().find("doorbell " + number + " is no eventfd"),
            std::string::npos)
      << pipe_bell.status().message();

  // A number open in no process of ours: the take itself fails, by number.
  const int unused = 1 << 20;
  auto missing = PeerDoorbell::take(pidfd.fd, unused);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("doorbell " + std::to_string(unused)),
            std::string::npos)
      << missing.status().message();
}

TEST(MoriDoorbell, TheDescriptorCarriesTheDoorbellAndRefusesANumberNoFdCanHave) {
  auto e = IoEngine::create(config("e", "shm")).value();
  EXPECT_GE(e->desc().doorbell, 0);
  EngineDesc marked = e->desc();
  marked.doorbell = 0x7abcdef1;  // a number to find in the blob
  std::string blob = encode(marked, {});
  EngineDesc desc;
  std::vector<MemoryDesc> memory;
  ASSERT_TRUE(decode(blob, desc, memory).is_ok());
  EXPECT_EQ(desc.doorbell, 0x7abcdef1);
  marked.doorbell = -1;
  ASSERT_TRUE(decode(encode(marked, {}), desc, memory).is_ok());
  EXPECT_EQ(desc.doorbell, -1);

  const uint64_t field = 0x7abcdef1;
  const size_t at = blob.find(std::string(reinterpret_cast<const char*>(&field), 8));
  ASSERT_NE(at, std::string::npos);
  const uint64_t huge = uint64_t{1} << 40;
  std::memcpy(blob.data() + at, &huge, 8);
  const Status refused = decode(blob, desc, memory);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("doorbell 1099511627776"), std::string::npos)
      << refused.message();
}

// Two engines over shm; the sender knows the receiver by `receiver_desc`.
// Sends one message and returns what the receiver took within 10 s.
std::vector<std::string> send_one(IoEngine& sender, IoEngine& receiver,
                                  const EngineDesc& receiver_desc) {
  EXPECT_TRUE(sender.register_remote_engine(receiver_desc).is_ok());
  EXPECT_TRUE(sender.send_after(receiver_desc.key, {}, "hello").is_ok());
  std::vector<std::string> got;
  testing::poll_until(
      [&] {
        for (auto& m : receiver.take_messages()) got.push_back(std::move(m));
        return !got.empty();
      },
      10s);
  return got;
}

// The receiver's descriptor names an eventfd of the test's instead of its
// own (the same process: its start time holds), so that the rings are read
// here rather than by the receiver's thread.
TEST(MoriDoorbell, ASenderOnThisHostRingsAfterPosting) {
  auto sender = IoEngine::create(config("sender", "shm")).value();
  auto receiver = IoEngine::create(config("receiver", "shm")).value();
  Fd bell(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  EngineDesc desc = receiver->desc();
  desc.doorbell = bell.fd;
  EXPECT_EQ(send_one(*sender, *receiver, desc), std::vector<std::string>{"hello"});
  uint64_t rings = 0;
  ASSERT_EQ(::read(bell.fd, &rings, sizeof rings), static_cast<ssize_t>(sizeof rings));
  EXPECT_GE(rings, 1u);
  EXPECT_EQ(sender->rung_doorbells(), rings);
  EXPECT_EQ(receiver->rung_doorbells(), 0u);  // it posted nothing
}

// A receiver whose doorbell is not taken (none named; another process's
// start time) is rung by nobody, and hears the message all the same.
TEST(MoriDoorbell, AReceiverWithoutADoorbellIsStillHeard) {
  for (const bool reused_pid : {false, true}) {
    SCOPED_TRACE(reused_pid ? "a reused pid" : "no doorbell named");
    auto sender = IoEngine::create(config("sender", "shm")).value();
    auto receiver = IoEngine::create(config("receiver", "shm")).value();
    EngineDesc desc = receiver->desc();
    if (reused_pid) {
      desc.start_time += 1;
    } else {
      desc.doorbell = -1;
    }
    EXPECT_EQ(send_one(*sender, *receiver, desc), std::vector<std::string>{"hello"});
    EXPECT_EQ(sender->rung_doorbells(), 0u);
  }
}

// A descriptor that names a pipe as its doorbell: the sender takes no
// doorbell, writes nothing into the pipe, and the message still arrives.
TEST(MoriDoorbell, ADoorbellThatIsNoEventfdIsNeverWritten) {
  auto sender = IoEngine::create(config("sender", "shm")).value();
  auto receiver = IoEngine::create(config("receiver", "shm")).value();
  int ends[2];
  ASSERT_EQ(::pipe2(ends, O_NONBLOCK | O_CLOEXEC), 0);
  Fd read_end(ends[0]), write_end(ends[1]);
  EngineDesc desc = receiver->desc();
  desc.doorbell = write_end.fd;
  EXPECT_EQ(send_one(*sender, *receiver, desc), std::vector<std::string>{"hello"});
  EXPECT_EQ(sender->rung_doorbells(), 0u);
  char byte;
  EXPECT_EQ(::read(read_end.fd, &byte, 1), -1);
  EXPECT_EQ(errno, EAGAIN);
}

}  // namespace
}  // namespace pdkv::backends::mori

// mori's doorbells (peer_doorbell.h): an engine's descriptor names the
// eventfd that wakes its progress thread, and its eventfd-id; a peer on
// this host whose process it proved (start time) takes it and rings it
// after each burst it posted. A number that names no eventfd, another
// eventfd than described, or a blocking one is never written to, and a
// peer without a doorbell is still heard (its target polls). The test
// process's own eventfds and pipes are the oracles: what a ring wrote is
// read back here.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "io_engine.h"
#include "mori_test_support.h"
#include "peer_doorbell.h"
#include "peer_process.h"
#include "support/poll.h"

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

size_t open_fds() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

TEST(MoriDoorbell, ARingIsReadFromTheEventfdItWasTakenFrom) {
  const PeerProcess self(::getpid());
  ASSERT_GE(self.fd(), 0) << std::strerror(errno);
  Fd bell_fd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  const uint64_t id = PeerDoorbell::id_of(bell_fd.fd);
  ASSERT_NE(id, 0u) << "this kernel gives eventfds no id (Linux 5.16 and later do)";
  auto bell = PeerDoorbell::take(self.fd(), bell_fd.fd, id);
  ASSERT_TRUE(bell.is_ok()) << bell.status().to_string();
  (*bell)->ring();
  (*bell)->ring();
  uint64_t count = 0;
  ASSERT_EQ(::read(bell_fd.fd, &count, sizeof count), static_cast<ssize_t>(sizeof count));
  EXPECT_EQ(count, 2u);

  // An engine's own doorbell, as its descriptor names it, is taken too.
  auto e = IoEngine::create(config("e", "shm")).value();
  EXPECT_TRUE(PeerDoorbell::take(self.fd(), e->desc().doorbell, e->desc().doorbell_id).is_ok());
}

// Each refusal names the number and why, and leaves no descriptor open.
TEST(MoriDoorbell, WhatIsNotTheDescribedNonBlockingEventfdIsRefusedByNumber) {
  const PeerProcess self(::getpid());
  ASSERT_GE(self.fd(), 0) << std::strerror(errno);
  int ends[2];
  ASSERT_EQ(::pipe2(ends, O_NONBLOCK | O_CLOEXEC), 0);
  Fd read_end(ends[0]), write_end(ends[1]);
  Fd described(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)), other(eventfd(0, EFD_NONBLOCK));
  Fd blocking(eventfd(0, EFD_CLOEXEC));
  const uint64_t id = PeerDoorbell::id_of(described.fd);
  ASSERT_NE(id, 0u);
  const size_t fds_before = open_fds();
  const auto refusal = [&](int number, uint64_t with_id) {
    auto taken = PeerDoorbell::take(self.fd(), number, with_id);
    EXPECT_FALSE(taken.is_ok());
    return taken.is_ok() ? std::string() : taken.status().message();
  };
  const auto n = [](int fd) { return std::to_string(fd); };
  EXPECT_NE(refusal(write_end.fd, id).find("doorbell " + n(write_end.fd) + " is no eventfd"),
            std::string::npos);
  EXPECT_NE(refusal(other.fd, id)
                .find("doorbell " + n(other.fd) + " is eventfd " +
                      std::to_string(PeerDoorbell::id_of(other.fd)) + ", not the eventfd " +
                      std::to_string(id)),
            std::string::npos);
  EXPECT_NE(refusal(described.fd, 0).find("not the eventfd 0"), std::string::npos);
  EXPECT_NE(refusal(blocking.fd, PeerDoorbell::id_of(blocking.fd))
                .find("doorbell " + n(blocking.fd) + " would block"),
            std::string::npos);
  const int unused = 1 << 20;  // open in no process of ours: the take itself fails
  EXPECT_NE(refusal(unused, id).find("doorbell " + n(unused)), std::string::npos);
  EXPECT_EQ(open_fds(), fds_before);
}

TEST(MoriDoorbell, TheDescriptorCarriesTheDoorbellAndRefusesANumberNoFdCanHave) {
  auto e = IoEngine::create(config("e", "shm")).value();
  EXPECT_GE(e->desc().doorbell, 0);
  EngineDesc marked = e->desc();
  EXPECT_NE(e->desc().doorbell_id, 0u);
  marked.doorbell = 0x7abcdef1;  // a number to find in the blob
  marked.doorbell_id = 0x5eed;
  std::string blob = encode(marked, {});
  EngineDesc desc;
  std::vector<MemoryDesc> memory;
  ASSERT_TRUE(decode(blob, desc, memory).is_ok());
  EXPECT_EQ(desc.doorbell, 0x7abcdef1);
  EXPECT_EQ(desc.doorbell_id, 0x5eedu);
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

// The receiver's descriptor as a peer has it: encoded and decoded.
TEST(MoriDoorbell, ASenderOnThisHostRingsAfterPosting) {
  auto sender = IoEngine::create(config("sender", "shm")).value();
  auto receiver = IoEngine::create(config("receiver", "shm")).value();
  EngineDesc desc;
  std::vector<MemoryDesc> memory;
  ASSERT_TRUE(decode(encode(receiver->desc(), {}), desc, memory).is_ok());
  EXPECT_EQ(send_one(*sender, *receiver, desc), std::vector<std::string>{"hello"});
  // The ring follows the post, so the message may be read first.
  EXPECT_TRUE(testing::poll_until([&] { return sender->rung_doorbells() >= 1; }, 10s));
  EXPECT_EQ(receiver->rung_doorbells(), 0u);  // it posted nothing
}

// The receiver's descriptor names an eventfd of the test's instead of its
// own (the same process: its start time holds), so that the rings are read
// here rather than by the receiver's thread.
TEST(MoriDoorbell, EachRingIsOneWriteOfOneToTheDoorbell) {
  auto sender = IoEngine::create(config("sender", "shm")).value();
  auto receiver = IoEngine::create(config("receiver", "shm")).value();
  Fd bell(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  EngineDesc desc = receiver->desc();
  desc.doorbell = bell.fd;
  desc.doorbell_id = PeerDoorbell::id_of(bell.fd);
  EXPECT_EQ(send_one(*sender, *receiver, desc), std::vector<std::string>{"hello"});
  EXPECT_TRUE(testing::poll_until([&] { return sender->rung_doorbells() >= 1; }, 10s));
  uint64_t rings = 0;
  ASSERT_EQ(::read(bell.fd, &rings, sizeof rings), static_cast<ssize_t>(sizeof rings));
  EXPECT_EQ(rings, sender->rung_doorbells());
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

// Descriptors that name a pipe, or another eventfd of the receiver's
// process than its own, as its doorbell: the sender takes no doorbell,
// writes nothing into either, and the message still arrives.
TEST(MoriDoorbell, ADoorbellThatIsNotTheDescribedEventfdIsNeverWritten) {
  int ends[2];
  ASSERT_EQ(::pipe2(ends, O_NONBLOCK | O_CLOEXEC), 0);
  Fd read_end(ends[0]), write_end(ends[1]);
  Fd other(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  for (const int named : {write_end.fd, other.fd}) {
    auto sender = IoEngine::create(config("sender", "shm")).value();
    auto receiver = IoEngine::create(config("receiver", "shm")).value();
    EngineDesc desc = receiver->desc();
    desc.doorbell = named;  // with the receiver's own eventfd-id
    EXPECT_EQ(send_one(*sender, *receiver, desc), std::vector<std::string>{"hello"});
    EXPECT_EQ(sender->rung_doorbells(), 0u);
  }
  char byte;
  const ssize_t from_pipe = ::read(read_end.fd, &byte, 1);
  const int pipe_errno = errno;
  EXPECT_EQ(from_pipe, -1);
  EXPECT_EQ(pipe_errno, EAGAIN);
  uint64_t count = 0;
  const ssize_t from_other = ::read(other.fd, &count, sizeof count);
  const int other_errno = errno;
  EXPECT_EQ(from_other, -1);  // never rung: nothing to read
  EXPECT_EQ(other_errno, EAGAIN);
}

}  // namespace
}  // namespace pdkv::backends::mori

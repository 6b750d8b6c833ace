// The mooncake reader receives a stream of page-sized WRITE payloads
// straight into their destination: after the first read, no payload byte
// passes through its buffer. Frames are built here from wire.h's layout
// (not by the backend's writer) and sent by a thread over a socket pair.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <thread>
#include <vector>

#include "frame_io.h"
#include "wire.h"

namespace pdkv::backends::mooncake {
namespace {

constexpr uint64_t kFrames = 64;
constexpr uint64_t kPayload = 32 << 10;  // one llama3-8b page of one layer's K
constexpr uint64_t kReaderBuffer = 256 << 10;

char pattern(uint64_t frame, uint64_t i) { return static_cast<char>((frame * 131 + i * 7) & 0xff); }

void send_all(int fd, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    ASSERT_GT(n, 0) << std::strerror(errno);
    sent += static_cast<size_t>(n);
  }
}

TEST(MooncakeFrameReader, PagePayloadsAreReceivedStraightIntoTheirDestination) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
  const int writer_fd = fds[1];
  ASSERT_EQ(::fcntl(writer_fd, F_SETFL, 0), 0);  // the sender blocks
  std::vector<char> target(kFrames * kPayload, 0);

  std::thread sender([&] {
    for (uint64_t f = 0; f < kFrames; ++f) {
      const wire::FrameHeader h =
          wire::frame(wire::FrameType::kWrite, f + 1, f * kPayload, kPayload, kPayload);
      std::string frame(reinterpret_cast<const char*>(&h), sizeof h);
      for (uint64_t i = 0; i < kPayload; ++i) frame.push_back(pattern(f, i));
      send_all(writer_fd, frame);
    }
    ::shutdown(writer_fd, SHUT_WR);
  });
  // On every way out, an early ASSERT included: the reader's end goes first,
  // so that a sender blocked on a full socket returns and can be joined.
  struct EndSender {
    std::thread& sender;
    int* fds;
    ~EndSender() {
      ::shutdown(fds[0], SHUT_RDWR);
      sender.join();
      ::close(fds[0]);
      ::close(fds[1]);
    }
  } end_sender{sender, fds};

  FrameReader reader;
  uint64_t frames = 0, received = 0;
  const auto on_header = [&](const wire::FrameHeader& h, PayloadSink& sink) {
    EXPECT_EQ(h.type, static_cast<uint16_t>(wire::FrameType::kWrite));
    EXPECT_LE(h.addr + h.length, target.size());
    sink.dst = target.data() + h.addr;  // addr is an offset into the target here
    return Status::ok();
  };
  const auto on_frame = [&](const wire::FrameHeader& h, std::string&) {
    EXPECT_EQ(h.seq, frames + 1) << "frames out of order";
    ++frames;
    return Status::ok();
  };
  IoOutcome outcome = IoOutcome::kAgain;
  while (outcome == IoOutcome::kAgain) {
    pollfd p{fds[0], POLLIN, 0};
    ASSERT_GT(::poll(&p, 1, 10'000), 0) << "no bytes for 10 s";
    uint64_t bytes = 0;
    outcome = reader.pump(fds[0], on_header, on_frame, bytes);
    received += bytes;
  }

  ASSERT_EQ(outcome, IoOutcome::kClosed) << reader.error().message();
  EXPECT_EQ(frames, kFrames);
  EXPECT_EQ(received, kFrames * (sizeof(wire::FrameHeader) + kPayload));
  for (uint64_t f = 0; f < kFrames; ++f) {
    for (uint64_t i = 0; i < kPayload; ++i) {
      ASSERT_EQ(target[f * kPayload + i], pattern(f, i)) << "frame " << f << " byte " << i;
    }
  }
  // Only the first read (into the empty buffer, before any frame was seen)
  // may copy payload; every later payload byte goes straight to the target.
  const uint64_t copied = kFrames * kPayload - reader.direct_bytes();
  EXPECT_LE(copied, kReaderBuffer) << "of " << kFrames * kPayload << " payload bytes";
}

std::string write_frame(uint64_t seq, uint64_t offset, uint64_t length) {
  const wire::FrameHeader h = wire::frame(wire::FrameType::kWrite, seq, offset, length, length);
  std::string frame(reinterpret_cast<const char*>(&h), sizeof h);
  for (uint64_t i = 0; i < length; ++i) frame.push_back(pattern(seq, i));
  return frame;
}

TEST(MooncakeFrameReader, TheRestOfALargePayloadThatCameInPartsGoesDirectToo) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
  std::vector<char> target(3 * kPayload, 0);
  const std::string second = write_frame(2, kPayload, kPayload);
  const size_t cut = sizeof(wire::FrameHeader) + kPayload - 2048;  // 2 KiB of it come later

  FrameReader reader;
  uint64_t frames = 0;
  const auto on_header = [&](const wire::FrameHeader& h, PayloadSink& sink) {
    EXPECT_LE(h.addr + h.length, target.size());
    sink.dst = target.data() + h.addr;
    return Status::ok();
  };
  const auto on_frame = [&](const wire::FrameHeader&, std::string&) {
    ++frames;
    return Status::ok();
  };
  uint64_t bytes = 0;
  // Frame 1 whole and frame 2 but its last 2 KiB: the first read goes
  // through the buffer (no frame was seen yet).
  send_all(fds[1], write_frame(1, 0, kPayload) + second.substr(0, cut));
  ASSERT_EQ(reader.pump(fds[0], on_header, on_frame, bytes), IoOutcome::kAgain);
  ASSERT_EQ(frames, 1u);
  const uint64_t direct_before = reader.direct_bytes();
  // The last 2 KiB of frame 2 and frame 3 whole: both straight to the target.
  send_all(fds[1], second.substr(cut) + write_frame(3, 2 * kPayload, kPayload));
  ASSERT_EQ(reader.pump(fds[0], on_header, on_frame, bytes), IoOutcome::kAgain);
  ::close(fds[0]);
  ::close(fds[1]);
  ASSERT_EQ(frames, 3u);
  EXPECT_EQ(reader.direct_bytes() - direct_before, 2048 + kPayload);
  for (uint64_t f = 0; f < 3; ++f) {
    for (uint64_t i = 0; i < kPayload; ++i) {
      ASSERT_EQ(target[f * kPayload + i], pattern(f + 1, i)) << "frame " << f + 1 << " byte " << i;
    }
  }
}

}  // namespace
}  // namespace pdkv::backends::mooncake

// Nobody writes into a mooncake segment uninvited. A raw TCP client speaks
// the wire format (built here from wire.h's layout, not by the backend's own
// writer) and breaks one rule per test; the target must refuse, close the
// connection, leave its memory untouched, and keep serving its real peers.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <random>

#include "pdkv/transport.h"
#include "segment.h"
#include "support/mooncake_raw.h"
#include "support/transport_pair.h"
#include "wire.h"

namespace pdkv::backends::mooncake {
namespace {

using namespace std::chrono_literals;
using wire::FrameType;

std::string header(FrameType type, uint64_t seq, uint64_t addr, uint64_t length, uint64_t payload) {
  const wire::FrameHeader h = wire::frame(type, seq, addr, length, payload);
  return std::string(reinterpret_cast<const char*>(&h), sizeof h);
}

// Opens a fresh connection to `address`, reads the target's CHALLENGE, sends
// `bytes(nonce)`, half-closes, and returns everything else the target sent
// until it closed (bounded by a 5 s receive timeout).
std::string exchange(const std::string& address,
                     const std::function<std::string(const std::string& nonce)>& bytes,
                     bool* closed) {
  const SocketAddress a = parse_address(address, true).value();
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_EQ(::connect(fd, a.get(), a.length), 0) << std::strerror(errno);
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  const std::string challenge = testing::read_challenge(fd);
  EXPECT_EQ(challenge.size(), sizeof(wire::FrameHeader) + wire::kNonceBytes)
      << "no CHALLENGE from the target";
  wire::FrameHeader h;
  std::memcpy(&h, challenge.data(), sizeof h);
  EXPECT_EQ(h.type, static_cast<uint16_t>(FrameType::kChallenge));
  EXPECT_EQ(h.payload, wire::kNonceBytes);
  const std::string out = bytes(challenge.substr(sizeof h));
  size_t sent = 0;
  ssize_t n;
  while (sent < out.size()) {
    n = ::send(fd, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the target may close before taking everything
    sent += static_cast<size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  std::string reply;
  char buf[4096];
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) reply.append(buf, static_cast<size_t>(n));
  *closed = n == 0 || (n < 0 && errno == ECONNRESET);
  ::close(fd);
  return reply;
}

// The frame types of a reply, in order, and the text of a REFUSE.
std::vector<FrameType> frames_of(const std::string& reply, std::string* refusal) {
  std::vector<FrameType> types;
  size_t at = 0;
  while (reply.size() - at >= sizeof(wire::FrameHeader)) {
    wire::FrameHeader h;
    std::memcpy(&h, reply.data() + at, sizeof h);
    at += sizeof h;
    types.push_back(static_cast<FrameType>(h.type));
    if (h.type == static_cast<uint16_t>(FrameType::kRefuse)) *refusal = reply.substr(at, h.payload);
    at += h.payload;
  }
  return types;
}

class MooncakeSecurity : public ::testing::Test {
 protected:
  void SetUp() override {
    target_ = create_transport("mooncake", {{"same_host", "off"}}).value();
    memory_.assign(1 << 20, 0xEE);
    ASSERT_TRUE(target_->register_region({memory_.data(), memory_.size()}).is_ok());
    target_->release_to_peers();
    desc_ = SegmentDescriptor::decode(target_->descriptor()).value();
    base_ = desc_.buffers.at(0).base;
  }
  void TearDown() override {
    // The target still serves a real peer, byte for byte.
    auto sender = create_transport("mooncake", {{"same_host", "off"}}).value();
    std::vector<uint8_t> src(4096);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
    const RegionKey key = sender->register_region({src.data(), src.size()}).value();
    const PeerId peer = sender->connect(target_->descriptor()).value();
    const BatchId batch =
        sender->write(peer, std::vector<WriteOp>{{key, 0, 0, 512 << 10, 4096}}).value();
    const BatchStatus st = testing::wait_batch(*sender, batch, 10s);
    ASSERT_EQ(st.state, BatchState::kDone) << st.error.to_string();
    target_->acquire_remote_writes();
    EXPECT_EQ(std::memcmp(memory_.data() + (512 << 10), src.data(), src.size()), 0);
  }
  static std::string hello(const std::string& secret, const std::string& challenge) {
    return testing::hello_answering(secret, challenge, "test");
  }
  // Whether the first `n` bytes of the target's memory are still 0xEE.
  bool untouched(size_t from, size_t n) {
    target_->acquire_remote_writes();
    return std::all_of(memory_.begin() + from, memory_.begin() + from + n,
                       [](uint8_t b) { return b == 0xEE; });
  }

  std::vector<uint8_t> memory_;  // outlives the transport
  std::unique_ptr<Transport> target_;
  SegmentDescriptor desc_;
  uint64_t base_ = 0;
};

// The positive control: these hand-built frames are what the target accepts,
// so the refusals below are for the rule each one breaks.
TEST_F(MooncakeSecurity, AWellFormedWriteWithTheSecretLands) {
  bool closed = false;
  const std::string reply = exchange(
      desc_.rails[0],
      [&](const std::string& c) {
        return hello(desc_.secret, c) + header(FrameType::kWrite, 1, base_ + 100, 5, 5) + "hello";
      },
      &closed);
  std::string refusal;
  EXPECT_EQ(frames_of(reply, &refusal),
            (std::vector<FrameType>{FrameType::kHelloOk, FrameType::kAck}));
  target_->acquire_remote_writes();
  EXPECT_EQ(std::memcmp(memory_.data() + 100, "hello", 5), 0);
}

TEST_F(MooncakeSecurity, AWrongSecretIsRefused) {
  bool closed = false;
  std::string wrong = desc_.secret;
  wrong[7] ^= 1;
  const std::string reply = exchange(
      desc_.rails[0],
      [&](const std::string& c) {
        return hello(wrong, c) + header(FrameType::kWrite, 1, base_, 5, 5) + "evil!";
      },
      &closed);
  std::string refusal;
  EXPECT_EQ(frames_of(reply, &refusal), std::vector<FrameType>{FrameType::kRefuse});
  EXPECT_EQ(refusal, "HELLO does not answer this connection's challenge under the session secret");
  EXPECT_TRUE(closed);
  EXPECT_TRUE(untouched(0, 64));
}

// A HELLO captured on one connection opens no other: it answers that
// connection's challenge only. And the secret itself never crosses the wire.
TEST_F(MooncakeSecurity, AReplayedHelloIsRefused) {
  bool closed = false;
  std::string captured;
  std::string refusal;
  const std::string first = exchange(
      desc_.rails[0],
      [&](const std::string& c) {
        captured = hello(desc_.secret, c);
        return captured;
      },
      &closed);
  EXPECT_EQ(frames_of(first, &refusal), std::vector<FrameType>{FrameType::kHelloOk});
  EXPECT_EQ(captured.find(desc_.secret), std::string::npos);
  const std::string replayed = exchange(
      desc_.rails[0],
      [&](const std::string&) {
        return captured + header(FrameType::kWrite, 1, base_, 5, 5) + "evil!";
      },
      &closed);
  EXPECT_EQ(frames_of(replayed, &refusal), std::vector<FrameType>{FrameType::kRefuse});
  EXPECT_EQ(refusal, "HELLO does not answer this connection's challenge under the session secret");
  EXPECT_TRUE(closed);
  EXPECT_TRUE(untouched(0, 64));
}

TEST_F(MooncakeSecurity, AWriteWithoutHelloIsRefused) {
  bool closed = false;
  const std::string reply = exchange(
      desc_.rails[0],
      [&](const std::string&) { return header(FrameType::kWrite, 1, base_, 5, 5) + "evil!"; },
      &closed);
  std::string refusal;
  EXPECT_EQ(frames_of(reply, &refusal), std::vector<FrameType>{FrameType::kRefuse});
  EXPECT_NE(refusal.find("expected HELLO answering the challenge first, got WRITE"),
            std::string::npos)
      << refusal;
  EXPECT_TRUE(closed);
  EXPECT_TRUE(untouched(0, 64));
}

TEST_F(MooncakeSecurity, AWriteOutsideTheRegisteredBuffersIsRefused) {
  bool closed = false;
  // Straddles the end of the buffer by 10 bytes.
  const uint64_t addr = base_ + memory_.size() - 90;
  const std::string reply = exchange(
      desc_.rails[0],
      [&](const std::string& c) {
        return hello(desc_.secret, c) + header(FrameType::kWrite, 1, addr, 100, 100) +
               std::string(100, 'x');
      },
      &closed);
  std::string refusal;
  EXPECT_EQ(frames_of(reply, &refusal),
            (std::vector<FrameType>{FrameType::kHelloOk, FrameType::kRefuse}));
  EXPECT_NE(refusal.find("WRITE of 100 bytes at"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("outside every registered buffer"), std::string::npos) << refusal;
  EXPECT_TRUE(closed);
  EXPECT_TRUE(untouched(memory_.size() - 90, 90));
  // A read outside is refused as well.
  const std::string read_reply = exchange(
      desc_.rails[0],
      [&](const std::string& c) {
        return hello(desc_.secret, c) + header(FrameType::kRead, 1, base_ - 4096, 64, 0);
      },
      &closed);
  EXPECT_EQ(frames_of(read_reply, &refusal),
            (std::vector<FrameType>{FrameType::kHelloOk, FrameType::kRefuse}));
  EXPECT_NE(refusal.find("READ of 64 bytes"), std::string::npos) << refusal;
}

TEST_F(MooncakeSecurity, ATruncatedSliceIsNotAcknowledged) {
  bool closed = false;
  // Claims 1000 bytes, sends 10, then closes.
  const std::string reply = exchange(
      desc_.rails[0],
      [&](const std::string& c) {
        return hello(desc_.secret, c) + header(FrameType::kWrite, 1, base_, 1000, 1000) +
               "0123456789";
      },
      &closed);
  std::string refusal;
  EXPECT_EQ(frames_of(reply, &refusal), std::vector<FrameType>{FrameType::kHelloOk});  // no ACK
  EXPECT_TRUE(closed);
  EXPECT_TRUE(untouched(10, 990));
}

TEST_F(MooncakeSecurity, RandomBytesAreRefused) {
  std::mt19937_64 rng(11);
  std::string noise(64 << 10, '\0');
  for (auto& c : noise) c = static_cast<char>(rng());
  bool closed = false;
  const std::string reply = exchange(
      desc_.rails[0], [&](const std::string&) { return noise; }, &closed);
  std::string refusal;
  EXPECT_EQ(frames_of(reply, &refusal), std::vector<FrameType>{FrameType::kRefuse});
  EXPECT_NE(refusal.find("not a pdkv mooncake frame"), std::string::npos) << refusal;
  EXPECT_TRUE(closed);
  EXPECT_TRUE(untouched(0, memory_.size()));
}

TEST_F(MooncakeSecurity, AnOversizedHelloOrFrameIsRefused) {
  bool closed = false;
  std::string refusal;
  // A HELLO claiming a gigabyte: refused on its header, nothing allocated.
  std::string reply = exchange(
      desc_.rails[0],
      [&](const std::string&) { return header(FrameType::kHello, 0, 0, 0, 1ull << 30); }, &closed);
  EXPECT_EQ(frames_of(reply, &refusal), std::vector<FrameType>{FrameType::kRefuse});
  EXPECT_TRUE(closed);
  // A WRITE claiming more than a slice may carry.
  reply = exchange(
      desc_.rails[0],
      [&](const std::string& c) {
        return hello(desc_.secret, c) + header(FrameType::kWrite, 1, base_, 1ull << 40, 1ull << 40);
      },
      &closed);
  EXPECT_EQ(frames_of(reply, &refusal),
            (std::vector<FrameType>{FrameType::kHelloOk, FrameType::kRefuse}));
  EXPECT_NE(refusal.find("malformed WRITE"), std::string::npos) << refusal;
  EXPECT_TRUE(untouched(0, memory_.size()));
}

}  // namespace
}  // namespace pdkv::backends::mooncake

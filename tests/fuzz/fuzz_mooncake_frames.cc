// mooncake's frame parsing at a live target: each input is sent on a fresh
// TCP connection after the target's CHALLENGE, with a valid HELLO first when
// the first byte is odd (so that WRITE, READ and NOTIFY parsing is reached).
// The target must refuse or apply, never crash; nothing may land outside its
// registered buffer (the bytes around it are checked), and every 1024 inputs
// a real peer's write must still land.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "pdkv/transport.h"
#include "segment.h"
#include "support/mooncake_raw.h"
#include "wire.h"

namespace {

using namespace pdkv;
using namespace pdkv::backends::mooncake;
constexpr size_t kGuard = 4096, kBuffer = 1 << 16;

struct Target {
  std::vector<uint8_t> memory = std::vector<uint8_t>(kGuard + kBuffer + kGuard, 0xEE);
  std::unique_ptr<Transport> transport;
  SegmentDescriptor desc;
};

Target& target() {
  static Target* t = [] {
    auto* t = new Target;
    t->transport = create_transport("mooncake", {{"same_host", "off"}}).value();
    (void)t->transport->register_region({t->memory.data() + kGuard, kBuffer}).value();
    t->transport->release_to_peers();
    t->desc = SegmentDescriptor::decode(t->transport->descriptor()).value();
    return t;
  }();
  return *t;
}

// connect(), finished when a signal (libFuzzer's timers) interrupts it: the
// connection goes on in the kernel, and is ready once writable.
bool connected(int fd, const SocketAddress& a) {
  if (::connect(fd, a.get(), a.length) == 0) return true;
  if (errno != EINTR) return false;
  pollfd p{fd, POLLOUT, 0};
  while (::poll(&p, 1, 5000) < 0 && errno == EINTR) {
  }
  int error = 0;
  socklen_t length = sizeof error;
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0 || error != 0) {
    errno = error != 0 ? error : errno;
    return false;
  }
  return (p.revents & POLLOUT) != 0;
}

void exchange(const Target& t, const std::string& bytes, bool with_hello) {
  const SocketAddress a = parse_address(t.desc.rails.at(0), true).value();
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  // Reset at close: hundreds of thousands of connections must not use up
  // the host's ports in TIME_WAIT.
  linger reset{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
  // The target closes first when it refuses a frame, so its side keeps each
  // connection in TIME_WAIT for a minute: at ~460 connections a second that
  // is every ephemeral port of one source address. Each connection comes
  // from the next of 62 500 loopback source addresses instead.
  static uint32_t next_source = 0;
  if (a.get()->sa_family == AF_INET) {
    const uint32_t n = next_source++ % (250 * 250);
    sockaddr_in source{};
    source.sin_family = AF_INET;
    source.sin_addr.s_addr =
        htonl((127u << 24) | (2u << 16) | ((n / 250 + 1) << 8) | (n % 250 + 1));
    (void)::bind(fd, reinterpret_cast<const sockaddr*>(&source), sizeof source);
  }
  if (!connected(fd, a)) {
    std::fprintf(stderr, "fuzz_mooncake_frames: connect to the target: %s\n", std::strerror(errno));
    __builtin_trap();  // the target is gone, or the host is out of ports
  }
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  const std::string challenge = testing::read_challenge(fd);
  const std::string nonce = challenge.substr(std::min(challenge.size(), sizeof(wire::FrameHeader)));
  const std::string out =
      (with_hello ? testing::hello_answering(t.desc.secret, nonce, "fuzz") : "") + bytes;
  ::send(fd, out.data(), out.size(), MSG_NOSIGNAL);
  ::shutdown(fd, SHUT_WR);
  char buf[4096];
  while (::recv(fd, buf, sizeof buf, 0) > 0) {
  }
  ::close(fd);
}

void check_alive(Target& t) {
  auto sender = create_transport("mooncake", {{"same_host", "off"}}).value();
  std::vector<uint8_t> src(256, 0x42);
  const RegionKey key = sender->register_region({src.data(), src.size()}).value();
  const PeerId peer = sender->connect(t.transport->descriptor()).value();
  const BatchId batch = sender->write(peer, std::vector<WriteOp>{{key, 0, 0, 0, 256}}).value();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  BatchStatus st;
  while ((st = sender->poll(batch)).state == BatchState::kInProgress) {
    if (std::chrono::steady_clock::now() > until) __builtin_trap();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // polling, not ordering
  }
  if (st.state != BatchState::kDone) __builtin_trap();
}

// Frame addresses in the input count from the registered buffer's start, so
// that the fuzzer reaches applied writes whatever ASLR chose.
std::string relocated(std::string bytes, uint64_t base) {
  size_t at = 0;
  while (bytes.size() - at >= sizeof(wire::FrameHeader)) {
    wire::FrameHeader h;
    std::memcpy(&h, bytes.data() + at, sizeof h);
    if (h.magic != wire::kMagic) break;
    h.addr += base;
    std::memcpy(bytes.data() + at, &h, sizeof h);
    at += sizeof h + std::min<uint64_t>(h.payload, bytes.size() - at - sizeof h);
  }
  return bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Target& t = target();
  std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 2) bytes = relocated(std::move(bytes), t.desc.buffers.at(0).base);
  exchange(t, bytes, data[0] & 1);
  t.transport->acquire_remote_writes();
  for (size_t i = 0; i < kGuard; ++i) {
    if (t.memory[i] != 0xEE || t.memory[kGuard + kBuffer + i] != 0xEE) __builtin_trap();
  }
  static uint64_t runs = 0;
  if (++runs % 1024 == 0) check_alive(t);
  return 0;
}

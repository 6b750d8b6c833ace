// The target side: accepting connections, checking that each one presents
// this segment's session secret (challenge-response) before anything else, and applying WRITE and
// READ frames only inside registered buffers. Whatever breaks a rule is
// refused with a reason, logged, and its connection closed; nothing a peer
// sends can do more than that.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "crypto.h"
#include "engine_impl.h"
#include "log.h"

namespace pdkv::backends::mooncake {
namespace {

constexpr auto kHandshakeTimeout = std::chrono::seconds(5);

std::string peer_address(int fd) {
  SocketAddress a;
  a.length = sizeof a.storage;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a.storage), &a.length) != 0) return "?";
  return format_address(a);
}

}  // namespace

Listener::~Listener() {
  if (fd_ >= 0) ::close(fd_);
}

void Listener::on_events(uint32_t) {
  while (true) {
    const int fd = ::accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        logger("mooncake")->warn("accept: {}", std::strerror(errno));
      }
      return;
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    LoopContext& loop = core_.pick_loop();
    TransferEngine::Impl& core = core_;
    loop.loop.post([&core, &loop, fd] {
      auto conn = std::make_unique<Inbound>(core, loop, fd, peer_address(fd));
      Inbound* raw = conn.get();
      loop.inbound.emplace(raw, std::move(conn));
      loop.loop.add(fd, EPOLLIN, raw);
      raw->start();
    });
  }
}

Inbound::Inbound(TransferEngine::Impl& core, LoopContext& loop, int fd, std::string from)
    : core_(core), loop_(loop), fd_(fd), from_(std::move(from)) {}

void Inbound::start() {
  auto nonce = crypto::random_bytes(wire::kNonceBytes);
  if (!nonce.is_ok()) return refuse(nonce.status());
  nonce_ = std::move(*nonce);
  writer_.push_owned(wire::frame(wire::FrameType::kChallenge, 0, 0, 0, nonce_.size()), nonce_);
  send_queued(false);
}

void Inbound::send_queued(bool then_close) {
  uint64_t bytes = 0;
  int error_number = 0;
  if (writer_.flush(fd_, bytes, error_number) == IoOutcome::kError) {
    logger("mooncake")->debug("connection from {}: send: {}", from_, std::strerror(error_number));
    return close();
  }
  if (then_close) return close();
  loop_.loop.modify(fd_, EPOLLIN | (writer_.empty() ? 0u : uint32_t{EPOLLOUT}), this);
}

Inbound::~Inbound() {
  if (fd_ >= 0) ::close(fd_);
}

void Inbound::close() {
  if (fd_ < 0) return;
  loop_.loop.remove(fd_);
  ::close(fd_);
  fd_ = -1;
  // Destroyed after this round of events: the loop may still hold a pointer.
  loop_.loop.post([loop = &loop_, self = this] { loop->inbound.erase(self); });
}

void Inbound::refuse(const Status& reason) {
  logger("mooncake")
      ->warn("segment {}: refused connection from {}{}: {}", core_.segment_name(), from_,
             peer_name_.empty() ? "" : " (" + peer_name_ + ")", reason.message());
  // Best effort: the reason fits any socket buffer that is not full.
  std::string why = reason.message().substr(0, wire::kMaxRefusePayload);
  const auto frame = wire::frame(wire::FrameType::kRefuse, 0, 0, 0, why.size());
  writer_.push_owned(frame, std::move(why));
  uint64_t bytes;
  int error_number;
  (void)writer_.flush(fd_, bytes, error_number);
  close();
}

bool Inbound::check_handshake(Clock::time_point now) {
  if (authenticated_ || fd_ < 0) return false;
  if (now - accepted_ < kHandshakeTimeout) return true;
  refuse(Status::deadline_exceeded("no HELLO within 5 s"));
  return false;
}

void Inbound::on_events(uint32_t events) {
  if (fd_ < 0) return;
  bool closed = false;
  if (events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
    uint64_t bytes = 0;
    const IoOutcome outcome = reader_.pump(
        fd_, [this](const auto& h, auto& sink) { return on_header(h, sink); },
        [this](const auto& h, auto& kept) { return on_frame(h, kept); }, bytes);
    if (outcome == IoOutcome::kError) {
      // The socket failed (the peer reset it, e.g. when it shut down): no
      // rule was broken, nothing to refuse.
      if (reader_.error().code() == StatusCode::kUnavailable) {
        logger("mooncake")->debug("connection from {}: {}", from_, reader_.error().message());
        return close();
      }
      return refuse(reader_.error());
    }
    if (outcome == IoOutcome::kClosed) {
      if (reader_.mid_frame()) {
        logger("mooncake")
            ->warn("segment {}: connection from {} closed in the middle of a frame",
                   core_.segment_name(), from_);
      }
      closed = true;  // the peer may only have half-closed: answer what it sent, then close
    }
  }
  if (ack_due_) {
    writer_.push_owned(wire::frame(wire::FrameType::kAck, last_applied_, 0, 0, 0), {});
    ack_due_ = false;
  }
  send_queued(closed);
}

Status Inbound::on_header(const wire::FrameHeader& h, PayloadSink& sink) {
  using wire::FrameType;
  const auto type = static_cast<FrameType>(h.type);
  if (!authenticated_) {
    if (type != FrameType::kHello || h.payload < wire::kNonceBytes + wire::kMacBytes ||
        h.payload > wire::kMaxHelloPayload) {
      return Status::failed_precondition(
          fmt::format("expected HELLO answering the challenge first, got {} with {} bytes",
                      wire::frame_type_name(h.type), h.payload));
    }
    sink.keep = true;
    return Status::ok();
  }
  if (type == FrameType::kNotify) {
    if (h.payload != h.length || h.payload > wire::kMaxNotifyPayload) {
      return Status::invalid_argument(
          fmt::format("NOTIFY of {} bytes ({} payload bytes)", h.length, h.payload));
    }
    sink.keep = true;
    return Status::ok();
  }
  if (type == FrameType::kWrite || type == FrameType::kRead) {
    const uint64_t expected_payload = type == FrameType::kWrite ? h.length : 0;
    if (h.payload != expected_payload || h.length > wire::kMaxSliceBytes) {
      return Status::invalid_argument(fmt::format("malformed {} of {} bytes ({} payload bytes)",
                                                  wire::frame_type_name(h.type), h.length,
                                                  h.payload));
    }
    if (!core_.local_contains(h.addr, h.length)) {
      return Status::out_of_range(
          fmt::format("{} of {} bytes at {:#x} is outside every registered buffer",
                      wire::frame_type_name(h.type), h.length, h.addr));
    }
    (void)core_.memory_order.load(std::memory_order_acquire);  // after our own accesses
    if (type == FrameType::kWrite) sink.dst = reinterpret_cast<char*>(h.addr);
    return Status::ok();
  }
  return Status::invalid_argument(
      fmt::format("unexpected {} frame (type {})", wire::frame_type_name(h.type), h.type));
}

Status Inbound::on_frame(const wire::FrameHeader& h, std::string& kept) {
  using wire::FrameType;
  switch (static_cast<FrameType>(h.type)) {
    case FrameType::kHello: {
      const std::string_view hello(kept);
      const std::string_view nonce = hello.substr(0, wire::kNonceBytes);
      const std::string_view name = hello.substr(wire::kNonceBytes + wire::kMacBytes);
      if (!crypto::equal(hello.substr(wire::kNonceBytes, wire::kMacBytes),
                         wire::hello_mac(core_.secret, nonce_, nonce, name))) {
        return Status::failed_precondition(
            "HELLO does not answer this connection's challenge under the session secret");
      }
      authenticated_ = true;
      peer_name_ = std::string(name);
      std::string proof = wire::hello_ok_mac(core_.secret, nonce, nonce_);
      const auto frame = wire::frame(wire::FrameType::kHelloOk, 0, 0, 0, proof.size());
      writer_.push_owned(frame, std::move(proof));
      logger("mooncake")
          ->debug("segment {}: rail from {} ({})", core_.segment_name(), from_, peer_name_);
      return Status::ok();
    }
    case FrameType::kWrite:
      last_applied_ = h.seq;
      ack_due_ = true;
      core_.memory_order.fetch_add(1, std::memory_order_release);
      return Status::ok();
    case FrameType::kNotify:
      core_.deliver_notification(std::move(kept));
      last_applied_ = h.seq;
      ack_due_ = true;
      return Status::ok();
    case FrameType::kRead:
      // Every earlier WRITE is applied; READ_DATA implies their ACK.
      writer_.push(wire::frame(wire::FrameType::kReadData, h.seq, h.addr, h.length, h.length),
                   reinterpret_cast<const char*>(h.addr));
      return Status::ok();
    default:
      return Status::ok();
  }
}

}  // namespace pdkv::backends::mooncake

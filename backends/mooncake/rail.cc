// A rail: one outbound TCP connection of a peer. It sends HELLO, then WRITE
// and READ frames, and retires slices as the target's cumulative ACKs and
// READ_DATA come back. Any failure hands the slices it still owes back to the
// peer, which retries them on another rail.
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "crypto.h"
#include "engine_impl.h"
#include "log.h"

namespace pdkv::backends::mooncake {

Rail::Rail(Peer& peer, size_t index, SocketAddress remote, std::optional<SocketAddress> local)
    : peer_(peer), remote_(remote), local_(local) {
  label_ = fmt::format("rail {} ({} -> {})", index, local ? format_address(*local) : "any",
                       format_address(remote));
}

Rail::~Rail() {
  if (fd_ >= 0) ::close(fd_);
}

void Rail::connect() {
  failed_connecting_ = false;
  proven_ = false;
  next_seq_ = 1;
  reader_ = FrameReader();
  writer_.clear();
  const auto failed = [this](const char* step) {
    last_failure_ =
        Status::unavailable(fmt::format("{}: {}: {}", label_, step, std::strerror(errno)));
    failed_connecting_ = true;
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    state_ = State::kDown;
  };
  fd_ = ::socket(remote_.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return failed("socket");
  const int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (local_ && ::bind(fd_, local_->get(), local_->length) != 0) return failed("bind");
  last_progress_ = Clock::now();
  if (::connect(fd_, remote_.get(), remote_.length) != 0 && errno != EINPROGRESS) {
    return failed("connect");
  }
  state_ = State::kConnecting;
  // Slices queue until the target's CHALLENGE is answered (on_challenge).
  peer_.loop().loop.add(fd_, EPOLLIN | EPOLLOUT, this);
}

void Rail::on_connected() {
  int error = 0;
  socklen_t len = sizeof error;
  getsockopt(fd_, SOL_SOCKET, SO_ERROR, &error, &len);
  if (error != 0) {
    return fail(Status::unavailable(fmt::format("{}: connect: {}", label_, std::strerror(error))),
                true);
  }
  state_ = State::kHandshake;
  last_progress_ = Clock::now();
  update_interest();  // nothing to send before the challenge
}

Status Rail::on_challenge(std::string target_nonce) {
  PDKV_ASSIGN_OR_RETURN(nonce_, crypto::random_bytes(wire::kNonceBytes));
  target_nonce_ = std::move(target_nonce);
  const SegmentDescriptor& target = peer_.descriptor();
  const std::string& name = peer_.core().segment_name();
  std::string hello = nonce_ + wire::hello_mac(target.secret, target_nonce_, nonce_, name) + name;
  const auto frame = wire::frame(wire::FrameType::kHello, 0, 0, 0, hello.size());
  writer_.push_front_owned(frame, std::move(hello));
  state_ = State::kOpen;  // on_events flushes HELLO and the slices behind it
  logger("mooncake")->debug("{} to {} up", label_, target.name);
  return Status::ok();
}

void Rail::enqueue(SlicePtr slice) {
  slice->seq = next_seq_++;
  if (slice->opcode != Opcode::kRead) {  // a WRITE, or a NOTIFY with its message
    const auto type =
        slice->opcode == Opcode::kWrite ? wire::FrameType::kWrite : wire::FrameType::kNotify;
    writer_.push(wire::frame(type, slice->seq, slice->remote, slice->length, slice->length),
                 slice->local);
  } else {
    writer_.push(wire::frame(wire::FrameType::kRead, slice->seq, slice->remote, slice->length, 0),
                 nullptr);
  }
  if (unacked_.empty()) last_progress_ = Clock::now();  // the wait for an ack starts now
  queued_bytes_ += slice->length;
  unacked_.push_back(std::move(slice));
  if (state_ == State::kOpen) flush();
}

void Rail::flush() {
  uint64_t bytes = 0;
  int error_number = 0;
  if (writer_.flush(fd_, bytes, error_number) == IoOutcome::kError) {
    return fail(
        Status::unavailable(fmt::format("{}: send: {}", label_, std::strerror(error_number))),
        false);
  }
  if (bytes > 0) last_progress_ = Clock::now();
  update_interest();
}

void Rail::update_interest() {
  if (fd_ >= 0)
    peer_.loop().loop.modify(
        fd_, EPOLLIN | (writer_.empty() || state_ == State::kHandshake ? 0u : uint32_t{EPOLLOUT}),
        this);
}

Slices Rail::shut(const Status& reason, bool connecting) {
  Slices back;
  if (fd_ >= 0) {
    peer_.loop().loop.remove(fd_);
    // Reset rather than close gracefully: nothing queued may still reach the
    // target after its slices have been handed to another rail.
    linger hard{1, 0};
    setsockopt(fd_, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
    ::close(fd_);
    fd_ = -1;
  }
  state_ = State::kDown;
  draining_until_.reset();
  last_failure_ = reason;
  failed_connecting_ = connecting;
  writer_.clear();
  reader_ = FrameReader();
  for (auto& s : unacked_) back.push_back(std::move(s));
  unacked_.clear();
  queued_bytes_ = 0;
  return back;
}

Slices Rail::stop_sending(Clock::time_point until) {
  Slices unsent;
  if (state_ != State::kOpen) return shut(last_failure_, false);  // nothing reached the target
  for (size_t n = writer_.drop_unstarted(); n > 0; --n) {
    queued_bytes_ -= unacked_.back()->length;
    unsent.push_back(std::move(unacked_.back()));
    unacked_.pop_back();
  }
  std::reverse(unsent.begin(), unsent.end());
  draining_until_ = until;
  return unsent;
}

bool Rail::holds(BatchId batch) const {
  return std::any_of(unacked_.begin(), unacked_.end(),
                     [batch](const SlicePtr& s) { return s->batch == batch; });
}

Slices Rail::drop_unsent(BatchId batch) {
  std::set<uint64_t> seqs;
  for (const auto& s : unacked_) {
    if (s->batch == batch) seqs.insert(s->seq);
  }
  if (seqs.empty()) return {};
  const std::set<uint64_t> dropped = writer_.drop_unstarted(seqs);
  Slices out;
  for (auto it = unacked_.begin(); it != unacked_.end();) {
    if (dropped.count((*it)->seq) == 0) {
      ++it;
      continue;
    }
    queued_bytes_ -= (*it)->length;
    out.push_back(std::move(*it));
    it = unacked_.erase(it);
  }
  update_interest();
  return out;
}

void Rail::fail(const Status& reason, bool connecting) {
  if (!done_.empty()) peer_.core().complete(done_);
  peer_.rail_failed(*this, shut(reason, connecting));
}

bool Rail::check_progress(Clock::time_point now) {
  if (draining_until_ && state_ == State::kOpen && (unacked_.empty() || now >= *draining_until_)) {
    const Status reason = Status::unavailable(
        fmt::format("{}: drained after its segment failed ({} slices unacknowledged)", label_,
                    unacked_.size()));
    draining_until_.reset();
    for (auto& s : shut(reason, false)) peer_.core().fail(*s, TransferState::kFailed, reason);
    return false;
  }
  const bool connecting = state_ == State::kConnecting || state_ == State::kHandshake;
  const bool owes = connecting || (state_ == State::kOpen && !unacked_.empty());
  if (!owes) return false;
  const auto timeout = peer_.core().config.slice_timeout;
  if (now - last_progress_ < timeout) return true;
  fail(Status::deadline_exceeded(fmt::format("{}: no progress for {} ms{}", label_, timeout.count(),
                                             connecting ? " while connecting" : "")),
       connecting);
  return false;
}

void Rail::on_events(uint32_t events) {
  if (state_ == State::kConnecting) {
    if ((events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) == 0) return;
    on_connected();
  }
  if (state_ != State::kOpen && state_ != State::kHandshake) return;
  if (events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
    uint64_t bytes = 0;
    const IoOutcome outcome = reader_.pump(
        fd_, [this](const auto& h, auto& sink) { return on_header(h, sink); },
        [this](const auto& h, auto& kept) { return on_frame(h, kept); }, bytes);
    if (bytes > 0) last_progress_ = Clock::now();
    if (outcome == IoOutcome::kClosed) {
      return fail(Status::unavailable(fmt::format("{}: connection closed by the target", label_)),
                  false);
    }
    if (outcome == IoOutcome::kError) {
      const bool refused = reader_.error().message().starts_with("refused");
      return fail(
          Status(reader_.error().code(), fmt::format("{}: {}", label_, reader_.error().message())),
          refused);
    }
    if (!done_.empty()) peer_.core().complete(done_);
  }
  if (state_ == State::kOpen) flush();
}

Status Rail::complete_writes_before(uint64_t seq) {
  while (!unacked_.empty() && unacked_.front()->seq < seq) {
    if (unacked_.front()->opcode == Opcode::kRead) {
      return Status::internal(
          fmt::format("target skipped READ {} (now at {})", unacked_.front()->seq, seq));
    }
    queued_bytes_ -= unacked_.front()->length;
    done_.push_back(std::move(unacked_.front()));
    unacked_.pop_front();
  }
  return Status::ok();
}

Status Rail::on_header(const wire::FrameHeader& h, PayloadSink& sink) {
  using wire::FrameType;
  const bool handshake = state_ == State::kHandshake;
  switch (static_cast<FrameType>(h.type)) {
    case FrameType::kChallenge:
      if (!handshake || h.payload != wire::kNonceBytes) break;
      sink.keep = true;
      return Status::ok();
    case FrameType::kHelloOk:
      if (handshake || proven_ || h.payload != wire::kMacBytes) break;
      sink.keep = true;
      return Status::ok();
    case FrameType::kAck:
      if (!proven_) break;  // only the target that proved the secret acknowledges
      return Status::ok();
    case FrameType::kRefuse:
      if (h.payload > wire::kMaxRefusePayload) break;
      sink.keep = true;
      return Status::ok();
    case FrameType::kReadData: {
      if (!proven_) break;
      PDKV_RETURN_IF_ERROR(complete_writes_before(h.seq));
      if (unacked_.empty() || unacked_.front()->seq != h.seq ||
          unacked_.front()->opcode != Opcode::kRead || unacked_.front()->length != h.payload) {
        return Status::internal(
            fmt::format("READ_DATA {} of {} bytes matches no READ", h.seq, h.payload));
      }
      sink.dst = unacked_.front()->local;
      return Status::ok();
    }
    default:
      break;
  }
  return Status::internal(fmt::format("unexpected {} frame ({} payload bytes) from the target",
                                      wire::frame_type_name(h.type), h.payload));
}

Status Rail::on_frame(const wire::FrameHeader& h, std::string& kept) {
  using wire::FrameType;
  switch (static_cast<FrameType>(h.type)) {
    case FrameType::kChallenge:
      return on_challenge(std::move(kept));
    case FrameType::kHelloOk:
      if (!crypto::equal(kept,
                         wire::hello_ok_mac(peer_.descriptor().secret, nonce_, target_nonce_))) {
        return Status::failed_precondition(
            "refused: HELLO_OK does not prove the session secret (not this segment's target)");
      }
      proven_ = true;
      return Status::ok();
    case FrameType::kAck:
      PDKV_RETURN_IF_ERROR(complete_writes_before(h.seq + 1));
      return Status::ok();
    case FrameType::kReadData:
      queued_bytes_ -= unacked_.front()->length;
      done_.push_back(std::move(unacked_.front()));
      unacked_.pop_front();
      return Status::ok();
    case FrameType::kRefuse:
      return Status::failed_precondition("refused by the target: " + kept);
    default:
      return Status::ok();
  }
}

}  // namespace pdkv::backends::mooncake

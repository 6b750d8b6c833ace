#include "frame_io.h"

#include <fmt/format.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace pdkv::backends::mooncake {
namespace {

constexpr size_t kBufferBytes = 256 << 10;
// A payload at least this large is received straight into its
// destination instead of through the buffer (below it, one read for many
// small frames and a copy cost less than one read each).
constexpr uint64_t kDirectBytes = 16 << 10;
// One pump reads at most this much, so that one busy connection cannot
// starve the others on its event loop (epoll is level-triggered).
constexpr uint64_t kPumpBudget = 16 << 20;

}  // namespace

FrameReader::FrameReader() : buf_(kBufferBytes) {}

Status FrameReader::consume_buffered(const OnHeader& on_header, const OnFrame& on_frame) {
  while (true) {
    if (!in_payload_) {
      if (end_ - begin_ < sizeof header_) return Status::ok();
      std::memcpy(&header_, buf_.data() + begin_, sizeof header_);
      begin_ += sizeof header_;
      if (header_.magic != wire::kMagic) {
        return Status::invalid_argument(
            fmt::format("not a pdkv mooncake frame (magic {:#010x})", header_.magic));
      }
      sink_ = {};
      PDKV_RETURN_IF_ERROR(on_header(header_, sink_));
      if (sink_.dst == nullptr && !sink_.keep && header_.payload > 0) {
        return Status::invalid_argument(fmt::format("{} frame carries {} unexpected payload bytes",
                                                    wire::frame_type_name(header_.type),
                                                    header_.payload));
      }
      in_payload_ = true;
      large_payloads_ = sink_.dst != nullptr && header_.payload >= kDirectBytes;
      got_ = 0;
      kept_.clear();
    }
    const uint64_t n = std::min<uint64_t>(header_.payload - got_, end_ - begin_);
    if (n > 0) {
      if (sink_.dst) {
        std::memcpy(sink_.dst + got_, buf_.data() + begin_, n);
      } else {
        kept_.append(buf_.data() + begin_, n);
      }
      begin_ += n;
      got_ += n;
    }
    if (got_ < header_.payload) return Status::ok();
    in_payload_ = false;
    PDKV_RETURN_IF_ERROR(on_frame(header_, kept_));
  }
}

IoOutcome FrameReader::pump(int fd, const OnHeader& on_header, const OnFrame& on_frame,
                            uint64_t& bytes) {
  bytes = 0;
  while (bytes < kPumpBudget) {
    if (Status st = consume_buffered(on_header, on_frame); !st.is_ok()) {
      error_ = st;
      return IoOutcome::kError;
    }
    if (begin_ == end_) begin_ = end_ = 0;
    iovec iov[2];
    const bool direct = receives_direct();
    if (direct) {
      // The payload's remainder into its destination and the next header
      // into the buffer, in one call: a stream of large frames is never
      // copied (a longer second part would pull the next payload through
      // the buffer).
      iov[0] = {sink_.dst + got_, header_.payload - got_};
      iov[1] = {buf_.data(), sizeof header_};
    } else {
      if (begin_ > 0 && buf_.size() - end_ < sizeof header_) {  // compact
        std::memmove(buf_.data(), buf_.data() + begin_, end_ - begin_);
        end_ -= begin_;
        begin_ = 0;
      }
      iov[0] = {buf_.data() + end_, buffered_read_size()};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = direct ? 2 : 1;
    const ssize_t r = ::recvmsg(fd, &msg, 0);
    if (r == 0) return IoOutcome::kClosed;
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return IoOutcome::kAgain;
      error_ = Status::unavailable(fmt::format("recv: {}", std::strerror(errno)));
      return IoOutcome::kError;
    }
    const auto n = static_cast<uint64_t>(r);
    bytes += n;
    if (direct) {
      const uint64_t into_payload = std::min<uint64_t>(n, iov[0].iov_len);
      got_ += into_payload;
      end_ = n - into_payload;  // the buffer was empty
      direct_bytes_ += into_payload;
    } else {
      end_ += n;
    }
  }
  if (Status st = consume_buffered(on_header, on_frame); !st.is_ok()) {
    error_ = st;
    return IoOutcome::kError;
  }
  return IoOutcome::kAgain;
}

bool FrameReader::receives_direct() const {
  // By the frame's size, not its remainder: the rest of a large payload that
  // TCP delivered in parts goes direct too (through the buffer it would pull
  // the next payloads with it).
  return in_payload_ && large_payloads_ && begin_ == end_;
}

size_t FrameReader::buffered_read_size() const {
  // Between frames of a stream of large ones: only the next header, so that
  // its payload goes direct too (the buffer holds no whole header here).
  if (!in_payload_ && large_payloads_) return sizeof header_ - (end_ - begin_);
  return buf_.size() - end_;
}

void FrameWriter::push(const wire::FrameHeader& header, const char* payload) {
  frames_.push_back(Frame{header, payload, {}, 0});
}

void FrameWriter::push_owned(const wire::FrameHeader& header, std::string owned) {
  Frame& f = frames_.emplace_back(Frame{header, nullptr, std::move(owned), 0});
  f.payload = f.owned.data();  // deque elements do not move
}

void FrameWriter::push_front_owned(const wire::FrameHeader& header, std::string owned) {
  Frame& f = frames_.emplace_front(Frame{header, nullptr, std::move(owned), 0});
  f.payload = f.owned.data();
}

size_t FrameWriter::drop_unstarted() {
  size_t dropped = 0;
  while (!frames_.empty() && frames_.back().sent == 0 && frames_.back().owned.empty()) {
    frames_.pop_back();
    ++dropped;
  }
  return dropped;
}

std::set<uint64_t> FrameWriter::drop_unstarted(const std::set<uint64_t>& seqs) {
  std::set<uint64_t> dropped;
  std::erase_if(frames_, [&](const Frame& f) {
    if (f.sent != 0 || !f.owned.empty() || seqs.count(f.header.seq) == 0) return false;
    dropped.insert(f.header.seq);
    return true;
  });
  return dropped;
}

IoOutcome FrameWriter::flush(int fd, uint64_t& bytes, int& error_number) {
  constexpr size_t kMaxIov = 64;
  bytes = 0;
  while (!frames_.empty()) {
    iovec iov[kMaxIov];
    size_t n = 0;
    for (auto it = frames_.begin(); it != frames_.end() && n + 2 <= kMaxIov; ++it) {
      constexpr uint64_t kHeader = sizeof(wire::FrameHeader);
      if (it->sent < kHeader) {
        iov[n++] = {reinterpret_cast<char*>(&it->header) + it->sent, kHeader - it->sent};
      }
      const uint64_t payload_sent = it->sent > kHeader ? it->sent - kHeader : 0;
      if (it->header.payload > payload_sent) {
        iov[n++] = {const_cast<char*>(it->payload) + payload_sent,
                    it->header.payload - payload_sent};
      }
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = n;
    const ssize_t r = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return IoOutcome::kAgain;
      error_number = errno;
      return IoOutcome::kError;
    }
    bytes += static_cast<uint64_t>(r);
    uint64_t left = static_cast<uint64_t>(r);
    while (left > 0) {
      Frame& f = frames_.front();
      const uint64_t total = sizeof(wire::FrameHeader) + f.header.payload;
      const uint64_t take = std::min(left, total - f.sent);
      f.sent += take;
      left -= take;
      if (f.sent == total) frames_.pop_front();
    }
  }
  return IoOutcome::kAgain;
}

}  // namespace pdkv::backends::mooncake

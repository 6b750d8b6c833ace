// Non-blocking framed I/O on one TCP socket, shared by both ends of a rail.
// The reader writes large payloads straight into their destination (a
// registered region) and never buffers more than one read's worth; the
// writer sends header and payload with one sendmsg, from the caller's memory.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "pdkv/status.h"
#include "wire.h"

namespace pdkv::backends::mooncake {

enum class IoOutcome { kAgain, kClosed, kError };

// What to do with a frame's payload, decided from its header.
struct PayloadSink {
  char* dst = nullptr;  // write the payload here (its length is header.payload) ...
  bool keep = false;    // ... or collect it for on_frame (small frames only)
};

class FrameReader {
 public:
  // Decides where the payload goes, or refuses the frame (the error closes
  // the connection, with the status as the reason).
  using OnHeader = std::function<Status(const wire::FrameHeader&, PayloadSink&)>;
  // The frame with its whole payload received (`kept` when the sink kept it).
  using OnFrame = std::function<Status(const wire::FrameHeader&, std::string& kept)>;

  FrameReader();
  // Reads what the socket has (up to a fairness bound) and dispatches whole
  // frames. kError leaves the reason in error(). `bytes` counts what was read.
  IoOutcome pump(int fd, const OnHeader& on_header, const OnFrame& on_frame, uint64_t& bytes);
  const Status& error() const { return error_; }
  // Bytes of a frame received but not yet dispatched (a truncated frame at EOF).
  bool mid_frame() const { return in_payload_ || end_ > begin_; }
  // Payload bytes received straight into their destination, not copied.
  uint64_t direct_bytes() const { return direct_bytes_; }

 private:
  Status consume_buffered(const OnHeader& on_header, const OnFrame& on_frame);
  // Whether the next read goes straight into the current payload's sink.
  bool receives_direct() const;
  // How much the next read into the buffer may take.
  size_t buffered_read_size() const;

  std::vector<char> buf_;
  size_t begin_ = 0, end_ = 0;
  bool in_payload_ = false;
  wire::FrameHeader header_;
  PayloadSink sink_;
  uint64_t got_ = 0;
  std::string kept_;
  Status error_;
  uint64_t direct_bytes_ = 0;
  bool large_payloads_ = false;  // the current (or last) frame's payload goes direct
};

class FrameWriter {
 public:
  // Queues a frame; `payload` (header.payload bytes) must stay valid until
  // sent. `owned` keeps a small payload alive inside the writer instead.
  void push(const wire::FrameHeader& header, const char* payload);
  void push_owned(const wire::FrameHeader& header, std::string owned);
  // Queues an owned frame before every other; none may have begun (HELLO,
  // once the challenge came, ahead of the slices queued meanwhile).
  void push_front_owned(const wire::FrameHeader& header, std::string owned);
  // Sends as much as the socket takes. kAgain: more is queued (wait for
  // EPOLLOUT) or nothing is; `bytes` counts what was sent.
  IoOutcome flush(int fd, uint64_t& bytes, int& error_number);
  bool empty() const { return frames_.empty(); }
  void clear() { frames_.clear(); }
  // Drops the frames at the back not yet begun (and not owned: a HELLO
  // stays); returns how many.
  size_t drop_unstarted();
  // Drops the frames not yet begun whose sequence number is in `seqs`;
  // returns the numbers dropped.
  std::set<uint64_t> drop_unstarted(const std::set<uint64_t>& seqs);

 private:
  struct Frame {
    wire::FrameHeader header;
    const char* payload = nullptr;
    std::string owned;
    uint64_t sent = 0;  // of sizeof(header) + header.payload
  };
  std::deque<Frame> frames_;
};

}  // namespace pdkv::backends::mooncake

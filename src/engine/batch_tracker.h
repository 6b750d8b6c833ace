// The transport batches an engine has in flight. The transport interface is
// poll-based, so while any batch is in flight the loop polls them on a timer
// (soon after a post, backing off from 20 µs to 200 µs while none ends):
// the work of a poll is the batches in flight, whatever the number of rooms.
//
// Thread-safety: loop thread only.
#pragma once

#include <chrono>
#include <functional>
#include <unordered_map>

#include "engine/event_loop.h"
#include "pdkv/transport.h"

namespace pdkv::engine {

class BatchTracker {
 public:
  using Ended = std::function<void(const BatchStatus& status)>;

  BatchTracker(EventLoop& loop, Transport& transport) : loop_(loop), transport_(transport) {}
  ~BatchTracker() { loop_.cancel(timer_); }

  // `ended` runs on a later loop iteration, once the batch is done or failed.
  void add(BatchId batch, Ended ended);
  size_t in_flight() const { return batches_.size(); }

 private:
  void poll_all();
  void arm(std::chrono::microseconds delay);

  static constexpr std::chrono::microseconds kFirstPoll{20}, kMaxPoll{200};
  EventLoop& loop_;
  Transport& transport_;
  std::unordered_map<BatchId, Ended> batches_;
  EventLoop::TimerId timer_ = 0;
  std::chrono::microseconds backoff_ = kFirstPoll;
};

}  // namespace pdkv::engine

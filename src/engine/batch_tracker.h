// The transport batches an engine has in flight, and when the loop polls
// them: the work of a poll is the batches in flight, whatever the number of
// rooms.
//
// Where the transport announces batch ends (TransportCapabilities::
// batch_end_events), the loop polls when it does, and otherwise only every
// kBackstopPoll, for an end that nothing announces (a failed batch that ends
// when its drain runs out). Elsewhere it polls on a timer while any batch is
// in flight: soon after a post, backing off from 20 µs to 200 µs while none
// ends.
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
  // The transport said the batch failed while it still drains
  // (BatchStatus: kInProgress with an error); it ends later.
  using Failing = std::function<void(const Status& error)>;

  BatchTracker(EventLoop& loop, Transport& transport)
      : loop_(loop), transport_(transport), events_(transport.capabilities().batch_end_events) {}
  ~BatchTracker() { loop_.cancel(timer_); }

  // `ended` runs on a later loop iteration, once the batch is done or failed;
  // `failing` before it, once, if the transport says it failed and drains.
  void add(BatchId batch, Ended ended, Failing failing = {});
  // The transport announced that batches ended (Transport::set_batch_end_callback).
  void on_batch_end_event();
  size_t in_flight() const { return batches_.size(); }

  static constexpr std::chrono::milliseconds kBackstopPoll{10};

 private:
  void poll_all();
  void arm(std::chrono::microseconds delay);

  static constexpr std::chrono::microseconds kFirstPoll{20}, kMaxPoll{200};
  EventLoop& loop_;
  Transport& transport_;
  const bool events_;  // the transport announces batch ends
  struct Tracked {
    Ended ended;
    Failing failing;  // emptied once called
  };
  std::unordered_map<BatchId, Tracked> batches_;
  EventLoop::TimerId timer_ = 0;
  std::chrono::microseconds backoff_ = kFirstPoll;
};

}  // namespace pdkv::engine

// How long a failed transfer waits for the operations its transport library
// still holds before it is reported over.
//
// kFailed means over (transport.h): no byte of the transfer lands after the
// report. A transport that cannot take back what it handed the library
// waits until the library returns it. A frozen peer could make that wait
// last forever. So the wait ends once the library has shown no progress for
// `quiet`. A busy library is never cut short while it keeps returning
// operations, up to `cap` from the start: on a loaded machine a fixed limit
// ran out while the library was still landing bytes.
#pragma once

#include <algorithm>
#include <chrono>

namespace pdkv {

class DrainDeadline {
 public:
  using Clock = std::chrono::steady_clock;

  DrainDeadline() = default;  // passed from the start: nothing to wait for
  DrainDeadline(Clock::time_point start, Clock::duration quiet, Clock::duration cap)
      : quiet_(quiet), cap_(start + cap), until_(std::min(start + quiet, cap_)) {}

  // The library showed progress at `now` (it returned an operation, of this
  // transfer or of another on the same connection): the wait goes on for
  // `quiet` from then, within the cap.
  void progressed(Clock::time_point now) {
    until_ = std::max(until_, std::min(now + quiet_, cap_));
  }

  // Nothing will come back any more (the library's thread is lost).
  void end(Clock::time_point now) { until_ = cap_ = std::min(until_, now); }

  bool passed(Clock::time_point now) const { return now >= until_; }

 private:
  Clock::duration quiet_{};
  Clock::time_point cap_{};
  Clock::time_point until_{};
};

}  // namespace pdkv

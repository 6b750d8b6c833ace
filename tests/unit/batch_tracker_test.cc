// When the engine polls the batches it has in flight: where the transport
// announces batch ends, only then (and on a slow backstop timer); elsewhere
// on its own timer. A scripted transport counts the polls and ends its one
// batch when the test says so.
#include "engine/batch_tracker.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>

#include "support/poll.h"
#include "support/stub_transport.h"

namespace pdkv::engine {
namespace {

using namespace std::chrono_literals;

class ScriptedTransport final : public testing::StubTransport {
 public:
  explicit ScriptedTransport(bool events) : events_(events) {}

  TransportCapabilities capabilities() const override {
    TransportCapabilities caps;
    caps.batch_end_events = events_;
    return caps;
  }
  BatchStatus poll(BatchId) override {
    ++polls;
    if (ended) return {BatchState::kDone, {}};
    return {BatchState::kInProgress, failing ? Status::aborted("failing") : Status::ok()};
  }
  void set_batch_end_callback(EventCallback callback) override { callback_ = callback; }

  // Ends the batch; `announce`: and says so, as a transport with events does.
  void end(bool announce) {
    ended = true;
    if (announce && callback_) callback_();
  }

  std::atomic<int> polls{0};
  std::atomic<bool> ended{false};
  std::atomic<bool> failing{false};  // failed, still draining

 private:
  const bool events_;
  EventCallback callback_;
};

// A tracker on a running loop, wired to its transport as the engine wires
// it (engine_start.cc): an announcement posts a poll.
struct Harness {
  explicit Harness(bool events) : transport(events), tracker(loop, transport) {
    transport.set_batch_end_callback(
        [this] { loop.post([this] { tracker.on_batch_end_event(); }); });
    loop.start();
  }
  ~Harness() { loop.stop(); }

  // Adds batch 1 on the loop; the future holds how it ended.
  std::future<BatchStatus> add() {
    loop.post([this] { tracker.add(1, [this](const BatchStatus& s) { end.set_value(s); }); });
    return end.get_future();
  }
  // The polls made by the time a timer of the loop, armed now for `delay`,
  // fires: timers fire in time order, so every poll due before it has run.
  int polls_after(std::chrono::milliseconds delay) {
    std::promise<int> seen;
    loop.post([&] { loop.after(delay, [&] { seen.set_value(transport.polls.load()); }); });
    return seen.get_future().get();
  }

  EventLoop loop{"test-loop"};
  ScriptedTransport transport;
  BatchTracker tracker;
  std::promise<BatchStatus> end;
};

TEST(BatchTracker, AnnouncedEndsArePolledWhenAnnouncedAndNotBefore) {
  Harness h(/*events=*/true);
  auto ended = h.add();
  // Before the backstop (10 ms), nothing announced: not one poll. (A timer
  // that polls would have polled at once, before this 5 ms timer fires.)
  static_assert(BatchTracker::kBackstopPoll > 5ms);
  EXPECT_EQ(h.polls_after(5ms), 0);
  h.transport.end(/*announce=*/true);
  ASSERT_EQ(ended.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(ended.get().state, BatchState::kDone);
  EXPECT_EQ(h.transport.polls.load(), 1);  // the announced one
}

TEST(BatchTracker, AnEndNothingAnnouncesIsFoundByTheBackstop) {
  Harness h(/*events=*/true);
  auto ended = h.add();
  h.transport.end(/*announce=*/false);  // a failed batch whose drain ran out
  ASSERT_EQ(ended.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(ended.get().state, BatchState::kDone);
}

// A batch that failed and drains (in progress, with its error) is told
// once, before it ends, however often it is polled meanwhile.
TEST(BatchTracker, AFailingBatchIsToldOnceBeforeItsEnd) {
  Harness h(/*events=*/false);  // polled on the timer: many polls while it drains
  std::promise<Status> told;
  std::atomic<int> tellings{0};
  h.transport.failing = true;
  h.loop.post([&] {
    h.tracker.add(
        1, [&](const BatchStatus& s) { h.end.set_value(s); },
        [&](const Status& error) {
          if (tellings++ == 0) told.set_value(error);
        });
  });
  auto failing = told.get_future();
  ASSERT_EQ(failing.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(failing.get().message(), "failing");
  const int polls = h.transport.polls.load();
  ASSERT_TRUE(testing::poll_until([&] { return h.transport.polls.load() > polls + 3; }));
  auto ended = h.end.get_future();
  h.transport.end(/*announce=*/false);
  ASSERT_EQ(ended.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(ended.get().state, BatchState::kDone);
  EXPECT_EQ(tellings.load(), 1);
}

TEST(BatchTracker, WithoutEventsTheLoopPollsOnItsTimer) {
  Harness h(/*events=*/false);
  auto ended = h.add();
  EXPECT_GE(h.polls_after(5ms), 1);  // at once after the post, then backing off
  h.transport.end(/*announce=*/false);
  ASSERT_EQ(ended.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(ended.get().state, BatchState::kDone);
}

}  // namespace
}  // namespace pdkv::engine

// The engine's loop: posted tasks in order, timers in time order, cancelled
// timers never run, posts after stop() are dropped (released, not run).
#include "engine/event_loop.h"

#include <gtest/gtest.h>

#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace pdkv::engine {
namespace {

using namespace std::chrono_literals;

// Runs `f` on the loop and waits for it.
template <typename F>
void on_loop(EventLoop& loop, F f) {
  std::promise<void> done;
  loop.post([&] {
    f();
    done.set_value();
  });
  done.get_future().wait();
}

TEST(EventLoop, TasksRunInPostOrderOnTheLoopThread) {
  EventLoop loop("test-loop");
  loop.start();
  std::vector<int> order;
  bool on_thread = true;
  for (int i = 0; i < 100; ++i) {
    loop.post([&, i] {
      order.push_back(i);
      on_thread &= loop.on_loop_thread();
    });
  }
  on_loop(loop, [] {});
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
  EXPECT_TRUE(on_thread);
  EXPECT_FALSE(loop.on_loop_thread());
}

TEST(EventLoop, TimersFireInTimeOrderAndCancelledOnesNever) {
  EventLoop loop("test-loop");
  loop.start();
  std::vector<int> fired;
  std::promise<void> last;
  on_loop(loop, [&] {
    const auto now = Clock::now();
    loop.at(now + 30ms, [&] { fired.push_back(3); });
    const auto cancelled = loop.at(now + 10ms, [&] { fired.push_back(99); });
    loop.at(now + 20ms, [&] { fired.push_back(2); });
    loop.at(now + 5ms, [&] { fired.push_back(1); });
    loop.at(now + 40ms, [&] { last.set_value(); });
    loop.cancel(cancelled);
    loop.cancel(0);  // never a timer: nothing
  });
  last.get_future().wait();
  EXPECT_EQ(fired, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(loop.timers_fired(), 4u);
}

// A control link's connect timer against the stream that came up: when a
// long task (a gather of gigabytes) keeps the loop busy past the deadline,
// the event posted while it ran still comes first.
TEST(EventLoop, TasksPostedBeforeADeadlineRunBeforeItsTimer) {
  EventLoop loop("test-loop");
  loop.start();
  std::vector<std::string> order;
  std::promise<void> timer_ran;
  on_loop(loop, [&] {
    const auto deadline = Clock::now() + 1ms;
    loop.at(deadline, [&] {
      order.push_back("deadline");
      timer_ran.set_value();
    });
    std::thread([&] { loop.post([&] { order.push_back("event"); }); }).join();
    while (Clock::now() <= deadline) {
    }  // busy past the deadline, as a long copy would be
  });
  timer_ran.get_future().wait();
  on_loop(loop, [] {});
  EXPECT_EQ(order, (std::vector<std::string>{"event", "deadline"}));
}

TEST(EventLoop, StopRunsWhatWasPostedThenDropsLaterPosts) {
  auto token = std::make_shared<int>(7);
  std::weak_ptr<int> watch = token;
  int ran = 0;
  {
    EventLoop loop("test-loop");
    loop.start();
    loop.post([&] { ++ran; });
    loop.stop();
    loop.post([&ran, token = std::move(token)] { ran += 100; });
    // Dropped at once: what it captured is released, it never runs.
    EXPECT_TRUE(watch.expired());
  }
  EXPECT_EQ(ran, 1);
}

TEST(EventLoop, InboxDropsPostsOnceClosed) {
  EventLoop loop("test-loop");
  loop.start();
  LoopInbox inbox(loop);
  int ran = 0;
  inbox.post([&] { ++ran; });
  on_loop(loop, [] {});
  inbox.close();
  inbox.post([&] { ran += 100; });
  on_loop(loop, [] {});
  EXPECT_EQ(ran, 1);
}

}  // namespace
}  // namespace pdkv::engine

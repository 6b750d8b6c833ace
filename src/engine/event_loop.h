// The engine's one thread of control: posted tasks and timers, nothing else.
//
// Every piece of room and peer state of an engine is owned by its loop and
// touched only by tasks running on the loop's thread, so none of it needs a
// lock. Other threads (API callers, gRPC's threads, a backend's progress
// thread) hand work over with post(), which takes the queue's lock for the
// time of a push and never runs anything under it. Timeouts are timers in a
// heap: the thread sleeps until the nearest one or the next post, and the
// work of an iteration is the tasks and timers that are due, however many
// rooms are open. Tasks posted before a timer's turn run before it, so that
// an event that arrived in time wins over its deadline however long the
// loop was busy.
//
// Thread-safety: post(), stop(), on_loop_thread() and the counters from any
// thread; at(), after() and cancel() on the loop's thread only.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <queue>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace pdkv::engine {

using Clock = std::chrono::steady_clock;

class EventLoop {
 public:
  using Task = std::function<void()>;
  using TimerId = uint64_t;  // 0 is never a timer

  explicit EventLoop(std::string name);
  ~EventLoop();  // stop()
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  void start();
  // Runs `task` on the loop's thread after every task posted before it.
  // Once the loop has stopped, the task is destroyed without running (what
  // it captured is released on the caller's thread).
  void post(Task task);
  // Runs the tasks already posted (and those they post), then ends the
  // thread; pending timers are dropped. Not from the loop's own thread.
  void stop();

  // Loop thread only: runs `task` at `when`, unless cancelled before.
  TimerId at(Clock::time_point when, Task task);
  TimerId after(Clock::duration delay, Task task) {
    return at(Clock::now() + delay, std::move(task));
  }
  // Forgets a timer; 0, a fired or a cancelled id are fine.
  void cancel(TimerId id);

  bool on_loop_thread() const;
  uint64_t tasks_run() const { return tasks_run_.load(std::memory_order_relaxed); }
  uint64_t timers_fired() const { return timers_fired_.load(std::memory_order_relaxed); }

 private:
  struct Due {
    Clock::time_point when;
    TimerId id;
    bool operator>(const Due& other) const { return when > other.when; }
  };
  void run();
  // Loop thread: the timers due by `by`, removed from the heap.
  std::vector<Task> take_due_timers(Clock::time_point by);

  const std::string name_;
  std::thread thread_;
  std::atomic<std::thread::id> thread_id_{};

  std::mutex mu_;  // guards queue_, stopping_, stopped_
  std::condition_variable wake_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  bool stopped_ = false;
  // Loop thread only. The earliest due time is published to wait on.
  std::priority_queue<Due, std::vector<Due>, std::greater<Due>> heap_;
  std::unordered_map<TimerId, Task> timers_;
  TimerId next_timer_ = 1;

  std::atomic<uint64_t> tasks_run_{0};
  std::atomic<uint64_t> timers_fired_{0};
};

// How a foreign thread reaches a loop that may be gone by the time it calls
// (a backend's callback can outlive the engine that set it): after close(),
// a post drops its task.
class LoopInbox {
 public:
  explicit LoopInbox(EventLoop& loop) : loop_(&loop) {}
  void post(EventLoop::Task task) {
    std::lock_guard lock(mu_);
    if (loop_ != nullptr) loop_->post(std::move(task));
  }
  void close() {
    std::lock_guard lock(mu_);
    loop_ = nullptr;
  }

 private:
  std::mutex mu_;
  EventLoop* loop_;
};

}  // namespace pdkv::engine

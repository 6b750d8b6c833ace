#include "engine/event_loop.h"

#include <pthread.h>

namespace pdkv::engine {

EventLoop::EventLoop(std::string name) : name_(std::move(name)) {}

EventLoop::~EventLoop() { stop(); }

void EventLoop::start() {
  thread_ = std::thread([this] {
    thread_id_ = std::this_thread::get_id();
    pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
    run();
  });
}

void EventLoop::post(Task task) {
  {
    std::lock_guard lock(mu_);
    if (!stopped_) {
      queue_.push_back(std::move(task));
      wake_.notify_one();
      return;
    }
  }
  task = nullptr;  // stopped: released here, outside the lock
}

void EventLoop::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    wake_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
  std::deque<Task> left;
  {
    std::lock_guard lock(mu_);
    stopped_ = true;
    left.swap(queue_);
  }
  // Never started, or posted after the thread's last look: dropped.
  left.clear();
}

bool EventLoop::on_loop_thread() const { return thread_id_.load() == std::this_thread::get_id(); }

EventLoop::TimerId EventLoop::at(Clock::time_point when, Task task) {
  const TimerId id = next_timer_++;
  timers_.emplace(id, std::move(task));
  heap_.push({when, id});
  return id;
}

void EventLoop::cancel(TimerId id) {
  if (id != 0) timers_.erase(id);  // its heap entry is skipped when it comes up
}

std::vector<EventLoop::Task> EventLoop::take_due_timers(Clock::time_point by) {
  std::vector<Task> due;
  while (!heap_.empty() && heap_.top().when <= by) {
    auto it = timers_.find(heap_.top().id);
    heap_.pop();
    if (it == timers_.end()) continue;  // cancelled
    due.push_back(std::move(it->second));
    timers_.erase(it);
  }
  return due;
}

void EventLoop::run() {
  std::deque<Task> batch;
  while (true) {
    Clock::time_point woke;
    {
      std::unique_lock lock(mu_);
      // Stopping ends the thread once the queue is empty, whatever timers
      // are due (the last round fired those that were due before it).
      if (stopping_ && queue_.empty()) {
        stopped_ = true;
        return;
      }
      // Skip cancelled timers at the top so that the wait is for a live one.
      while (!heap_.empty() && !timers_.count(heap_.top().id)) heap_.pop();
      if (queue_.empty() && (heap_.empty() || heap_.top().when > Clock::now())) {
        if (heap_.empty()) {
          wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        } else {
          wake_.wait_until(lock, heap_.top().when, [&] { return stopping_ || !queue_.empty(); });
        }
      }
      woke = Clock::now();
      batch.swap(queue_);
    }
    // What was posted by now runs before the timers due by now: an event
    // that arrived before a deadline (a stream that came up, a reply) beats
    // the deadline's timer even when a long task kept the loop busy past it.
    // Timers that come due while the batch runs wait for the next round, after
    // what the batch's time let others post.
    for (Task& task : batch) {
      tasks_run_.fetch_add(1, std::memory_order_relaxed);
      task();
      task = nullptr;  // what it captured goes now, not with the next batch
    }
    batch.clear();
    for (Task& timer : take_due_timers(woke)) {
      timers_fired_.fetch_add(1, std::memory_order_relaxed);
      timer();
    }
  }
}

}  // namespace pdkv::engine

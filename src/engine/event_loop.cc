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

std::vector<EventLoop::Task> EventLoop::take_due_timers() {
  std::vector<Task> due;
  const Clock::time_point now = Clock::now();
  while (!heap_.empty() && heap_.top().when <= now) {
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
    for (Task& timer : take_due_timers()) {
      timers_fired_.fetch_add(1, std::memory_order_relaxed);
      timer();
    }
    {
      std::unique_lock lock(mu_);
      // Skip cancelled timers at the top so that the wait is for a live one.
      while (!heap_.empty() && !timers_.count(heap_.top().id)) heap_.pop();
      if (queue_.empty()) {
        if (stopping_) {
          stopped_ = true;
          return;
        }
        if (heap_.empty()) {
          wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        } else {
          wake_.wait_until(lock, heap_.top().when, [&] { return stopping_ || !queue_.empty(); });
        }
      }
      batch.swap(queue_);
    }
    for (Task& task : batch) {
      tasks_run_.fetch_add(1, std::memory_order_relaxed);
      task();
      task = nullptr;  // what it captured goes now, not with the next batch
    }
    batch.clear();
  }
}

}  // namespace pdkv::engine

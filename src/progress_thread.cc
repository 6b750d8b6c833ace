#include "progress_thread.h"

namespace pdkv {

using Clock = std::chrono::steady_clock;

void ProgressThread::start(Driver driver) {
  driver_ = std::move(driver);
  std::promise<void> started;
  auto ready = started.get_future();
  exited_ = std::promise<void>();
  left_loop_ = exited_.get_future();
  thread_ = std::thread([this, &started] {
    id_ = std::this_thread::get_id();
    started.set_value();
    loop();
    exited_.set_value();
  });
  ready.wait();  // id_ is set before anyone asks on_this_thread()
}

bool ProgressThread::stop(std::chrono::milliseconds drain_limit) {
  {
    std::lock_guard lock(mu_);
    if (abandoned_) return false;
    if (!thread_.joinable() || stopping_) return true;
    stopping_ = true;
    drain_until_ = Clock::now() + drain_limit;
  }
  cv_.notify_all();
  if (driver_.wake) driver_.wake();
  if (driver_.stuck) {
    while (left_loop_.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
      if (given_up()) return false;
    }
  }
  thread_.join();
  return true;
}

void ProgressThread::abandon() {
  std::deque<std::function<void()>> dropped;
  {
    std::lock_guard lock(mu_);
    if (abandoned_ || !thread_.joinable()) return;
    abandoned_ = true;
    dropped.swap(tasks_);
    thread_.detach();  // the owner keeps what the stuck call touches alive
  }
}

bool ProgressThread::given_up() {
  if (abandoned()) return true;
  if (!driver_.stuck || !driver_.stuck()) return false;
  abandon();
  return true;
}

bool ProgressThread::abandoned() const {
  std::lock_guard lock(mu_);
  return abandoned_;
}

Status ProgressThread::refusal() const {
  return abandoned() ? Status::aborted(name_ + " is stuck in its library and was given up")
                     : Status::aborted(name_ + " is shutting down");
}

bool ProgressThread::post(std::function<void()> task) {
  {
    std::lock_guard lock(mu_);
    if (abandoned_ || (stopping_ && !on_this_thread())) return false;
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
  if (driver_.wake) driver_.wake();
  return true;
}

void ProgressThread::loop() {
  auto hot_until = Clock::time_point::min();
  std::deque<std::function<void()>> tasks;
  while (true) {
    bool stopping;
    {
      std::lock_guard lock(mu_);
      tasks.swap(tasks_);
      stopping = stopping_;
    }
    const bool ran = !tasks.empty();
    for (auto& task : tasks) task();
    tasks.clear();
    const bool active = driver_.progress();
    const bool busy = driver_.busy();
    const auto now = Clock::now();
    if (active) hot_until = now + driver_.hot_window;
    if (stopping && !ran && (!busy || now >= drain_until_)) {
      std::lock_guard lock(mu_);
      if (tasks_.empty()) return;  // else a task queued by the last pass runs first
      continue;
    }
    if (ran || active) continue;
    if (busy) {
      std::this_thread::yield();  // in flight, nothing new: poll again
      continue;
    }
    const auto tick = now < hot_until ? driver_.hot_tick : driver_.idle_tick;
    if (driver_.sleep) {
      driver_.sleep(tick);
      continue;
    }
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, tick, [this] { return stopping_ || !tasks_.empty(); });
  }
}

}  // namespace pdkv

#include "event_loop.h"

#include <fmt/format.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace pdkv::backends::mooncake {

EventLoop::~EventLoop() { stop(); }

Status EventLoop::start(std::function<bool()> tick, std::chrono::milliseconds period) {
  tick_ = std::move(tick);
  period_ = period;
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) {
    return Status::internal(fmt::format("epoll/eventfd: {}", std::strerror(errno)));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;  // the wake-up fd
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  thread_ = std::thread([this] { run(); });
  return Status::ok();
}

void EventLoop::stop() {
  if (thread_.joinable()) {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof one);
    thread_.join();
  }
  if (wake_fd_ >= 0) ::close(wake_fd_);
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
  wake_fd_ = epoll_fd_ = -1;
}

void EventLoop::post(std::function<void()> task) {
  {
    std::lock_guard lock(mu_);
    tasks_.push_back(std::move(task));
  }
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
}

void EventLoop::add(int fd, uint32_t events, Handler* handler) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = handler;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
}

void EventLoop::modify(int fd, uint32_t events, Handler* handler) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = handler;
  epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &ev);
}

void EventLoop::remove(int fd) { epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr); }

void EventLoop::run() {
  using Clock = std::chrono::steady_clock;
  constexpr int kMaxEvents = 64;
  epoll_event events[kMaxEvents];
  bool ticking = true;
  auto next_tick = Clock::now();
  while (true) {
    int timeout = -1;
    if (ticking) {
      const auto wait = std::chrono::ceil<std::chrono::milliseconds>(next_tick - Clock::now());
      timeout = static_cast<int>(std::max<int64_t>(0, wait.count()));
    }
    const int n = epoll_wait(epoll_fd_, events, kMaxEvents, timeout);
    bool posted = false;
    for (int i = 0; i < n; ++i) {
      if (events[i].data.ptr == nullptr) {
        uint64_t count;
        (void)!::read(wake_fd_, &count, sizeof count);
        posted = true;
      } else {
        // A handler may remove another one registered in this same round; the
        // owners defer destruction to a posted task, so the pointer is live.
        static_cast<Handler*>(events[i].data.ptr)->on_events(events[i].events);
      }
    }
    if (posted) {
      std::deque<std::function<void()>> tasks;
      {
        std::lock_guard lock(mu_);
        if (stopping_) return;
        tasks.swap(tasks_);
      }
      for (auto& task : tasks) task();
    }
    if (n > 0) ticking = true;  // new work may have deadlines
    if (ticking && Clock::now() >= next_tick) {
      ticking = tick_ ? tick_() : false;
      next_tick = Clock::now() + period_;
    }
  }
}

}  // namespace pdkv::backends::mooncake

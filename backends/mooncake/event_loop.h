// One epoll thread. The mooncake backend runs every socket of a peer, and
// every inbound connection, on one of a few such loops (never a thread per
// connection). Objects registered with a loop are touched only on its thread;
// other threads hand it work with post().
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "pdkv/status.h"

namespace pdkv::backends::mooncake {

class EventLoop {
 public:
  class Handler {
   public:
    virtual ~Handler() = default;
    virtual void on_events(uint32_t events) = 0;
  };

  EventLoop() = default;
  ~EventLoop();  // stop()
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // `tick` runs on the loop about every `period` while it returns true, and
  // again after any post() (work may have deadlines); an idle loop sleeps.
  Status start(std::function<bool()> tick, std::chrono::milliseconds period);
  // Joins the thread; tasks not yet run are dropped.
  void stop();

  void post(std::function<void()> task);
  bool in_loop_thread() const { return std::this_thread::get_id() == thread_.get_id(); }

  // Loop thread only. Level-triggered.
  void add(int fd, uint32_t events, Handler* handler);
  void modify(int fd, uint32_t events, Handler* handler);
  void remove(int fd);

 private:
  void run();

  int epoll_fd_ = -1;
  int wake_fd_ = -1;  // eventfd
  std::function<bool()> tick_;
  std::chrono::milliseconds period_{50};
  std::mutex mu_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace pdkv::backends::mooncake

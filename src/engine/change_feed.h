// Which rooms changed state since the caller last asked: how a server learns
// of progress without polling every room (Engine::take_changed_rooms,
// wait_for_changes, change_fd).
//
// The loop calls changed() whenever it publishes a room's state; a room is
// listed once however often it changed. The eventfd is readable while the
// list is not empty, for servers that wait in epoll.
//
// Thread-safety: every method from any thread; one lock, never held across
// anything but the list and a write to the eventfd.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "pdkv/room.h"

namespace pdkv::engine {

class ChangeFeed {
 public:
  ChangeFeed();
  ~ChangeFeed();
  ChangeFeed(const ChangeFeed&) = delete;
  ChangeFeed& operator=(const ChangeFeed&) = delete;

  void changed(RoomId room);
  // The rooms changed since the last take(), in the order they first changed.
  std::vector<RoomId> take();
  // Until something changed (true) or `timeout` passed (false).
  bool wait(std::chrono::milliseconds timeout);
  int fd() const { return fd_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<RoomId> order_;
  std::unordered_set<RoomId> listed_;
  int fd_ = -1;
};

}  // namespace pdkv::engine

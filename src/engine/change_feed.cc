#include "engine/change_feed.h"

#include <sys/eventfd.h>
#include <unistd.h>

namespace pdkv::engine {

ChangeFeed::ChangeFeed() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

ChangeFeed::~ChangeFeed() {
  if (fd_ >= 0) close(fd_);
}

void ChangeFeed::changed(RoomId room) {
  std::lock_guard lock(mu_);
  if (!listed_.insert(room).second) return;
  order_.push_back(room);
  if (order_.size() == 1) {
    const uint64_t one = 1;
    if (fd_ >= 0) (void)!write(fd_, &one, sizeof one);  // readable until take()
    cv_.notify_all();
  }
}

std::vector<RoomId> ChangeFeed::take() {
  std::lock_guard lock(mu_);
  std::vector<RoomId> out;
  out.swap(order_);
  listed_.clear();
  // The eventfd was written when the list stopped being empty, and only
  // then: an empty list costs no system call (a worker takes after every
  // wake, most of them with nothing listed).
  uint64_t count = 0;
  if (fd_ >= 0 && !out.empty()) (void)!read(fd_, &count, sizeof count);
  return out;
}

bool ChangeFeed::wait(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return !order_.empty(); });
}

}  // namespace pdkv::engine

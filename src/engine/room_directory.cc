#include "engine/room_directory.h"

#include <fmt/format.h>

namespace pdkv::engine {

Result<std::shared_ptr<RoomHandle>> RoomDirectory::open(RoomId room, const char* what) {
  std::lock_guard lock(mu_);
  if (closed_.count(room)) {
    return Status::failed_precondition(fmt::format("room {} was used and closed already", room));
  }
  auto [it, fresh] = open_.try_emplace(room);
  if (!fresh) return Status::already_exists(fmt::format("room {} already has a {}", room, what));
  it->second = std::make_shared<RoomHandle>(room);
  return it->second;
}

std::shared_ptr<RoomHandle> RoomDirectory::find(RoomId room) const {
  std::lock_guard lock(mu_);
  auto it = open_.find(room);
  return it == open_.end() ? nullptr : it->second;
}

void RoomDirectory::close(RoomId room) {
  std::lock_guard lock(mu_);
  open_.erase(room);
  remember(room);
}

void RoomDirectory::bury(RoomId room) {
  std::lock_guard lock(mu_);
  if (!open_.count(room)) remember(room);
}

bool RoomDirectory::closed_before(RoomId room) const {
  std::lock_guard lock(mu_);
  return closed_.count(room) > 0;
}

size_t RoomDirectory::open_rooms() const {
  std::lock_guard lock(mu_);
  return open_.size();
}

void RoomDirectory::remember(RoomId room) {
  if (!closed_.insert(room).second) return;
  closed_order_.push_back(room);
  while (closed_order_.size() > kMaxClosed) {
    closed_.erase(closed_order_.front());
    closed_order_.pop_front();
  }
}

}  // namespace pdkv::engine

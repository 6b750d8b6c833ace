// The rooms of one engine by id, for the API side: which ids have a Sender
// or Receiver open (so that a second one, or a poll of many rooms, is
// answered at once, without the loop), and which ids were used and are
// closed (so that neither a caller nor a late message re-opens them).
//
// Thread-safety: every method from any thread; one lock, held for a lookup
// or an insertion only.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "engine/room_handle.h"

namespace pdkv::engine {

class RoomDirectory {
 public:
  // A fresh handle for `room`, or an error naming why not: a `what`
  // ("sender", "receiver") is open for it already, or it was used and closed.
  Result<std::shared_ptr<RoomHandle>> open(RoomId room, const char* what);
  std::shared_ptr<RoomHandle> find(RoomId room) const;
  // The caller let go of the room: its id is remembered as closed.
  void close(RoomId room);
  // An id the loop ended without a caller (opened by early messages only).
  void bury(RoomId room);
  bool closed_before(RoomId room) const;
  size_t open_rooms() const;

  // Ids of closed rooms remembered, oldest forgotten first.
  static constexpr size_t kMaxClosed = 1 << 20;

 private:
  void remember(RoomId room);  // mu_ held

  mutable std::mutex mu_;
  std::unordered_map<RoomId, std::shared_ptr<RoomHandle>> open_;
  std::unordered_set<RoomId> closed_;
  std::deque<RoomId> closed_order_;
};

}  // namespace pdkv::engine

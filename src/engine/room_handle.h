// What the API side of one room (its Sender or Receiver) shares with the
// engine's loop.
//
// The loop owns everything about a room except what is here: the state the
// caller polls, the room's metrics, and the sequencing of the caller's own
// calls (init() once, send() only after init(), ...), which the API checks
// on the caller's thread so that misuse is refused at once. Every field is
// guarded by the handle's own lock (RoomState has its own); no other lock is
// ever taken while holding one.
#pragma once

#include <cstdint>
#include <mutex>

#include "pdkv/engine.h"
#include "pdkv/room.h"

namespace pdkv::engine {

struct RoomHandle {
  explicit RoomHandle(RoomId room) : id(room) {}

  const RoomId id;
  RoomState state;  // written by the loop only

  TransferMetrics metrics() const {
    std::lock_guard lock(mu);
    return metrics_;
  }

  mutable std::mutex mu;
  // Written by the loop.
  TransferMetrics metrics_;
  uint64_t decode_prefix_pages = 0;  // prefill: what the destinations hold already
  // The caller's sequencing (prefill).
  bool initialized = false;
  uint64_t num_pages = 0;
  uint64_t pages_sent = 0;
  bool last_sent = false;
  // The caller's sequencing (decode).
  bool init_called = false;
  bool metadata_sent = false;
};

}  // namespace pdkv::engine

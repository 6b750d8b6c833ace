// The life of one request ("room") on one side of a transfer.
//
// States are ordered Failed < Bootstrapping < WaitingForInput < Transferring
// < Success, and a room only moves forward. Failed and Success are terminal:
// the first terminal state wins, so a success reported after a failure stays
// a failure, a failure reported after success changes nothing, and the first
// failure reason is the one the caller sees.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <mutex>

#include "pdkv/status.h"

namespace pdkv {

using RoomId = uint64_t;

enum class PollState : int8_t {
  kFailed = 0,
  kBootstrapping = 1,    // finding the peers (topology, connections)
  kWaitingForInput = 2,  // prefill: waiting for decode's metadata; decode: waiting for data
  kTransferring = 3,     // bytes are moving
  kSuccess = 4,          // every byte visible at the destination
};

const char* poll_state_name(PollState state);

class RoomState {
 public:
  PollState state() const;
  // Ok unless the room failed; then the first reason given.
  Status failure() const;
  bool terminal() const;

  // Moves forward to `next` (not kFailed: use fail). Returns false, changing
  // nothing, when `next` is not ahead of the current state or the room
  // already ended.
  bool advance(PollState next);
  // Fails the room with `reason` unless it already ended. Returns whether
  // this call was the one that failed it.
  bool fail(Status reason);

 private:
  mutable std::mutex mu_;
  PollState state_ = PollState::kBootstrapping;
  Status failure_;
};

}  // namespace pdkv

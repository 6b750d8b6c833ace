#include "pdkv/room.h"

namespace pdkv {

const char* poll_state_name(PollState state) {
  switch (state) {
    case PollState::kFailed:
      return "Failed";
    case PollState::kBootstrapping:
      return "Bootstrapping";
    case PollState::kWaitingForInput:
      return "WaitingForInput";
    case PollState::kTransferring:
      return "Transferring";
    case PollState::kSuccess:
      return "Success";
  }
  return "Unknown";
}

PollState RoomState::state() const {
  std::lock_guard lock(mu_);
  return state_;
}

Status RoomState::failure() const {
  std::lock_guard lock(mu_);
  return failure_;
}

bool RoomState::terminal() const {
  std::lock_guard lock(mu_);
  return state_ == PollState::kFailed || state_ == PollState::kSuccess;
}

bool RoomState::advance(PollState next) {
  std::lock_guard lock(mu_);
  if (next == PollState::kFailed || state_ == PollState::kFailed) return false;
  if (static_cast<int>(next) <= static_cast<int>(state_)) return false;
  state_ = next;
  return true;
}

bool RoomState::fail(Status reason) {
  std::lock_guard lock(mu_);
  if (state_ == PollState::kFailed || state_ == PollState::kSuccess) return false;
  if (reason.is_ok()) reason = Status::internal("room failed without a reason");
  state_ = PollState::kFailed;
  failure_ = std::move(reason);
  return true;
}

}  // namespace pdkv

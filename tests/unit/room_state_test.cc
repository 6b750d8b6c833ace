// Every rule of the room state machine (DESIGN §4), one test each.
#include "pdkv/room.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace pdkv {
namespace {

TEST(RoomState, StartsBootstrapping) {
  RoomState r;
  EXPECT_EQ(r.state(), PollState::kBootstrapping);
  EXPECT_TRUE(r.failure().is_ok());
  EXPECT_FALSE(r.terminal());
}

TEST(RoomState, OrderIsFailedBootstrappingWaitingTransferringSuccess) {
  EXPECT_LT(PollState::kFailed, PollState::kBootstrapping);
  EXPECT_LT(PollState::kBootstrapping, PollState::kWaitingForInput);
  EXPECT_LT(PollState::kWaitingForInput, PollState::kTransferring);
  EXPECT_LT(PollState::kTransferring, PollState::kSuccess);
}

TEST(RoomState, OnlyForward) {
  RoomState r;
  EXPECT_TRUE(r.advance(PollState::kTransferring));
  EXPECT_FALSE(r.advance(PollState::kWaitingForInput));
  EXPECT_FALSE(r.advance(PollState::kTransferring));
  EXPECT_EQ(r.state(), PollState::kTransferring);
  EXPECT_TRUE(r.advance(PollState::kSuccess));
  EXPECT_TRUE(r.terminal());
}

TEST(RoomState, FailedIsStickyAndFirstReasonWins) {
  RoomState r;
  r.advance(PollState::kWaitingForInput);
  EXPECT_TRUE(r.fail(Status::aborted("decode aborted room 7")));
  EXPECT_FALSE(r.fail(Status::deadline_exceeded("timeout")));
  EXPECT_FALSE(r.advance(PollState::kTransferring));
  EXPECT_EQ(r.state(), PollState::kFailed);
  EXPECT_EQ(r.failure().message(), "decode aborted room 7");
  EXPECT_EQ(r.failure().code(), StatusCode::kAborted);
}

TEST(RoomState, SuccessAfterFailureStaysFailure) {
  RoomState r;
  r.fail(Status::internal("peer prefill/1 died"));
  EXPECT_FALSE(r.advance(PollState::kSuccess));
  EXPECT_EQ(r.state(), PollState::kFailed);
}

TEST(RoomState, FailureAfterSuccessChangesNothing) {
  RoomState r;
  r.advance(PollState::kSuccess);
  EXPECT_FALSE(r.fail(Status::internal("late")));
  EXPECT_EQ(r.state(), PollState::kSuccess);
  EXPECT_TRUE(r.failure().is_ok());
}

TEST(RoomState, FailWithOkStatusStillCarriesAReason) {
  RoomState r;
  r.fail(Status::ok());
  EXPECT_EQ(r.failure().code(), StatusCode::kInternal);
}

TEST(RoomState, ConcurrentFailuresExactlyOneWins) {
  RoomState r;
  std::vector<std::thread> threads;
  std::atomic<int> winners{0};
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      if (r.fail(Status::internal("reason " + std::to_string(i)))) ++winners;
      r.advance(PollState::kSuccess);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(winners.load(), 1);
  EXPECT_EQ(r.state(), PollState::kFailed);
}

TEST(PollState, Names) {
  EXPECT_STREQ(poll_state_name(PollState::kWaitingForInput), "WaitingForInput");
  EXPECT_STREQ(poll_state_name(PollState::kFailed), "Failed");
}

}  // namespace
}  // namespace pdkv

// DrainDeadline: the expected instants are worked out by hand from the
// start, the quiet time and the cap.
#include "drain_deadline.h"

#include <gtest/gtest.h>

namespace pdkv {
namespace {

using std::chrono::milliseconds;
const DrainDeadline::Clock::time_point t0{};

TEST(DrainDeadline, WithoutProgressItPassesAQuietTimeAfterTheStart) {
  const DrainDeadline d(t0, milliseconds(500), milliseconds(10000));
  EXPECT_FALSE(d.passed(t0 + milliseconds(499)));
  EXPECT_TRUE(d.passed(t0 + milliseconds(500)));
}

TEST(DrainDeadline, EachProgressGivesAnotherQuietTime) {
  DrainDeadline d(t0, milliseconds(500), milliseconds(10000));
  d.progressed(t0 + milliseconds(400));  // now until 900
  d.progressed(t0 + milliseconds(800));  // now until 1300
  EXPECT_FALSE(d.passed(t0 + milliseconds(1299)));
  EXPECT_TRUE(d.passed(t0 + milliseconds(1300)));
}

TEST(DrainDeadline, ProgressNeverGoesPastTheCap) {
  DrainDeadline d(t0, milliseconds(500), milliseconds(1000));
  d.progressed(t0 + milliseconds(900));  // 1400 would be past the cap: 1000
  EXPECT_FALSE(d.passed(t0 + milliseconds(999)));
  EXPECT_TRUE(d.passed(t0 + milliseconds(1000)));
}

TEST(DrainDeadline, ACapBelowTheQuietTimeBoundsTheFirstWaitToo) {
  const DrainDeadline d(t0, milliseconds(500), milliseconds(300));
  EXPECT_FALSE(d.passed(t0 + milliseconds(299)));
  EXPECT_TRUE(d.passed(t0 + milliseconds(300)));
}

TEST(DrainDeadline, EndedItHasPassedWhateverComesAfter) {
  DrainDeadline d(t0, milliseconds(500), milliseconds(10000));
  d.end(t0 + milliseconds(100));
  d.progressed(t0 + milliseconds(200));
  EXPECT_TRUE(d.passed(t0 + milliseconds(100)));
  EXPECT_TRUE(d.passed(t0 + milliseconds(200)));
}

TEST(DrainDeadline, EndedAfterItPassedItStaysPassedFromWhenItDid) {
  DrainDeadline d(t0, milliseconds(500), milliseconds(10000));
  d.end(t0 + milliseconds(800));  // it had passed at 500 already
  EXPECT_TRUE(d.passed(t0 + milliseconds(500)));
}

TEST(DrainDeadline, ADefaultOneHasPassed) { EXPECT_TRUE(DrainDeadline().passed(t0)); }

}  // namespace
}  // namespace pdkv

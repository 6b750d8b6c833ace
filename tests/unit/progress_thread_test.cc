// A progress thread stuck for good inside its library (progress_thread.h):
// once given up, it holds up no one, and the failures it was to deliver
// reach the user all the same.
#include "progress_thread.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <string>

#include "support/poll.h"

namespace pdkv {
namespace {

using namespace std::chrono_literals;

TEST(ProgressThreadGivenUp, AStuckThreadHoldsUpNoOneAndItsFailuresAreDelivered) {
  // Kept to the end of the process (reachable, for the leak checker): a
  // given-up thread may still read what it ran with.
  static auto* thread = new ProgressThread("stuck thread");
  static auto* in_pass = new std::atomic<bool>(false);
  static auto* release = new std::promise<void>;
  static auto* stuck_now = new std::atomic<bool>(false);
  std::shared_future<void> released = release->get_future().share();
  ProgressThread::Driver driver;
  driver.progress = [released] {
    in_pass->store(true);
    released.wait();  // the library call that does not return
    return false;
  };
  driver.busy = [] { return false; };
  driver.stuck = [] { return stuck_now->load(); };
  thread->start(driver);
  ASSERT_TRUE(testing::poll_until([&] { return in_pass->load(); }, 5s));

  PeerFailures<int> failures(*thread);
  std::string delivered;
  failures.set_callback([&](int peer, const Status& why) {
    delivered += std::to_string(peer) + ": " + why.message();
  });
  ASSERT_TRUE(failures.report(7, Status::unavailable("gone")));
  // A caller waiting for the thread, queued behind the pass that never ends.
  auto waiting =
      std::async(std::launch::async, [] { return thread->run([] { return Status::ok(); }); });

  EXPECT_FALSE(thread->abandoned());  // stuck, but not known to be yet
  stuck_now->store(true);
  EXPECT_FALSE(thread->stop());  // returns, though the thread never ends
  EXPECT_TRUE(thread->abandoned());
  const Status answered = waiting.get();
  EXPECT_EQ(answered.code(), StatusCode::kAborted);
  // Refused as it waited, or (had it come after stop()) at once.
  EXPECT_NE(answered.message().find("stuck thread"), std::string::npos) << answered.message();
  EXPECT_FALSE(thread->post([] {}));
  const Status later = thread->run([] { return Status::ok(); });
  EXPECT_EQ(later.code(), StatusCode::kAborted);
  EXPECT_NE(later.message().find("given up"), std::string::npos) << later.message();
  EXPECT_FALSE(thread->stop());

  EXPECT_EQ(delivered, "");  // the thread never ran its delivery
  failures.deliver_pending();
  EXPECT_EQ(delivered, "7: gone");
  failures.deliver_pending();
  EXPECT_EQ(delivered, "7: gone");  // once
  release->set_value();             // the detached thread ends its loop: it was stopping
}

TEST(ProgressThreadGivenUp, AThreadThatEndsIsNotGivenUp) {
  ProgressThread thread("healthy thread");
  ProgressThread::Driver driver;
  driver.progress = [] { return false; };
  driver.busy = [] { return false; };
  driver.stuck = [] { return false; };
  thread.start(driver);
  PeerFailures<int> failures(thread);
  std::atomic<int> delivered{0};
  failures.set_callback([&](int, const Status&) { ++delivered; });
  ASSERT_TRUE(failures.report(1, Status::unavailable("gone")));
  EXPECT_FALSE(failures.report(1, Status::unavailable("again")));
  ASSERT_TRUE(testing::poll_until([&] { return delivered.load() == 1; }, 5s));
  EXPECT_TRUE(thread.stop());
  EXPECT_FALSE(thread.abandoned());
  EXPECT_EQ(delivered.load(), 1);
}

}  // namespace
}  // namespace pdkv

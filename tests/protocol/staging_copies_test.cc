// A staged route's gather and scatter run off the engine's loop when they
// are large (EngineContext::copy_then): one held in the middle (a page it
// touches is stalled by the kernel, support/page_stall.h) holds up no other
// room, and a decode room is published failed only once its scatter is over.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "support/cluster.h"
#include "support/page_stall.h"

namespace pdkv {
namespace {

using testing::Cluster;
using testing::ClusterSpec;
using testing::first_pages;
using testing::PageStall;
using testing::poll_until;
using testing::thread_name;
using namespace std::chrono_literals;

// 32 KiB a page and buffer, four buffers: a 16-page route is 2 MiB, copied
// on a copy thread; a 2-page one is 256 KiB, copied on the loop.
ClusterSpec staged_spec() {
  ClusterSpec spec;
  spec.kv = KvSpec{8, 128, 2, 16, 2, 64, Layout::kNhd, false};
  spec.staging = Staging::kOn;
  return spec;
}
constexpr uint64_t kLargePages = 16, kSmallPages = 2;

struct Room {
  std::vector<std::unique_ptr<Receiver>> receivers;  // one a decode rank
  std::unique_ptr<Sender> sender;
  Receiver& receiver() const { return *receivers.front(); }
};

// Opens the room at the one prefill rank and every decode rank, and sends
// all of it.
Room start(Cluster& c, RoomId id, const std::vector<uint64_t>& src,
           const std::vector<uint64_t>& dst) {
  Room r;
  for (auto& decode : c.decode) {
    r.receivers.push_back(std::move(decode->receiver(id, c.spec().prefill_id)).value());
    EXPECT_TRUE(r.receivers.back()->init().is_ok());
    EXPECT_TRUE(r.receivers.back()->send_metadata(dst, 0, {}).is_ok());
  }
  r.sender = std::move(c.prefill[0]->sender(id, c.spec().decode_id)).value();
  EXPECT_TRUE(r.sender->init(src.size(), 0, {}).is_ok());
  EXPECT_TRUE(r.sender->send(src, true).is_ok());
  return r;
}

bool received(const Room& r) { return r.receiver().poll() == PollState::kSuccess; }

enum class Copy { kGather, kScatter };

// Room 1 (large) held in the middle of its gather or scatter, room 2
// (small) filled and not yet started.
class StagingCopies : public ::testing::Test {
 protected:
  // Starts the cluster, stalls a page inside room 1's first page in the
  // first buffer of the rank that runs `copy`, starts room 1 and waits
  // until a thread touches that page.
  void hold_large_room(const ClusterSpec& spec, Copy copy) {
    cluster = Cluster::start(spec);
    ASSERT_NE(cluster, nullptr);
    cluster->fill(1, large, 0, {});
    cluster->fill(2, small, 0, {});
    auto& memory = copy == Copy::kGather ? cluster->prefill_memory : cluster->decode_memory;
    stall = std::make_unique<PageStall>(memory[0].kv[0].data() + 8192);
    if (stall->unavailable())
      GTEST_SKIP() << "no userfaultfd here to hold a copy: " << stall->error();
    ASSERT_EQ(stall->error(), "");
    held = start(*cluster, 1, large, large);
    toucher = stall->wait_for_touch(10s);
    ASSERT_TRUE(toucher.has_value()) << "nothing copied the large room within 10 s";
  }

  const std::vector<uint64_t> large = first_pages(kLargePages);
  const std::vector<uint64_t> small = first_pages(kSmallPages, 32);
  // For a next room while room 1's resumed gather still reads `large`.
  const std::vector<uint64_t> other_pages = first_pages(kLargePages, kLargePages);
  std::unique_ptr<Cluster> cluster;
  std::unique_ptr<PageStall> stall;
  Room held;
  std::optional<pid_t> toucher;
};

TEST_F(StagingCopies, AGatherHeldInTheMiddleHoldsUpNoOtherRoom) {
  ASSERT_NO_FATAL_FAILURE(hold_large_room(staged_spec(), Copy::kGather));
  if (IsSkipped()) return;
  EXPECT_EQ(thread_name(*toucher), "pdkv-copy");

  Room other = start(*cluster, 2, small, small);
  EXPECT_TRUE(poll_until([&] { return received(other); }, 10s))
      << "the small room waited for the large room's gather";
  EXPECT_NE(held.receiver().poll(), PollState::kSuccess) << "succeeded with its gather held";

  stall->release();
  ASSERT_TRUE(poll_until([&] { return received(held); }, 20s))
      << held.receiver().failure().to_string();
  // The sender succeeds once the decode rank's answer is back, just after.
  EXPECT_TRUE(poll_until([&] { return held.sender->poll() == PollState::kSuccess; }, 10s))
      << held.sender->failure().to_string();
  EXPECT_EQ(cluster->verify_pages(1, large, 0), "");
  EXPECT_EQ(cluster->verify_pages(2, small, 0), "");
}

// The staging pools hold one large route: a room that fails while its
// gather is held keeps its slot until the copy is over, and then gives it
// back (a room forgotten earlier would leave the slot taken for good).
TEST_F(StagingCopies, ARoomThatFailsDuringItsGatherGivesItsSlotBackAfterwards) {
  ClusterSpec spec = staged_spec();
  spec.prefill_staging_bytes = spec.decode_staging_bytes = 2 << 20;
  ASSERT_NO_FATAL_FAILURE(hold_large_room(spec, Copy::kGather));
  if (IsSkipped()) return;

  held.sender->abort("the test gives up on it");
  ASSERT_TRUE(poll_until([&] { return held.sender->poll() == PollState::kFailed; }, 10s));
  ASSERT_TRUE(poll_until([&] { return held.receiver().poll() == PollState::kFailed; }, 10s));
  held = {};      // both ends let go while the gather is still held
  stall.reset();  // the gather goes on and ends, reading pages 0-15 meanwhile

  cluster->fill(2, other_pages, 0, {});
  Room next = start(*cluster, 2, other_pages, large);
  ASSERT_TRUE(poll_until([&] { return received(next); }, 10s))
      << "the next room found no staging slot: " << next.receiver().failure().to_string();
  EXPECT_EQ(cluster->verify_pages(2, large, 0), "");
}

// One slot between a room's two destinations: one gathers (held), the
// other waits for the slot. The room fails and both ends let go; when the
// gather ends, its slot goes to the waiter, whose step may end the room
// while the gather's completion still works on it: with the waiters woken
// inline, this test died of a segmentation fault (a use after free).
TEST_F(StagingCopies, AFailedRoomWhoseGatherEndsHandsItsSlotOnSafely) {
  ClusterSpec spec = staged_spec();
  spec.decode_tp = 2;
  spec.prefill_staging_bytes = 1 << 20;  // one destination's route of 16 pages
  ASSERT_NO_FATAL_FAILURE(hold_large_room(spec, Copy::kGather));
  if (IsSkipped()) return;

  held.sender->abort("the test gives up on it");
  ASSERT_TRUE(poll_until([&] { return held.sender->poll() == PollState::kFailed; }, 10s));
  for (auto& receiver : held.receivers) {
    ASSERT_TRUE(poll_until([&] { return receiver->poll() == PollState::kFailed; }, 10s));
  }
  held = {};
  stall.reset();  // the gather ends; the waiting destination wakes

  cluster->fill(2, other_pages, 0, {});
  Room next = start(*cluster, 2, other_pages, large);
  for (auto& receiver : next.receivers) {
    ASSERT_TRUE(poll_until([&] { return receiver->poll() == PollState::kSuccess; }, 20s))
        << receiver->failure().to_string();
  }
  EXPECT_EQ(cluster->verify_pages(2, large, 0), "");
}

TEST_F(StagingCopies, ADecodeRoomIsPublishedFailedOnlyOnceItsScatterIsOver) {
  ASSERT_NO_FATAL_FAILURE(hold_large_room(staged_spec(), Copy::kScatter));
  if (IsSkipped()) return;
  EXPECT_EQ(thread_name(*toucher), "pdkv-copy");

  // The abort reaches the decode loop before anything of the next room
  // does: once that room succeeded, the abort has been handled.
  held.receiver().abort("the test gives up on it");
  Room other = start(*cluster, 2, small, small);
  EXPECT_TRUE(poll_until([&] { return received(other); }, 10s))
      << "the small room waited for the large room's scatter";
  EXPECT_NE(held.receiver().poll(), PollState::kFailed)
      << "published failed while its scatter still writes into its pages";

  stall->release();
  ASSERT_TRUE(poll_until([&] { return held.receiver().poll() == PollState::kFailed; }, 20s));
  EXPECT_NE(held.receiver().failure().message().find("the test gives up on it"), std::string::npos)
      << held.receiver().failure().to_string();
  // The scatter ran to its end before the failure was published.
  EXPECT_EQ(cluster->verify_pages(1, large, 0), "");
  EXPECT_EQ(cluster->verify_pages(2, small, 0), "");
}

}  // namespace
}  // namespace pdkv

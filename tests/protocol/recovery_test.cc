// A peer that pauses (SIGSTOP) past keepalive is declared lost and its rooms
// fail; once it resumes (SIGCONT), new rooms to it succeed again within two
// keepalive periods, with neither side restarted: the lost control link and
// transport connection are replaced, not kept. Real processes, real bytes
// (mooncake), every byte checked against the oracle.
#include <gtest/gtest.h>

#include "support/cluster.h"
#include "support/peer_process.h"

namespace pdkv {
namespace {

using namespace std::chrono_literals;
using testing::Cluster;
using testing::ClusterSpec;
using testing::first_pages;
using testing::PeerProcess;
using testing::poll_until;

constexpr auto kKeepalive = 1000ms;

class Recovery : public ::testing::Test {
 protected:
  void SetUp() override {
    ClusterSpec spec;     // the shape pdkv_test_peer uses: TP 1 on both sides
    spec.prefill_tp = 0;  // the prefill engine is the peer process
    spec.backend = "mooncake";
    spec.timeouts.keepalive = kKeepalive;
    cluster_ = Cluster::start(spec);
    ASSERT_NE(cluster_, nullptr);
    peer_ = std::make_unique<PeerProcess>("prefill", cluster_->bootstrap_address(), 1, "mooncake",
                                          kKeepalive.count());
    ASSERT_TRUE(peer_->ready());
  }

  // One room served by the peer, received here: "" when it succeeded with
  // every byte right, else what went wrong.
  std::string room(RoomId id) {
    const auto dst = first_pages(4, 8);
    cluster_->fill(id, {}, 0, {});  // decode pools back to "untouched"
    auto rx = std::move(cluster_->decode[0]->receiver(id, "prefill")).value();
    if (!rx->init().is_ok() || !rx->send_metadata(dst).is_ok()) return "refused";
    const std::string served = peer_->serve(id);
    if (!poll_until(
            [&] { return rx->poll() == PollState::kSuccess || rx->poll() == PollState::kFailed; },
            20s)) {
      return "room did not end";
    }
    if (rx->poll() == PollState::kFailed) return "failed: " + rx->failure().message();
    if (served != "ok") return "prefill said " + served;
    return cluster_->verify(id, dst, 0, {});
  }

  std::unique_ptr<Cluster> cluster_;
  std::unique_ptr<PeerProcess> peer_;
};

TEST_F(Recovery, PausedPeerIsLostThenServesNewRoomsAfterItResumes) {
  ASSERT_EQ(room(2), "");
  // A room in flight when the peer stops answering.
  auto rx = std::move(cluster_->decode[0]->receiver(1, "prefill")).value();
  ASSERT_TRUE(rx->init().is_ok());
  ASSERT_TRUE(rx->send_metadata(first_pages(4, 12)).is_ok());
  ASSERT_TRUE(poll_until([&] { return rx->poll() == PollState::kTransferring; }));
  peer_->pause();
  ASSERT_TRUE(poll_until([&] { return rx->poll() == PollState::kFailed; }, 10s))
      << "room still " << poll_state_name(rx->poll()) << " with its source paused";
  EXPECT_NE(rx->failure().message().find("control connection to prefill dp 0 tp 0 pp 0"),
            std::string::npos)
      << rx->failure().message();
  peer_->resume();
  const auto resumed = std::chrono::steady_clock::now();
  // New rooms, one after another, until one succeeds: within two keepalive
  // periods of the resumption...
  std::string last;
  RoomId id = 10;
  while ((last = room(id++)) != "") {
    ASSERT_LT(std::chrono::steady_clock::now() - resumed, 2 * kKeepalive)
        << "no room succeeded within two keepalive periods; last: " << last;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - resumed, 2 * kKeepalive);
  // ...and every room after that one succeeds too.
  for (int i = 0; i < 3; ++i) EXPECT_EQ(room(id++), "");
}

}  // namespace
}  // namespace pdkv

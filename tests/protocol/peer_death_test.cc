// A peer engine in another process, killed with SIGKILL mid-room: the
// survivor's room fails within 2 s, with a reason naming the peer, through
// the control connection (no request timeout is involved: they are 2 min).
#include <gtest/gtest.h>

#include <numeric>

#include "support/cluster.h"
#include "support/peer_process.h"

namespace pdkv {
namespace {

using namespace std::chrono_literals;
using testing::Cluster;
using testing::ClusterSpec;
using testing::poll_until;

using testing::PeerProcess;

ClusterSpec one_side(bool with_prefill) {
  ClusterSpec spec;  // the shape pdkv_test_peer uses: TP 1 on both sides
  if (with_prefill) {
    spec.decode_tp = 0;  // no decode engine here: it lives in the peer process
  } else {
    spec.prefill_tp = 0;
  }
  return spec;
}

TEST(PeerDeath, KilledPrefillFailsTheDecodeRoomNamingIt) {
  auto c = Cluster::start(one_side(false));
  ASSERT_NE(c, nullptr);
  PeerProcess prefill("prefill", c->bootstrap_address(), 77);
  ASSERT_TRUE(prefill.ready());
  auto rx = std::move(c->decode[0]->receiver(77, "prefill")).value();
  ASSERT_TRUE(rx->init().is_ok());
  std::vector<uint64_t> pages(4);
  std::iota(pages.begin(), pages.end(), 0);
  ASSERT_TRUE(rx->send_metadata(pages).is_ok());
  ASSERT_TRUE(poll_until([&] { return rx->poll() == PollState::kTransferring; }));
  prefill.kill_now();
  const auto killed = std::chrono::steady_clock::now();
  ASSERT_TRUE(poll_until([&] { return rx->poll() == PollState::kFailed; }, 2s))
      << "room still " << poll_state_name(rx->poll()) << " 2 s after the prefill was killed";
  EXPECT_LT(std::chrono::steady_clock::now() - killed, 2s);
  EXPECT_EQ(rx->failure().code(), StatusCode::kUnavailable);
  EXPECT_NE(rx->failure().message().find("control connection to prefill dp 0 tp 0 pp 0 ("),
            std::string::npos)
      << rx->failure().message();
}

TEST(PeerDeath, KilledDecodeFailsThePrefillRoomNamingIt) {
  auto c = Cluster::start(one_side(true));
  ASSERT_NE(c, nullptr);
  PeerProcess decode("decode", c->bootstrap_address(), 78);
  ASSERT_TRUE(decode.ready());
  auto tx = std::move(c->prefill[0]->sender(78, "decode")).value();
  ASSERT_TRUE(tx->init(4).is_ok());
  // The peer's metadata is in: the sender waits for its pages.
  ASSERT_TRUE(poll_until([&] { return tx->poll() == PollState::kWaitingForInput; }));
  decode.kill_now();
  ASSERT_TRUE(poll_until([&] { return tx->poll() == PollState::kFailed; }, 2s))
      << "room still " << poll_state_name(tx->poll()) << " 2 s after the decode was killed";
  EXPECT_NE(tx->failure().message().find("control connection to decode dp 0 tp 0 pp 0 ("),
            std::string::npos)
      << tx->failure().message();
  // Once no room needs the lost peer, it is forgotten: links do not pile up.
  EXPECT_EQ(c->prefill[0]->stats().peers, 1u);
  tx.reset();
  EXPECT_TRUE(poll_until([&] { return c->prefill[0]->stats().peers == 0; }));
}

TEST(PeerDeath, RestartedPrefillReplacesItsOldIncarnation) {
  auto c = Cluster::start(one_side(false));
  ASSERT_NE(c, nullptr);
  std::vector<uint64_t> pages(4);
  std::iota(pages.begin(), pages.end(), 0);
  auto old_room = [&] {
    PeerProcess first("prefill", c->bootstrap_address(), 80);
    EXPECT_TRUE(first.ready());
    auto rx = std::move(c->decode[0]->receiver(80, "prefill")).value();
    EXPECT_TRUE(rx->init().is_ok());
    EXPECT_TRUE(rx->send_metadata(pages).is_ok());
    EXPECT_TRUE(poll_until([&] { return rx->poll() == PollState::kTransferring; }));
    first.kill_now();
    EXPECT_TRUE(poll_until([&] { return rx->poll() == PollState::kFailed; }, 2s));
    return rx;
  }();
  // The same rank comes back (a new process, a new incarnation) and serves a new room.
  PeerProcess second("prefill", c->bootstrap_address(), 81);
  ASSERT_TRUE(second.ready());
  auto rx = std::move(c->decode[0]->receiver(81, "prefill")).value();
  ASSERT_TRUE(rx->init().is_ok());
  ASSERT_TRUE(rx->send_metadata(pages).is_ok());
  ASSERT_TRUE(poll_until([&] { return rx->poll() == PollState::kTransferring; }))
      << rx->failure().to_string();
  EXPECT_EQ(old_room->poll(), PollState::kFailed);  // never resurrected by the new incarnation
}

}  // namespace
}  // namespace pdkv

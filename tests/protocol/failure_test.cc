// Aborts from either side and every timeout: the room fails on both sides
// with a reason that says who and why, and rooms not involved still succeed.
#include <gtest/gtest.h>

#include <numeric>

#include "support/rooms.h"

namespace pdkv {
namespace {

using namespace std::chrono_literals;
using testing::Cluster;
using testing::ClusterSpec;
using testing::first_pages;
using testing::poll_until;
using testing::shape;

bool ended(PollState s) { return testing::ClusterRoom::terminal(s); }
using Room = testing::ClusterRoom;
using testing::open_room;

TEST(Abort, PrefillAbortFailsItsDestinationsOnly) {
  auto c = Cluster::start(shape(8, 2, 4));  // prefill 0 -> decode 0, 1; prefill 1 -> decode 2, 3
  ASSERT_NE(c, nullptr);
  Room r = open_room(*c, 7, 3);
  r.senders[0]->abort("out of KV memory");
  ASSERT_TRUE(r.senders[1]->send(first_pages(3), true).is_ok());
  ASSERT_TRUE(poll_until([&] {
    for (auto& x : r.receivers)
      if (!ended(x->poll())) return false;
    return true;
  }));
  for (int d : {0, 1}) {
    EXPECT_EQ(r.receivers[d]->poll(), PollState::kFailed);
    EXPECT_EQ(r.receivers[d]->failure().code(), StatusCode::kAborted);
    EXPECT_NE(r.receivers[d]->failure().message().find("prefill dp 0 tp 0 pp 0 aborted room 7: out "
                                                       "of KV memory"),
              std::string::npos)
        << r.receivers[d]->failure().message();
  }
  EXPECT_EQ(r.receivers[2]->poll(), PollState::kSuccess);
  EXPECT_EQ(r.receivers[3]->poll(), PollState::kSuccess);
  EXPECT_EQ(r.senders[0]->poll(), PollState::kFailed);
  EXPECT_EQ(r.senders[0]->send(first_pages(3), true).code(), StatusCode::kAborted);
}

TEST(Abort, DecodeAbortIsAcknowledgedAndStopsTheSources) {
  auto c = Cluster::start(shape(8, 4, 2));  // prefill 0, 1 -> decode 0; 2, 3 -> decode 1
  ASSERT_NE(c, nullptr);
  Room r = open_room(*c, 9, 4);
  for (auto& s : r.senders) ASSERT_TRUE(s->send(first_pages(2), false).is_ok());
  r.receivers[0]->abort("client disconnected");  // returns at once
  // kFailed once every source acknowledged that none of its writes is in flight.
  ASSERT_TRUE(poll_until([&] { return r.receivers[0]->poll() == PollState::kFailed; }));
  // The sources of decode 0 fail the room and take no more pages.
  for (int p : {0, 1}) {
    ASSERT_TRUE(poll_until([&] { return r.senders[p]->poll() == PollState::kFailed; }));
    EXPECT_EQ(r.senders[p]->poll(), PollState::kFailed);
    EXPECT_NE(r.senders[p]->failure().message().find("decode dp 0 tp 0 pp 0 aborted room 9: client "
                                                     "disconnected"),
              std::string::npos)
        << r.senders[p]->failure().message();
    EXPECT_FALSE(r.senders[p]->send(first_pages(2, 2), true).is_ok());
  }
  // Decode 1's sources are untouched and finish.
  for (int p : {2, 3}) ASSERT_TRUE(r.senders[p]->send(first_pages(2, 2), true).is_ok());
  ASSERT_TRUE(poll_until([&] { return ended(r.receivers[1]->poll()); }));
  EXPECT_EQ(r.receivers[1]->poll(), PollState::kSuccess) << r.receivers[1]->failure().to_string();
}

TEST(Abort, ClosingAnOpenReceiverAbortsItsSources) {
  auto c = Cluster::start(shape(8, 1, 1));
  ASSERT_NE(c, nullptr);
  Room r = open_room(*c, 11, 2);
  // The metadata is in: the sender waits for its pages.
  ASSERT_TRUE(poll_until([&] { return r.senders[0]->poll() == PollState::kWaitingForInput; }));
  r.receivers.clear();
  ASSERT_TRUE(poll_until([&] { return r.senders[0]->poll() == PollState::kFailed; }));
  EXPECT_NE(r.senders[0]->failure().message().find("room 11 closed by its receiver"),
            std::string::npos)
      << r.senders[0]->failure().message();
}

TEST(Room, PrefillRankWithoutDestinationConcludesAtOnce) {
  // 2 heads over prefill TP 4 to decode TP 1: head 0 is on prefill 0 and 1,
  // head 1 on 2 and 3; decode 0 is written by replicas 0 and 2 only.
  auto c = Cluster::start(shape(2, 4, 1));
  ASSERT_NE(c, nullptr);
  std::vector<std::unique_ptr<Sender>> tx;
  for (auto& e : c->prefill) {
    tx.push_back(std::move(e->sender(14, "decode")).value());
    ASSERT_TRUE(tx.back()->init(2).is_ok());
  }
  // No decode rank has said anything about room 14.
  // Ranks 1 and 3 are done; 0 and 2 wait for decode 0's metadata (until it
  // arrives, a sender is Bootstrapping).
  ASSERT_TRUE(poll_until([&] {
    return tx[1]->poll() == PollState::kSuccess && tx[3]->poll() == PollState::kSuccess &&
           tx[0]->poll() == PollState::kBootstrapping && tx[2]->poll() == PollState::kBootstrapping;
  })) << poll_state_name(tx[0]->poll())
      << " " << poll_state_name(tx[1]->poll()) << " " << poll_state_name(tx[2]->poll()) << " "
      << poll_state_name(tx[3]->poll());
}

TEST(Timeout, DecodeWaitingForData) {
  ClusterSpec spec = shape(8, 2, 1);
  // Long enough for prefill 1 to report (sanitizer builds are slow).
  spec.timeouts.waiting_for_data = 1500ms;
  auto c = Cluster::start(spec);
  ASSERT_NE(c, nullptr);
  auto rx = std::move(c->decode[0]->receiver(5, "prefill")).value();
  ASSERT_TRUE(rx->init().is_ok());
  ASSERT_TRUE(rx->send_metadata(first_pages(2)).is_ok());
  // Only prefill 1 ever sends; prefill 0 never opens the room.
  auto tx = std::move(c->prefill[1]->sender(5, "decode")).value();
  ASSERT_TRUE(tx->init(2).is_ok());
  ASSERT_TRUE(tx->send(first_pages(2), true).is_ok());
  ASSERT_TRUE(poll_until([&] { return rx->poll() == PollState::kFailed; }, 5s));
  EXPECT_EQ(rx->failure().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(rx->failure().message(),
            "room 5: [prefill dp 0 tp 0 pp 0] did not report within 1500 ms");
}

TEST(Timeout, PrefillWaitingForMetadata) {
  ClusterSpec spec = shape(8, 1, 2);
  spec.timeouts.waiting_for_data = 300ms;
  spec.decode_timeouts = Timeouts{};  // the decode side waits long: the prefill times out first
  auto c = Cluster::start(spec);
  ASSERT_NE(c, nullptr);
  auto tx = std::move(c->prefill[0]->sender(6, "decode")).value();
  ASSERT_TRUE(tx->init(2).is_ok());
  auto rx = std::move(c->decode[1]->receiver(6, "prefill")).value();  // decode 0 never comes
  ASSERT_TRUE(rx->init().is_ok());
  ASSERT_TRUE(rx->send_metadata(first_pages(2)).is_ok());
  ASSERT_TRUE(poll_until([&] { return tx->poll() == PollState::kFailed; }, 5s));
  EXPECT_EQ(tx->failure().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(tx->failure().message(),
            "room 6: no metadata from [decode dp 0 tp 0 pp 0] within 300 ms");
  // The decode rank that did send metadata learns of it.
  ASSERT_TRUE(poll_until([&] { return rx->poll() == PollState::kFailed; }, 5s));
  EXPECT_NE(rx->failure().message().find("no metadata from"), std::string::npos);
}

TEST(Timeout, Bootstrap) {
  ClusterSpec spec = shape(8, 1, 1);
  spec.timeouts.bootstrap = 300ms;
  auto c = Cluster::start(spec);
  ASSERT_NE(c, nullptr);
  auto rx = std::move(c->decode[0]->receiver(8, "no-such-engine")).value();
  ASSERT_TRUE(rx->init().is_ok());
  ASSERT_TRUE(poll_until([&] { return rx->poll() == PollState::kFailed; }, 5s));
  EXPECT_EQ(rx->failure().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(rx->failure().message().find("topology of engine 'no-such-engine' dp 0 not complete "
                                         "after 300 ms; last answer: "),
            std::string::npos)
      << rx->failure().message();
}

TEST(Timeout, DataBeforeBootstrapSaysWhatTheServiceLastAnswered) {
  // The room gives up first (data timeout) while the lookup still retries:
  // its reason carries the bootstrap service's latest refusal.
  ClusterSpec spec = shape(8, 1, 1);
  spec.timeouts.bootstrap = 30s;
  spec.timeouts.waiting_for_data = 300ms;
  auto c = Cluster::start(spec);
  ASSERT_NE(c, nullptr);
  auto rx = std::move(c->decode[0]->receiver(9, "no-such-engine")).value();
  ASSERT_TRUE(rx->init().is_ok());
  ASSERT_TRUE(rx->send_metadata(first_pages(2)).is_ok());  // the data timeout runs from here
  ASSERT_TRUE(poll_until([&] { return rx->poll() == PollState::kFailed; }, 5s));
  EXPECT_EQ(rx->failure().code(), StatusCode::kDeadlineExceeded);
  const std::string expected =
      "room 9: prefill engine 'no-such-engine' not found within 300 ms (the bootstrap "
      "service's last answer: bootstrap ";
  EXPECT_EQ(rx->failure().message().substr(0, expected.size()), expected)
      << rx->failure().message();
  EXPECT_NE(rx->failure().message().find("no rank of engine 'no-such-engine' dp 0 has registered)"),
            std::string::npos)
      << rx->failure().message();
}

TEST(Timeout, TransferNeverVisible) {
  ClusterSpec spec = shape(8, 1, 1);
  spec.timeouts.transfer = 300ms;
  spec.prefill_transport = {{"stall", "1"}};  // writes are posted but never complete
  auto c = Cluster::start(spec);
  ASSERT_NE(c, nullptr);
  Room r = open_room(*c, 12, 2);
  ASSERT_TRUE(r.senders[0]->send(first_pages(2), true).is_ok());
  ASSERT_TRUE(poll_until([&] { return r.senders[0]->poll() == PollState::kFailed; }, 5s));
  EXPECT_EQ(r.senders[0]->failure().message(),
            "room 12: transfer to [decode dp 0 tp 0 pp 0] not complete within 300 ms");
  ASSERT_TRUE(poll_until([&] { return r.receivers[0]->poll() == PollState::kFailed; }, 5s));
  EXPECT_EQ(r.receivers[0]->failure().code(), StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace pdkv

// Success over the data plane (docs/protocol.md): a source's last batch to a
// decode rank carries its success report as a transport notification, and
// the decode room succeeds once that arrives; the source's RoomStatus call
// follows and confirms its Sender's success.
//
// Over the loopback transport, a notification is queued at the receiver and
// announced inside the write itself, before the source can even see its
// batch end, so the notice reaches the decode loop before the call: these
// tests see the notice path every time, not by chance.
#include <gtest/gtest.h>

#include "bootstrap/client.h"
#include "engine/routing.h"
#include "pdkv.grpc.pb.h"
#include "pdkv/faults.h"
#include "support/rooms.h"

namespace pdkv {
namespace {

using namespace std::chrono_literals;
using testing::Cluster;
using testing::ClusterSpec;
using testing::first_pages;
using testing::open_room;
using testing::poll_until;
using testing::shape;

uint64_t notified_reports(const Cluster& c) {
  uint64_t n = 0;
  for (const auto& e : c.decode) n += e->stats().notified_reports;
  return n;
}

// One room of three pages through every rank, checked at both ends.
void run_room(Cluster& c, RoomId id) {
  c.fill(id, first_pages(3), 0, {});
  auto r = open_room(c, id, 3, /*send=*/true);
  ASSERT_TRUE(poll_until([&] { return r.ended(); }));
  for (auto& rx : r.receivers)
    EXPECT_EQ(rx->poll(), PollState::kSuccess) << rx->failure().to_string();
  for (auto& tx : r.senders)
    EXPECT_EQ(tx->poll(), PollState::kSuccess) << tx->failure().to_string();
  EXPECT_EQ(c.verify(id, first_pages(3, 8), 0, {}), "") << "room " << id;
}

TEST(SuccessNotices, RoomsSucceedFromTheirNoticesAndSendersFromTheConfirmation) {
  for (Staging staging : {Staging::kOff, Staging::kOn}) {
    SCOPED_TRACE(staging == Staging::kOn ? "staged" : "direct");
    // 2 -> 4 over 8 heads: each decode rank has one source (4 heads at a
    // prefill rank, 2 at a decode rank), so a room has four notices.
    ClusterSpec spec = shape(8, 2, 4);
    spec.staging = staging;
    auto c = Cluster::start(spec);
    ASSERT_NE(c, nullptr);
    constexpr RoomId kRooms = 5;
    for (RoomId id = 1; id <= kRooms; ++id) run_room(*c, id);
    EXPECT_EQ(notified_reports(*c), 4 * kRooms);
  }
}

TEST(SuccessNotices, WithoutNotificationsEverySuccessTravelsByItsCall) {
  ClusterSpec spec = shape(8, 2, 4);
  spec.prefill_transport = spec.decode_transport = {{"notifications", "0"}};
  auto c = Cluster::start(spec);
  ASSERT_NE(c, nullptr);
  run_room(*c, 1);
  EXPECT_EQ(notified_reports(*c), 0u);
}

// The decode room succeeds on the notice; the receiver is closed at once, as
// a server does once it took the KV. The source's call must still find the
// room, or its Sender would fail a transfer that fully arrived.
TEST(SuccessNotices, AReceiverClosedAtItsSuccessStillConfirmsItsSender) {
  ClusterSpec spec = shape(8, 1, 1);
  auto c = Cluster::start(spec);
  ASSERT_NE(c, nullptr);
  constexpr RoomId kRooms = 20;
  for (RoomId id = 1; id <= kRooms; ++id) {
    c->fill(id, first_pages(2), 0, {});
    auto r = open_room(*c, id, 2, /*send=*/true);
    ASSERT_TRUE(poll_until([&] { return testing::ClusterRoom::terminal(r.receivers[0]->poll()); }));
    ASSERT_EQ(r.receivers[0]->poll(), PollState::kSuccess) << r.receivers[0]->failure().to_string();
    EXPECT_EQ(c->verify(id, first_pages(2, 8), 0, {}), "") << "room " << id;
    r.receivers.clear();  // closed
    ASSERT_TRUE(poll_until([&] { return r.ended(); }));
    EXPECT_EQ(r.senders[0]->poll(), PollState::kSuccess)
        << "room " << id << ": " << r.senders[0]->failure().to_string();
  }
  EXPECT_EQ(notified_reports(*c), kRooms);
}

// A Sender that fails while its last batch, which carries the notice, is in
// flight sees kFailed only once that batch ended: an application reuses a
// failed Sender's pages at once, and a notice that lands after says the
// bytes it read are the room's. Here the batch is handed to the transport
// 300 ms late, the Sender is aborted meanwhile, and its pages are overwritten
// the moment it reports kFailed.
TEST(SuccessNotices, ASenderFailedWhileItsNoticeIsInFlightIsFailedOnceTheBatchEnded) {
  ClusterSpec spec = shape(8, 1, 1);
  spec.prefill_faults = parse_faults({"delay_us=300000"}).value();
  auto c = Cluster::start(spec);
  ASSERT_NE(c, nullptr);
  c->fill(3, first_pages(2), 0, {});
  auto r = open_room(*c, 3, 2, /*send=*/true);
  ASSERT_TRUE(poll_until([&] { return c->prefill[0]->stats().batches_in_flight == 1; }));
  r.senders[0]->abort("client went away");
  ASSERT_TRUE(poll_until([&] { return r.senders[0]->poll() == PollState::kFailed; }));
  EXPECT_EQ(c->prefill[0]->stats().batches_in_flight, 0u)
      << "failed while its notice batch was still in flight";
  for (auto& buffer : c->prefill_memory[0].kv)
    std::fill(buffer.begin(), buffer.end(), std::byte{0xee});
  // The notice landed with the room's own bytes: the decode room succeeded,
  // and the source's failure report after it changed nothing there.
  ASSERT_TRUE(poll_until([&] { return r.ended(); }));
  EXPECT_EQ(r.receivers[0]->poll(), PollState::kSuccess) << r.receivers[0]->failure().to_string();
  EXPECT_EQ(c->verify(3, first_pages(2, 8), 0, {}), "");
}

// Notifications reach a decode rank from anything that can reach its data
// plane; those that are not a success report of one of its rooms' sources
// are dropped, and change no room. (A well-formed one from a peer that holds
// the cluster's secret is taken, as its RoomStatus call would be: the data
// plane is trusted as far as the control plane, docs/security.md.)
// A batch that carries the notice and fails, but drains for long (as mori's
// do while libfabric holds their operations), will not deliver its notice:
// the Sender's failure is published then, not once the drain is over.
TEST(SuccessNotices, AFailingBatchWithTheNoticeLetsTheFailureOutBeforeItsDrainEnds) {
  ClusterSpec spec = shape(8, 1, 1);
  spec.prefill_faults = parse_faults({"fail_batch=1", "drain_us=60000000", "seed=1"}).value();
  auto c = Cluster::start(spec);
  ASSERT_NE(c, nullptr);
  c->fill(1, first_pages(2), 0, {});
  auto r = open_room(*c, 1, 2, /*send=*/true);
  ASSERT_TRUE(poll_until([&] { return r.senders[0]->poll() == PollState::kFailed; }, 10s))
      << poll_state_name(r.senders[0]->poll());
  EXPECT_NE(r.senders[0]->failure().message().find("injected fault (fail_batch)"),
            std::string::npos)
      << r.senders[0]->failure().message();
  EXPECT_EQ(c->prefill[0]->stats().batches_in_flight, 1u);  // a minute of drain ahead
}

TEST(SuccessNotices, NoticesThatAreNoSourcesSuccessAreDropped) {
  ClusterSpec spec = shape(8, 1, 1);
  auto c = Cluster::start(spec);
  ASSERT_NE(c, nullptr);
  bootstrap::Client client(c->bootstrap_address(), Security{});
  const proto::RankInfo prefill = client.topology("prefill", 0, 2s).value().at(0);
  const proto::RankInfo decode = client.topology("decode", 0, 2s).value().at(0);
  auto stranger = create_transport("loopback", {}).value();
  const PeerId peer = stranger->connect(decode.transport_descriptor()).value();

  c->fill(7, first_pages(2), 0, {});
  auto rx = std::move(c->decode[0]->receiver(7, spec.prefill_id)).value();
  ASSERT_TRUE(rx->init().is_ok());
  ASSERT_TRUE(rx->send_metadata(first_pages(2, 8)).is_ok());
  ASSERT_TRUE(poll_until([&] { return rx->poll() == PollState::kTransferring; }));

  proto::RoomStatus good;
  good.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  good.set_room(7);
  *good.mutable_prefill() = engine::ref_of(prefill);
  good.set_success(true);
  good.set_bytes(1);
  std::vector<std::string> bad = {"\xff\xff\xff not a message"};
  auto variant = [&](auto change) {
    proto::RoomStatus s = good;
    change(s);
    bad.push_back(s.SerializeAsString());
  };
  variant([](proto::RoomStatus& s) { s.set_success(false); });
  variant([](proto::RoomStatus& s) { s.set_protocol_version(999); });
  variant([](proto::RoomStatus& s) { s.set_room(8); });  // not open here
  variant([](proto::RoomStatus& s) { s.mutable_prefill()->set_tp_rank(3); });
  variant([](proto::RoomStatus& s) { s.mutable_prefill()->set_engine_id("other"); });
  variant([](proto::RoomStatus& s) {
    s.mutable_prefill()->set_incarnation(s.prefill().incarnation() + 1);
  });
  for (const std::string& notice : bad) {
    ASSERT_TRUE(stranger->write_and_notify(peer, {}, notice).is_ok());
  }
  // A barrier: a well-formed notice for another room, taken after those
  // (the loop takes notifications in arrival order).
  auto barrier = std::move(c->decode[0]->receiver(9, spec.prefill_id)).value();
  ASSERT_TRUE(barrier->init().is_ok());
  ASSERT_TRUE(barrier->send_metadata(first_pages(1, 12)).is_ok());
  ASSERT_TRUE(poll_until([&] { return barrier->poll() == PollState::kTransferring; }));
  proto::RoomStatus other = good;
  other.set_room(9);
  ASSERT_TRUE(stranger->write_and_notify(peer, {}, other.SerializeAsString()).is_ok());
  ASSERT_TRUE(poll_until([&] { return barrier->poll() == PollState::kSuccess; }));
  EXPECT_EQ(rx->poll(), PollState::kTransferring) << "a bad notice was taken for room 7";
  EXPECT_EQ(notified_reports(*c), 1u);
  // Its source's call, when it comes, is the confirmation.
  auto barrier_tx = std::move(c->prefill[0]->sender(9, spec.decode_id)).value();
  ASSERT_TRUE(barrier_tx->init(1).is_ok());
  ASSERT_TRUE(barrier_tx->send(first_pages(1, 3), true).is_ok());
  ASSERT_TRUE(poll_until([&] { return barrier_tx->poll() == PollState::kSuccess; }))
      << barrier_tx->failure().to_string();

  // Room 7 itself is untouched by them, and completes as any room does.
  auto tx = std::move(c->prefill[0]->sender(7, spec.decode_id)).value();
  ASSERT_TRUE(tx->init(2).is_ok());
  ASSERT_TRUE(tx->send(first_pages(2), true).is_ok());
  ASSERT_TRUE(poll_until([&] { return rx->poll() == PollState::kSuccess; }))
      << rx->failure().to_string();
  ASSERT_TRUE(poll_until([&] { return tx->poll() == PollState::kSuccess; }))
      << tx->failure().to_string();
  EXPECT_EQ(c->verify_pages(7, first_pages(2, 8), 0), "");
  EXPECT_EQ(rx->metrics().bytes, tx->metrics().bytes);
  EXPECT_EQ(notified_reports(*c), 2u);  // room 7's own notice: room 9's was dropped (reported)
}

}  // namespace
}  // namespace pdkv

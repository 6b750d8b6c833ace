// Regressions for the engine core's defects (issue: engine core, second
// edition, part 1). Each test failed on the engine before the rebuild: a
// failed batch counted as delivered, callbacks deadlocked the progress
// thread, a late report scattered into reused pages, aborts and lookups
// blocked control traffic, staging slots were reserved that could never be
// filled or were reused while a source could still write.
#include <gtest/gtest.h>

#include "bootstrap/client.h"
#include "engine/routing.h"
#include "pdkv.grpc.pb.h"
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

bool contains(const Status& s, const std::string& text) {
  return s.message().find(text) != std::string::npos;
}

TEST(EngineCore, FailedBatchFailsTheRoomAtBothEndsWithTheTransportsReason) {
  ClusterSpec spec = shape(8, 1, 1);
  spec.prefill_faults = parse_faults({"fail_batch=1", "seed=1"}).value();
  auto c = Cluster::start(spec);
  ASSERT_NE(c, nullptr);
  auto r = open_room(*c, 1, 3, /*send=*/true);
  ASSERT_TRUE(poll_until([&] { return r.ended(); }));
  // Half of the bytes moved: never a success.
  EXPECT_EQ(r.senders[0]->poll(), PollState::kFailed);
  EXPECT_TRUE(contains(r.senders[0]->failure(),
                       "room 1: write to decode dp 0 tp 0 pp 0: "
                       "injected fault (fail_batch): batch failed after"))
      << r.senders[0]->failure().to_string();
  EXPECT_EQ(r.receivers[0]->poll(), PollState::kFailed);
  EXPECT_TRUE(contains(r.receivers[0]->failure(),
                       "prefill dp 0 tp 0 pp 0 failed room 1: room 1: write to decode dp 0 tp 0 "
                       "pp 0: injected fault (fail_batch)"))
      << r.receivers[0]->failure().to_string();
}

TEST(EngineCore, TransportCallbacksFromInsideItsCallsNeverDeadlock) {
  // As nixl and mori do: connect() waits on a backend thread that is
  // delivering a peer failure, and write() delivers one inline.
  ClusterSpec spec = shape(8, 2, 2);
  spec.prefill_transport = {{"callback_in_connect", "1"}, {"callback_in_write", "1"}};
  auto c = Cluster::start(spec);
  ASSERT_NE(c, nullptr);
  c->fill(2, first_pages(3), 0, {});
  auto r = open_room(*c, 2, 3, /*send=*/true);
  ASSERT_TRUE(poll_until([&] { return r.ended(); }));
  for (auto& rx : r.receivers)
    EXPECT_EQ(rx->poll(), PollState::kSuccess) << rx->failure().to_string();
  EXPECT_EQ(c->verify(2, first_pages(3, 8), 0, {}), "");
}

TEST(EngineCore, CallbacksDuringTeardownAreHarmless) {
  // A backend thread calls back every 100 µs while the engines go away.
  ClusterSpec spec = shape(8, 1, 2);
  spec.prefill_transport = spec.decode_transport = {{"callback_storm", "1"}};
  auto c = Cluster::start(spec);
  ASSERT_NE(c, nullptr);
  c->fill(3, first_pages(2), 0, {});
  auto r = open_room(*c, 3, 2, /*send=*/true);
  ASSERT_TRUE(poll_until([&] { return r.ended(); }));
  for (auto& rx : r.receivers) EXPECT_EQ(rx->poll(), PollState::kSuccess);
  EXPECT_EQ(c->verify(3, first_pages(2, 8), 0, {}), "");
  c.reset();  // a use after free here is what the sanitizer runs catch
}

TEST(EngineCore, AbortReturnsAtOnceAndFailsOnceTheSourcesAcknowledge) {
  ClusterSpec spec = shape(8, 1, 1);
  spec.prefill_faults = parse_faults({"stall_batch=1", "seed=1"}).value();
  spec.timeouts.transfer = 800ms;  // a stalled batch is ended after this
  auto c = Cluster::start(spec);
  ASSERT_NE(c, nullptr);
  auto r = open_room(*c, 4, 3, /*send=*/true);
  ASSERT_TRUE(poll_until([&] { return c->prefill[0]->stats().batches_in_flight == 1; }));
  r.receivers[0]->abort("client went away");
  // Returned without waiting: the source cannot acknowledge while its batch
  // is in flight, so the room is not reported failed yet.
  EXPECT_NE(r.receivers[0]->poll(), PollState::kFailed);
  ASSERT_TRUE(poll_until([&] { return r.receivers[0]->poll() == PollState::kFailed; }, 10s));
  EXPECT_EQ(r.receivers[0]->failure().message(),
            "decode dp 0 tp 0 pp 0 aborted room 4: client went away");
  EXPECT_EQ(c->prefill[0]->stats().batches_in_flight, 0u);  // ended before the acknowledgement
  ASSERT_TRUE(poll_until([&] { return r.senders[0]->poll() == PollState::kFailed; }));
  EXPECT_TRUE(contains(r.senders[0]->failure(), "aborted room 4: client went away"));
}

TEST(EngineCore, LateSuccessReportNeverReachesThePages) {
  ClusterSpec spec = shape(8, 1, 1);
  spec.staging = Staging::kOn;
  auto c = Cluster::start(spec);
  ASSERT_NE(c, nullptr);
  c->fill(5, first_pages(3), 0, {});
  auto rx = std::move(c->decode[0]->receiver(5, "prefill")).value();
  ASSERT_TRUE(rx->init().is_ok());
  ASSERT_TRUE(rx->send_metadata(first_pages(3, 8)).is_ok());
  // The metadata (with a staging slot) is accepted; no Sender ever writes.
  ASSERT_TRUE(poll_until([&] { return rx->poll() == PollState::kTransferring; }));
  // Bytes in the slot, as a late write would leave them.
  std::fill(c->decode_memory[0].staging.begin(), c->decode_memory[0].staging.end(),
            std::byte{0x77});
  rx->abort("gone");
  ASSERT_TRUE(poll_until([&] { return rx->poll() == PollState::kFailed; }));
  // A success report that was on the wire when the abort went out.
  auto prefill =
      bootstrap::Client(c->bootstrap_address(), Security{}).topology("prefill", 0, 2s).value();
  auto decode =
      bootstrap::Client(c->bootstrap_address(), Security{}).topology("decode", 0, 2s).value();
  proto::RoomStatus st;
  st.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  st.set_room(5);
  *st.mutable_prefill() = engine::ref_of(prefill[0]);
  st.set_success(true);
  proto::ControlReply reply;
  grpc::ClientContext ctx;
  const grpc::Status s =
      proto::Control::NewStub(
          grpc::CreateChannel(decode[0].control_address(), grpc::InsecureChannelCredentials()))
          ->ReportStatus(&ctx, st, &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_EQ(c->verify_untouched(), "");  // nothing was scattered
  EXPECT_EQ(rx->poll(), PollState::kFailed);
}

TEST(EngineCore, ControlTrafficIsNotHeldUpBySlowSources) {
  ClusterSpec spec = shape(8, 1, 1);
  spec.kv.num_pages = 32;
  spec.prefill_faults = parse_faults({"delay_us=3000000"}).value();  // every batch 3 s late
  auto c = Cluster::start(spec);
  ASSERT_NE(c, nullptr);
  std::vector<testing::ClusterRoom> slow;
  for (RoomId room = 1; room <= 8; ++room) {
    slow.push_back(open_room(*c, room, 2, /*send=*/true, 2 * room));
  }
  ASSERT_TRUE(poll_until([&] { return c->prefill[0]->stats().batches_in_flight == 8; }));
  // Eight aborts, each answered only once its room's batch has landed...
  for (auto& r : slow) r.receivers[0]->abort("cancelled");
  // ...while a new room's metadata goes through at once.
  auto fresh = open_room(*c, 9, 2, /*send=*/false, 0);
  ASSERT_TRUE(poll_until([&] { return fresh.senders[0]->poll() == PollState::kWaitingForInput; }));
  for (auto& r : slow) EXPECT_NE(r.receivers[0]->poll(), PollState::kFailed);
  for (auto& r : slow) {
    ASSERT_TRUE(poll_until([&] { return r.receivers[0]->poll() == PollState::kFailed; }, 15s));
  }
}

TEST(EngineCore, AStagingSlotTheSourceCannotFillGoesDirect) {
  ClusterSpec spec = shape(8, 1, 1);
  spec.staging = Staging::kOn;
  spec.prefill_staging_bytes = 64;  // far less than a route's 6 KiB
  auto c = Cluster::start(spec);
  ASSERT_NE(c, nullptr);
  c->fill(7, first_pages(3), 0, {});
  auto r = open_room(*c, 7, 3, /*send=*/true);
  ASSERT_TRUE(poll_until([&] { return r.ended(); }));
  EXPECT_EQ(r.receivers[0]->poll(), PollState::kSuccess) << r.receivers[0]->failure().to_string();
  EXPECT_EQ(c->verify(7, first_pages(3, 8), 0, {}), "");
  EXPECT_EQ(c->decode[0]->stats().staged_routes, 0u);
  EXPECT_EQ(c->prefill[0]->stats().direct_routes, 1u);
}

// Room 3 of three pages with auto staging, through TP 1 -> 2 (each decode
// rank has one source) or 2 -> 1 (its one rank has two); every byte
// checked. Either way a route is 4 layers x K/V x 3 pages x 4 tokens = 96
// fragments of 4 heads x 4 x 2 B = 32 B, 3072 bytes. Staging saves 95
// writes and costs the decode rank a scatter of 3072 bytes for each of its
// sources: it pays above 3072 / 95 = 32.3 bytes of overhead per write with
// one source, above 6144 / 95 = 64.7 with two. Returns the routes the
// decode ranks staged.
uint64_t staged_routes_of_one_auto_room(const TransportOptions& prefill,
                                        const TransportOptions& decode, uint32_t prefill_tp = 1,
                                        uint32_t decode_tp = 2) {
  ClusterSpec spec = shape(8, prefill_tp, decode_tp);
  spec.staging = Staging::kAuto;
  spec.prefill_transport = prefill;
  spec.decode_transport = decode;
  auto c = Cluster::start(spec);
  EXPECT_NE(c, nullptr);
  if (c == nullptr) return ~uint64_t{0};
  c->fill(3, first_pages(3), 0, {});
  auto r = open_room(*c, 3, 3, /*send=*/true);
  EXPECT_TRUE(poll_until([&] { return r.ended(); }));
  for (const auto& receiver : r.receivers) {
    EXPECT_EQ(receiver->poll(), PollState::kSuccess) << receiver->failure().to_string();
  }
  EXPECT_EQ(c->verify(3, first_pages(3, 8), 0, {}), "");
  uint64_t staged = 0;
  for (const auto& d : c->decode) staged += d->stats().staged_routes;
  return staged;
}

TEST(EngineCore, AutoStagesWhenTheTransportsWritesCostMoreThanTheScattersItAdds) {
  for (const auto& [overhead, staged] : {std::pair{"32", 0u}, std::pair{"33", 2u}}) {
    SCOPED_TRACE(std::string("1 -> 2, write_overhead_bytes=") + overhead);
    const TransportOptions options = {{"write_overhead_bytes", overhead}};
    EXPECT_EQ(staged_routes_of_one_auto_room(options, options), staged);
  }
  // One decode rank that would scatter for two sources.
  for (const auto& [overhead, staged] : {std::pair{"64", 0u}, std::pair{"65", 2u}}) {
    SCOPED_TRACE(std::string("2 -> 1, write_overhead_bytes=") + overhead);
    const TransportOptions options = {{"write_overhead_bytes", overhead}};
    EXPECT_EQ(staged_routes_of_one_auto_room(options, options, 2, 1), staged);
  }
}

TEST(EngineCore, AutoStagesByWhatAWriteFromThatSourceCosts) {
  // The decode side's transport says one figure for its capability and
  // another for writes from its sources (as a backend with a cheaper path
  // to some peers does): the per-source one counts.
  for (const auto& [capability, from_source, staged] :
       {std::tuple{"32", "33", 2u}, std::tuple{"33", "32", 0u}}) {
    SCOPED_TRACE(std::string("capability ") + capability + ", from the source " + from_source);
    EXPECT_EQ(staged_routes_of_one_auto_room({{"write_overhead_bytes", capability}},
                                             {{"write_overhead_bytes", capability},
                                              {"write_overhead_bytes_from", from_source}}),
              staged);
  }
}

TEST(EngineCore, ClosedReceiversStagingSlotWaitsWhileItsSourceMayWrite) {
  ClusterSpec spec = shape(8, 1, 1);
  spec.staging = Staging::kOn;
  // One route: 4 layers x K/V x 3 pages x (4 tokens x 8 heads x 4 x 2 B).
  spec.decode_staging_bytes = 8 * 3 * 256;
  spec.prefill_faults = parse_faults({"delay_us=1500000"}).value();
  spec.decode_timeouts = spec.timeouts;
  spec.decode_timeouts->transfer = 1ms;  // no timer can stand in for the source's answer
  auto c = Cluster::start(spec);
  ASSERT_NE(c, nullptr);
  auto a = open_room(*c, 10, 3, /*send=*/true, 8);
  ASSERT_TRUE(poll_until([&] { return c->prefill[0]->stats().batches_in_flight == 1; }));
  EXPECT_TRUE(a.receivers[0]->metrics().staged);
  a.receivers.clear();  // closed while its block is still on the way into the slot
  auto b = open_room(*c, 11, 3, /*send=*/true, 0);
  ASSERT_TRUE(poll_until([&] { return b.ended(); }, 15s));
  EXPECT_EQ(b.receivers[0]->poll(), PollState::kSuccess) << b.receivers[0]->failure().to_string();
  // The slot was not free: room 11 went direct.
  EXPECT_FALSE(b.receivers[0]->metrics().staged);
  EXPECT_EQ(c->decode[0]->stats().staged_routes, 1u);
}

}  // namespace
}  // namespace pdkv

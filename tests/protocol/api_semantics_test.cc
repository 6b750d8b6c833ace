// The API semantics inference servers' schedulers expect (SGLang's
// disaggregation/{prefill,decode}.py): a Sender that learns its decode
// engine from the metadata, the poll order SGLang drives, a decode prefix,
// per-room metrics, and learning of changes without polling every room.
#include <gtest/gtest.h>
#include <poll.h>

#include <algorithm>

#include "support/rooms.h"

namespace pdkv {
namespace {

using namespace std::chrono_literals;
using testing::Cluster;
using testing::ClusterSpec;
using testing::first_pages;
using testing::poll_until;
using testing::shape;

struct Sglang {
  std::string name;
  uint32_t heads, prefill_tp, decode_tp;
};
void PrintTo(const Sglang& c, std::ostream* os) { *os << c.name; }

class SglangOrder : public ::testing::TestWithParam<Sglang> {};

// Prefill: sender(room) names no engine; poll() is Bootstrapping until every
// destination's metadata is in, then WaitingForInput; only then init() and
// send(), as SGLang's bootstrap queue does. A rank with nothing to send
// learns the engine from a notice and succeeds.
TEST_P(SglangOrder, SenderLearnsTheEngineAndPollsInSglangsOrder) {
  const Sglang& p = GetParam();
  auto c = Cluster::start(shape(p.heads, p.prefill_tp, p.decode_tp));
  ASSERT_NE(c, nullptr);
  const RoomId room = 21;
  c->fill(room, first_pages(3), 0, {});
  std::vector<std::unique_ptr<Sender>> tx;
  for (auto& e : c->prefill) tx.push_back(std::move(e->sender(room)).value());
  for (auto& s : tx) EXPECT_EQ(s->poll(), PollState::kBootstrapping);
  std::vector<std::unique_ptr<Receiver>> rx;
  for (auto& e : c->decode) {
    rx.push_back(std::move(e->receiver(room, "prefill")).value());
    ASSERT_TRUE(rx.back()->init().is_ok());
  }
  ASSERT_TRUE(poll_until([&] {
    return std::all_of(rx.begin(), rx.end(),
                       [](auto& r) { return r->poll() == PollState::kWaitingForInput; });
  }));
  for (auto& s : tx) EXPECT_EQ(s->poll(), PollState::kBootstrapping);  // no metadata yet
  for (auto& r : rx) ASSERT_TRUE(r->send_metadata(first_pages(3, 8)).is_ok());
  ASSERT_TRUE(poll_until([&] {
    return std::all_of(tx.begin(), tx.end(),
                       [](auto& s) { return s->poll() == PollState::kWaitingForInput; });
  })) << poll_state_name(tx[0]->poll());
  for (auto& s : tx) {
    ASSERT_TRUE(s->init(3).is_ok());
    ASSERT_TRUE(s->send(first_pages(3), true).is_ok());
  }
  ASSERT_TRUE(poll_until([&] {
    for (auto& s : tx)
      if (s->poll() != PollState::kSuccess) return false;
    for (auto& r : rx)
      if (r->poll() != PollState::kSuccess) return false;
    return true;
  })) << tx[0]->failure().to_string()
      << " / " << rx[0]->failure().to_string();
  EXPECT_EQ(c->verify(room, first_pages(3, 8), 0, {}), "");
}

INSTANTIATE_TEST_SUITE_P(Pairs, SglangOrder,
                         ::testing::Values(Sglang{"h8_tp2_to_4", 8, 2, 4},
                                           Sglang{"h8_tp4_to_2", 8, 4, 2},
                                           Sglang{"h2_tp4_to_1_idle_sources", 2, 4, 1}),
                         [](const auto& info) { return info.param.name; });

TEST(SenderEngine, MetadataFromAnotherEngineThanTheSenderNamedIsRefused) {
  ClusterSpec spec = shape(8, 1, 1);
  spec.timeouts.bootstrap = 300ms;
  auto c = Cluster::start(spec);
  ASSERT_NE(c, nullptr);
  auto tx = std::move(c->prefill[0]->sender(22, "other-decode")).value();
  auto rx = std::move(c->decode[0]->receiver(22, "prefill")).value();
  ASSERT_TRUE(rx->init().is_ok());
  ASSERT_TRUE(rx->send_metadata(first_pages(2)).is_ok());
  ASSERT_TRUE(poll_until([&] { return rx->poll() == PollState::kFailed; }));
  EXPECT_EQ(rx->failure().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(rx->failure().message().find("room 22 is bound for engine 'other-decode' dp 0, not "
                                         "decode dp 0 tp 0 pp 0"),
            std::string::npos)
      << rx->failure().message();
  // The Sender itself waits for an engine that never registers.
  ASSERT_TRUE(poll_until([&] { return tx->poll() == PollState::kFailed; }));
  EXPECT_NE(tx->failure().message().find("topology of engine 'other-decode' dp 0 not complete"),
            std::string::npos)
      << tx->failure().message();
}

TEST(DecodePrefix, OnlyThePagesAfterThePrefixTravel) {
  ClusterSpec spec = shape(8, 2, 4);
  spec.aux_items = {16};
  auto c = Cluster::start(spec);
  ASSERT_NE(c, nullptr);
  const RoomId room = 31;
  // A request of 5 pages; the decode ranks hold the first 2 already, and
  // place pages 2..4 at 10..12. The prefill sends its pages 2..4 (here 5..7).
  const auto src_suffix = first_pages(3, 5), dst_suffix = first_pages(3, 10);
  c->fill(room, src_suffix, 1, {});
  std::vector<std::unique_ptr<Receiver>> rx;
  for (auto& e : c->decode) {
    rx.push_back(std::move(e->receiver(room, "prefill")).value());
    ASSERT_TRUE(rx.back()->init().is_ok());
    ASSERT_TRUE(rx.back()->send_metadata(dst_suffix, 2, {}, /*prefix_pages=*/2).is_ok());
  }
  std::vector<std::unique_ptr<Sender>> tx;
  for (auto& e : c->prefill) tx.push_back(std::move(e->sender(room)).value());
  for (auto& s : tx) {
    ASSERT_TRUE(poll_until([&] { return s->poll() == PollState::kWaitingForInput; }));
    EXPECT_EQ(s->decode_prefix_pages(), 2u);  // SGLang's pop_decode_prefix_len, in pages
    ASSERT_TRUE(s->init(3, 1).is_ok());
    ASSERT_TRUE(s->send(src_suffix, true).is_ok());
  }
  ASSERT_TRUE(poll_until([&] {
    for (auto& r : rx)
      if (r->poll() != PollState::kSuccess) return false;
    return true;
  })) << rx[0]->failure().to_string();
  // Pages 2..4 and aux arrived; the prefix pages (and everything else) untouched.
  EXPECT_EQ(c->verify(room, dst_suffix, 2, {}), "");
}

TEST(DecodePrefix, AWholePrefixHitStillSendsAux) {
  ClusterSpec spec = shape(8, 1, 2);
  spec.aux_items = {8, 24};
  auto c = Cluster::start(spec);
  ASSERT_NE(c, nullptr);
  const RoomId room = 32;
  c->fill(room, {}, 3, {});
  std::vector<std::unique_ptr<Receiver>> rx;
  for (auto& e : c->decode) {
    rx.push_back(std::move(e->receiver(room, "prefill")).value());
    ASSERT_TRUE(rx.back()->init().is_ok());
    ASSERT_TRUE(rx.back()->send_metadata({}, 1, {}, /*prefix_pages=*/4).is_ok());
  }
  auto tx = std::move(c->prefill[0]->sender(room)).value();
  ASSERT_TRUE(poll_until([&] { return tx->poll() == PollState::kWaitingForInput; }));
  EXPECT_EQ(tx->decode_prefix_pages(), 4u);
  ASSERT_TRUE(tx->init(0, 3).is_ok());
  ASSERT_TRUE(tx->send({}, true).is_ok());
  ASSERT_TRUE(poll_until([&] { return tx->poll() == PollState::kSuccess; }))
      << tx->failure().to_string();
  for (auto& r : rx) ASSERT_TRUE(poll_until([&] { return r->poll() == PollState::kSuccess; }));
  EXPECT_EQ(c->verify(room, {}, 1, {}), "");
  // Aux alone: each decode rank got 8 + 24 bytes from the one source.
  EXPECT_EQ(tx->metrics().bytes, 2u * 32);
}

TEST(Metrics, BytesLatencyAndStagingPerRoom) {
  ClusterSpec spec = shape(8, 1, 1);
  spec.staging = Staging::kOn;
  auto c = Cluster::start(spec);
  ASSERT_NE(c, nullptr);
  c->fill(41, first_pages(3), 0, {});
  auto r = testing::open_room(*c, 41, 3, /*send=*/true);
  ASSERT_TRUE(poll_until([&] { return r.ended(); }));
  ASSERT_EQ(r.receivers[0]->poll(), PollState::kSuccess);
  // 4 layers x K/V x 3 pages x 256 B (4 tokens x 8 heads x 4 x 2 B), staged as one block.
  const TransferMetrics sent = r.senders[0]->metrics(), received = r.receivers[0]->metrics();
  EXPECT_EQ(sent.bytes, 6144u);
  EXPECT_EQ(received.bytes, 6144u);
  EXPECT_TRUE(sent.staged);
  EXPECT_TRUE(received.staged);
  EXPECT_GT(sent.latency.count(), 0);
  EXPECT_GT(received.latency.count(), 0);
  EXPECT_EQ(received.retries, 0u);
}

TEST(Changes, ListedOnceReadableOnTheFdAndPolledTogether) {
  auto c = Cluster::start(shape(8, 1, 1));
  ASSERT_NE(c, nullptr);
  Engine& decode = *c->decode[0];
  (void)decode.take_changed_rooms();
  std::vector<testing::ClusterRoom> rooms;
  std::vector<RoomId> ids;
  for (RoomId id = 51; id <= 55; ++id) {
    c->fill(id, first_pages(1, id - 51), 0, {});
    rooms.push_back(testing::open_room(*c, id, 1, /*send=*/true, id - 51));
    ids.push_back(id);
  }
  std::vector<RoomId> seen;
  auto all_succeeded = [&] {
    const auto states = decode.poll(ids);
    return std::all_of(states.begin(), states.end(),
                       [](PollState s) { return s == PollState::kSuccess; });
  };
  while (!all_succeeded()) {
    ASSERT_TRUE(decode.wait_for_changes(5s)) << "no room changed state in 5 s";
    pollfd fd{decode.change_fd(), POLLIN, 0};
    EXPECT_EQ(::poll(&fd, 1, 0), 1);  // readable while changes are listed
    for (RoomId id : decode.take_changed_rooms()) seen.push_back(id);
  }
  for (RoomId id : decode.take_changed_rooms()) seen.push_back(id);
  for (RoomId id : ids) EXPECT_NE(std::find(seen.begin(), seen.end(), id), seen.end()) << id;
  pollfd fd{decode.change_fd(), POLLIN, 0};
  EXPECT_EQ(::poll(&fd, 1, 0), 0);  // taken: not readable
  const std::vector<RoomId> unknown = {999};
  EXPECT_EQ(decode.poll(unknown), std::vector<PollState>{PollState::kFailed});
}

}  // namespace
}  // namespace pdkv

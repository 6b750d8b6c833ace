// The fault-injecting decorator (pdkv/faults.h) over the loopback transport:
// each fault does what it says, and a failed batch is over (nothing of it
// lands later). Expected bytes are worked out from the writes by hand.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <tuple>

#include "pdkv/faults.h"
#include "support/poll.h"
#include "support/stub_transport.h"

namespace pdkv {
namespace {

using namespace std::chrono_literals;

struct Pair {
  std::unique_ptr<Transport> sender, receiver;
  std::vector<uint8_t> src = std::vector<uint8_t>(64), dst = std::vector<uint8_t>(64, 0xEE);
  RegionKey src_key = 0, dst_key = 0;
  PeerId peer = 0;
};

Pair make_pair(const FaultSpec& spec) {
  Pair p;
  p.sender = inject_faults(create_transport("loopback").value(), spec);
  p.receiver = create_transport("loopback").value();
  for (size_t i = 0; i < p.src.size(); ++i) p.src[i] = static_cast<uint8_t>(i + 1);
  p.src_key = p.sender->register_region({p.src.data(), p.src.size()}).value();
  p.dst_key = p.receiver->register_region({p.dst.data(), p.dst.size()}).value();
  p.peer = p.sender->connect(p.receiver->descriptor()).value();
  return p;
}

BatchStatus wait_end(Transport& t, BatchId b) {
  BatchStatus st;
  testing::poll_until([&] { return (st = t.poll(b)).state != BatchState::kInProgress; }, 5s);
  return st;
}

TEST(FaultSpec, ParsesEveryKeyAndRefusesNamingThePair) {
  auto spec = parse_faults({"fail_batch=0.25", "stall_batch=0.5", "delay_us=300", "drain_us=7",
                            "fail_connect=1", "seed=42"});
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  EXPECT_EQ(spec->fail_batch, 0.25);
  EXPECT_EQ(spec->stall_batch, 0.5);
  EXPECT_EQ(spec->delay_us, 300u);
  EXPECT_EQ(spec->drain_us, 7u);
  EXPECT_EQ(spec->fail_connect, 1.0);
  EXPECT_EQ(spec->seed, 42u);
  EXPECT_EQ(spec->to_string(),
            "fail_batch=0.25 stall_batch=0.5 delay_us=300 drain_us=7 fail_connect=1 seed=42");
  EXPECT_EQ(parse_faults({"fail_batch=1.5"}).status().message(),
            "fault fail_batch=1.5: expected a probability in [0, 1]");
  EXPECT_EQ(parse_faults({"stall=1"}).status().message(),
            "unknown fault 'stall' (known: fail_batch, stall_batch, delay_us, drain_us, "
            "fail_connect, seed)");
  EXPECT_EQ(parse_faults({"delay_us"}).status().message(), "--fault 'delay_us' is not KEY=VALUE");
  EXPECT_EQ(parse_faults({"fail_batch=0.6", "stall_batch=0.6"}).status().message(),
            "fault fail_batch=0.6 and stall_batch=0.6 add up to more than 1");
  EXPECT_FALSE(parse_faults({}).value().any());
}

TEST(FaultInjection, FailedBatchMovedItsFirstHalfOnly) {
  Pair p = make_pair(parse_faults({"fail_batch=1", "seed=1"}).value());
  // Four writes of 8 bytes: the first two move, the last two never do.
  std::vector<WriteOp> ops;
  for (uint64_t i = 0; i < 4; ++i) ops.push_back({p.src_key, i * 8, p.dst_key, i * 8, 8});
  const BatchStatus st = wait_end(*p.sender, p.sender->write(p.peer, ops).value());
  EXPECT_EQ(st.state, BatchState::kFailed);
  EXPECT_EQ(st.error.message(), "injected fault (fail_batch): batch failed after 16 of 32 bytes");
  // The moved half had landed when the failure was decided: nothing trails,
  // so the receiver need not fence (BatchStatus::may_trail).
  EXPECT_FALSE(st.may_trail);
  for (size_t i = 0; i < 32; ++i) {
    EXPECT_EQ(p.dst[i], i < 16 ? i + 1 : 0xEE) << "byte " << i;
  }
  // One write: its first half.
  const BatchStatus one = wait_end(
      *p.sender,
      p.sender->write(p.peer, std::vector<WriteOp>{{p.src_key, 40, p.dst_key, 40, 10}}).value());
  EXPECT_EQ(one.error.message(), "injected fault (fail_batch): batch failed after 5 of 10 bytes");
  for (size_t i = 40; i < 50; ++i) EXPECT_EQ(p.dst[i], i < 45 ? i + 1 : 0xEE) << "byte " << i;
}

// drain_us: the failed batch first says it failed, while in progress (as
// a backend whose library still holds its operations), then ends.
TEST(FaultInjection, AFailedBatchDrainsWithItsErrorBeforeItEnds) {
  Pair p = make_pair(parse_faults({"fail_batch=1", "drain_us=60000000", "seed=1"}).value());
  const BatchId b =
      p.sender->write(p.peer, std::vector<WriteOp>{{p.src_key, 0, p.dst_key, 0, 8}}).value();
  BatchStatus st;
  ASSERT_TRUE(testing::poll_until([&] { return !(st = p.sender->poll(b)).error.is_ok(); }, 5s));
  EXPECT_EQ(st.state, BatchState::kInProgress);  // a minute of drain ahead
  EXPECT_EQ(st.error.message(), "injected fault (fail_batch): batch failed after 4 of 8 bytes");
  Pair q = make_pair(parse_faults({"fail_batch=1", "drain_us=1000", "seed=1"}).value());
  const BatchStatus ended = wait_end(
      *q.sender,
      q.sender->write(q.peer, std::vector<WriteOp>{{q.src_key, 0, q.dst_key, 0, 8}}).value());
  EXPECT_EQ(ended.state, BatchState::kFailed);
  EXPECT_EQ(ended.error.message(), st.error.message());
}

TEST(FaultInjection, StalledBatchEndsOnlyWhenThePeerFails) {
  Pair p = make_pair(parse_faults({"stall_batch=1", "seed=1"}).value());
  const BatchId b =
      p.sender->write(p.peer, std::vector<WriteOp>{{p.src_key, 0, p.dst_key, 0, 8}}).value();
  for (int i = 0; i < 100; ++i) ASSERT_EQ(p.sender->poll(b).state, BatchState::kInProgress);
  EXPECT_EQ(p.dst[0], 1);  // its bytes moved; only the completion never comes
  p.sender->fail_peer(p.peer, Status::unavailable("cut"));
  const BatchStatus st = p.sender->poll(b);
  EXPECT_EQ(st.state, BatchState::kFailed);
  EXPECT_EQ(st.error.message(), "cut");
}

// A notification is the batch's completion at the peer: a fine batch
// delivers it (also with no bytes), a failed or stalled one never does.
TEST(FaultInjection, OnlyAFineBatchDeliversItsNotification) {
  const std::vector<WriteOp> one_write = {{0, 0, 0, 0, 8}};
  for (const auto& [fault, ops, delivered] :
       std::vector<std::tuple<std::string, std::vector<WriteOp>, bool>>{
           {"fail_batch=0", one_write, true},
           {"fail_batch=0", {}, true},
           {"fail_batch=1", one_write, false},
           {"stall_batch=1", one_write, false}}) {
    SCOPED_TRACE(fault + (ops.empty() ? ", no bytes" : ", 8 bytes"));
    Pair p = make_pair(parse_faults({fault, "delay_us=1", "seed=1"}).value());
    const BatchId b = p.sender->write_and_notify(p.peer, ops, "room 3 done").value();
    for (int i = 0; i < 100; ++i) (void)p.sender->poll(b);  // hands it over, at least
    EXPECT_EQ(p.receiver->take_notifications(),
              delivered ? std::vector<std::string>{"room 3 done"} : std::vector<std::string>{});
  }
}

TEST(FaultInjection, DelayedBatchLandsOnlyAfterTheDelay) {
  Pair p = make_pair(parse_faults({"delay_us=200000"}).value());
  const auto posted = std::chrono::steady_clock::now();
  const BatchId b =
      p.sender->write(p.peer, std::vector<WriteOp>{{p.src_key, 0, p.dst_key, 0, 8}}).value();
  // Nothing lands before the delay, however often it is polled.
  while (std::chrono::steady_clock::now() - posted < 150ms) {
    ASSERT_EQ(p.sender->poll(b).state, BatchState::kInProgress);
    ASSERT_EQ(p.dst[0], 0xEE);
  }
  EXPECT_EQ(wait_end(*p.sender, b).state, BatchState::kDone);
  EXPECT_GE(std::chrono::steady_clock::now() - posted, 200ms);
  EXPECT_EQ(p.dst[0], 1);
}

TEST(FaultInjection, RefusedConnectAndTheSameFatesForTheSameSeed) {
  auto refused =
      inject_faults(create_transport("loopback").value(), parse_faults({"fail_connect=1"}).value());
  auto other = create_transport("loopback").value();
  EXPECT_EQ(refused->connect(other->descriptor()).status().message(),
            "injected fault (fail_connect): connect refused");
  auto fates = [](uint64_t seed) {
    Pair p = make_pair(parse_faults({"fail_batch=0.5", "seed=" + std::to_string(seed)}).value());
    std::string out;
    for (int i = 0; i < 32; ++i) {
      const BatchStatus st = wait_end(
          *p.sender,
          p.sender->write(p.peer, std::vector<WriteOp>{{p.src_key, 0, p.dst_key, 0, 8}}).value());
      out += st.state == BatchState::kDone ? 'd' : 'f';
    }
    return out;
  };
  const std::string a = fates(7);
  EXPECT_EQ(a, fates(7));
  EXPECT_NE(a.find('d'), std::string::npos);  // a coin, not a constant
  EXPECT_NE(a.find('f'), std::string::npos);
}

// The decorator passes the receiver's fence on: it claims the real
// transport's capabilities, fences_inbound among them.
TEST(FaultInjection, PassesTheReceiversFenceOn) {
  struct Fenced final : testing::StubTransport {
    std::vector<std::string> fenced;
    TransportCapabilities capabilities() const override {
      TransportCapabilities c;
      c.fences_inbound = true;
      return c;
    }
    void fence_inbound(std::string_view source, std::optional<uint64_t> connection) override {
      fenced.emplace_back(fmt::format("{} {}", source, connection.value_or(0)));
    }
  };
  auto real = std::make_unique<Fenced>();
  Fenced& seen = *real;
  auto decorated = inject_faults(std::move(real), parse_faults({"fail_batch=0.5"}).value());
  ASSERT_TRUE(decorated->capabilities().fences_inbound);
  decorated->fence_inbound("source-descriptor", 7);
  EXPECT_EQ(seen.fenced, std::vector<std::string>{"source-descriptor 7"});
}

}  // namespace
}  // namespace pdkv

// The transfer engine's own API (transfer_engine.h): batches, per-request
// status, the request timeout, and descriptors that cannot be trusted.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>

#include "segment.h"
#include "support/poll.h"
#include "transfer_engine.h"
#include "wire.h"

namespace pdkv::backends::mooncake {
namespace {

using namespace std::chrono_literals;

EngineConfig tcp_config() {
  EngineConfig c;
  c.same_host = SameHost::kOff;
  return c;
}

TEST(MooncakeEngine, RequestsOfABatchEachReportTheirStatus) {
  std::vector<char> src(3 << 20), dst(3 << 20, 0);  // outlive the engines
  auto initiator = TransferEngine::create(tcp_config()).value();
  auto target = TransferEngine::create(tcp_config()).value();
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 7 + 1);
  ASSERT_TRUE(initiator->register_local_memory(src.data(), src.size()).is_ok());
  ASSERT_TRUE(target->register_local_memory(dst.data(), dst.size()).is_ok());
  target->release_to_peers();
  const SegmentHandle segment = initiator->open_segment(target->segment_descriptor()).value();
  const auto base = reinterpret_cast<uint64_t>(dst.data());

  const BatchId batch = initiator->allocate_batch_id(3).value();
  const std::vector<TransferRequest> two = {
      {Opcode::kWrite, src.data(), segment, base + 100, 1 << 20},
      {Opcode::kWrite, src.data() + (1 << 20), segment, base + (2 << 20), 1000}};
  ASSERT_TRUE(initiator->submit_transfer(batch, two).is_ok());
  // A third fits, a fourth does not: the batch was allocated for three.
  const std::vector<TransferRequest> one = {{Opcode::kWrite, src.data(), segment, base, 10}};
  ASSERT_TRUE(initiator->submit_transfer(batch, one).is_ok());
  EXPECT_EQ(initiator->submit_transfer(batch, one).code(), StatusCode::kOutOfRange);

  ASSERT_TRUE(testing::poll_until(
      [&] { return initiator->get_batch_status(batch)->state == TransferState::kCompleted; }, 10s));
  const uint64_t lengths[] = {1 << 20, 1000, 10};
  for (size_t i = 0; i < 3; ++i) {
    const TransferStatus st = initiator->get_transfer_status(batch, i).value();
    EXPECT_EQ(st.state, TransferState::kCompleted) << i;
    EXPECT_EQ(st.transferred_bytes, lengths[i]) << i;
  }
  EXPECT_EQ(initiator->get_batch_status(batch)->transferred_bytes, (1u << 20) + 1010);
  EXPECT_EQ(initiator->get_transfer_status(batch, 3).status().code(), StatusCode::kOutOfRange);
  target->acquire_inbound_writes();
  EXPECT_EQ(std::memcmp(dst.data() + 100, src.data(), 1 << 20), 0);
  EXPECT_EQ(std::memcmp(dst.data() + (2 << 20), src.data() + (1 << 20), 1000), 0);
  ASSERT_TRUE(initiator->free_batch_id(batch).is_ok());
  EXPECT_EQ(initiator->get_batch_status(batch).status().code(), StatusCode::kNotFound);
}

TEST(MooncakeEngine, RequestsOutsideRegisteredMemoryAreRefusedWhole) {
  std::vector<char> src(4096), dst(4096);
  auto initiator = TransferEngine::create(tcp_config()).value();
  auto target = TransferEngine::create(tcp_config()).value();
  ASSERT_TRUE(initiator->register_local_memory(src.data(), src.size()).is_ok());
  ASSERT_TRUE(target->register_local_memory(dst.data(), dst.size()).is_ok());
  const SegmentHandle segment = initiator->open_segment(target->segment_descriptor()).value();
  const auto base = reinterpret_cast<uint64_t>(dst.data());
  const BatchId batch = initiator->allocate_batch_id(2).value();
  // The second request leaves the target's buffer by one byte: neither moves.
  const std::vector<TransferRequest> requests = {
      {Opcode::kWrite, src.data(), segment, base, 10},
      {Opcode::kWrite, src.data(), segment, base + 4090, 7}};
  const Status st = initiator->submit_transfer(batch, requests);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_NE(st.message().find("request 1: target bytes"), std::string::npos) << st.message();
  EXPECT_EQ(initiator->get_batch_status(batch)->state, TransferState::kCompleted);  // empty
  const std::vector<TransferRequest> local = {
      {Opcode::kWrite, src.data() + 4000, segment, base, 100}};
  EXPECT_EQ(initiator->submit_transfer(batch, local).code(), StatusCode::kOutOfRange);
}

// Submitting looks each request up by address among the segment's buffers;
// the index must find what a scan of every buffer finds, in any order they
// were registered, and overlapping ones too.
TEST(MooncakeBufferIndex, FindsWhatAScanOfEveryBufferFinds) {
  using Buffer = SegmentDescriptor::Buffer;
  // Out of order of address, a gap between 300 and 1000, and [20, 40) lying
  // inside [0, 100). Written out by hand: which holds what.
  const std::vector<Buffer> buffers = {{1000, 50}, {200, 100}, {0, 100}, {20, 20}};
  const BufferIndex index(buffers);
  // The base of the buffer found, or -1 for none.
  const auto found_base = [&](uint64_t addr, uint64_t length) {
    const Buffer* b = index.find(addr, length);
    return b == nullptr ? int64_t{-1} : static_cast<int64_t>(b->base);
  };
  EXPECT_EQ(found_base(1000, 50), 1000);
  EXPECT_EQ(found_base(1049, 1), 1000);
  EXPECT_EQ(found_base(1049, 2), -1);  // one byte past its end
  EXPECT_EQ(found_base(299, 1), 200);
  EXPECT_EQ(found_base(300, 1), -1);  // in the gap
  EXPECT_EQ(found_base(250, 100), -1);
  const int64_t either = found_base(25, 10);  // both hold it
  EXPECT_TRUE(either == 20 || either == 0) << either;
  // [30, 90) starts inside the inner buffer but only the outer one holds it.
  EXPECT_EQ(found_base(30, 60), 0);
  EXPECT_EQ(found_base(UINT64_MAX, 1), -1);
  EXPECT_EQ(BufferIndex().find(0, 1), nullptr);

  // Random lookups against a plain scan, written here without find_buffer.
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20000; ++i) {
    const uint64_t addr = rng() % 1200, length = rng() % 120;
    bool held = false;
    for (const Buffer& b : buffers) held |= addr >= b.base && addr + length <= b.base + b.length;
    const Buffer* found = index.find(addr, length);
    ASSERT_EQ(found != nullptr, held) << addr << " +" << length;
    if (found != nullptr) {
      ASSERT_TRUE(addr >= found->base && addr + length <= found->base + found->length);
    }
  }
}

// The engine's transfer timeout (transport option transfer_timeout_ms) is
// how long a request may take, unless the backend's own request_timeout_ms
// says otherwise, whichever comes first in the options.
TEST(MooncakeOptions, TheRequestTimeoutIsTheEnginesTransferTimeoutUnlessSet) {
  EXPECT_EQ(config_from({}).value().request_timeout, 30s);
  EXPECT_EQ(config_from({{"transfer_timeout_ms", "123000"}}).value().request_timeout, 123s);
  EXPECT_EQ(config_from({{"transfer_timeout_ms", "123000"}, {"request_timeout_ms", "300"}})
                .value()
                .request_timeout,
            300ms);
  const auto zero = config_from({{"transfer_timeout_ms", "0"}});
  ASSERT_FALSE(zero.is_ok());
  EXPECT_NE(zero.status().message().find("transfer_timeout_ms"), std::string::npos)
      << zero.status().to_string();
}

// A target that accepts connections and never answers: requests stay
// pending, then end as timeout at request_timeout (reported once the rail
// that owes the slice gave up on it, within the drain of half a second).
TEST(MooncakeEngine, ARequestNotCompletedInTimeEndsAsTimeout) {
  const int silent = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::bind(silent, reinterpret_cast<sockaddr*>(&addr), len), 0);
  ASSERT_EQ(::listen(silent, 8), 0);
  getsockname(silent, reinterpret_cast<sockaddr*>(&addr), &len);
  SegmentDescriptor fake;
  fake.name = "silent";
  fake.host_identity = "another host";
  fake.secret = std::string(wire::kSecretBytes, 's');
  fake.rails = {"127.0.0.1:" + std::to_string(ntohs(addr.sin_port))};
  fake.buffers = {{0x10000, 1 << 20}};

  EngineConfig config = tcp_config();
  config.request_timeout = 300ms;
  std::vector<char> src(4096);  // outlives the engine, which may still be sending it
  auto initiator = TransferEngine::create(config).value();
  ASSERT_TRUE(initiator->register_local_memory(src.data(), src.size()).is_ok());
  const SegmentHandle segment = initiator->open_segment(fake.encode()).value();
  const BatchId batch = initiator->allocate_batch_id(1).value();
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(initiator
                  ->submit_transfer(batch, std::vector<TransferRequest>{{Opcode::kWrite, src.data(),
                                                                         segment, 0x10000, 64}})
                  .is_ok());
  ASSERT_TRUE(testing::poll_until(
      [&] { return initiator->get_transfer_status(batch, 0)->state == TransferState::kPending; },
      5s));
  ASSERT_TRUE(testing::poll_until(
      [&] { return initiator->get_batch_status(batch)->state == TransferState::kTimeout; }, 5s));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 300ms);
  const TransferStatus st = initiator->get_transfer_status(batch, 0).value();
  EXPECT_EQ(st.state, TransferState::kTimeout);
  EXPECT_NE(st.error.message().find("within 300 ms (request_timeout_ms"), std::string::npos)
      << st.error.to_string();
  ::close(silent);
}

// A request that times out while its slices stream to a live target: once
// the batch reports the timeout, none of its bytes lands any more (its
// queued slices are dropped, not retried), and what landed is the source's.
// One try of the case below: false when the whole batch landed before its
// report (a loaded machine polled late), so that nothing was left to drop.
bool timed_out_batch_lands_nothing_after_its_report() {
  constexpr size_t kBytes = 256 << 20;
  std::vector<char> src(kBytes), dst(kBytes, 0);  // outlive the engines
  for (size_t i = 0; i < kBytes; i += 4096) src[i] = static_cast<char>(i / 4096 + 1);
  EngineConfig config = tcp_config();
  config.rails = 1;
  config.request_timeout = 10ms;
  auto initiator = TransferEngine::create(config).value();
  auto target = TransferEngine::create(tcp_config()).value();
  EXPECT_TRUE(initiator->register_local_memory(src.data(), src.size()).is_ok());
  EXPECT_TRUE(target->register_local_memory(dst.data(), dst.size()).is_ok());
  target->release_to_peers();
  const SegmentHandle segment = initiator->open_segment(target->segment_descriptor()).value();
  const BatchId batch = initiator->allocate_batch_id(1).value();
  EXPECT_TRUE(
      initiator
          ->submit_transfer(
              batch, std::vector<TransferRequest>{{Opcode::kWrite, src.data(), segment,
                                                   reinterpret_cast<uint64_t>(dst.data()), kBytes}})
          .is_ok());
  TransferState state = TransferState::kWaiting;
  EXPECT_TRUE(testing::poll_until(
      [&] {
        state = initiator->get_batch_status(batch)->state;
        return state == TransferState::kTimeout || state == TransferState::kCompleted;
      },
      10s));
  if (state != TransferState::kTimeout) return false;  // 256 MiB in 10 ms: not exercised
  // Slices go in order on the one rail: the tail is the last to land. It
  // must not have landed yet (else the case was not exercised), and must
  // never land now.
  constexpr size_t kTail = 1 << 20;
  const char* tail = dst.data() + kBytes - kTail;
  target->acquire_inbound_writes();
  const std::vector<char> tail_at_report(tail, tail + kTail);
  if (std::memcmp(tail_at_report.data(), src.data() + kBytes - kTail, kTail) == 0) return false;
  for (size_t i = 0; i < kBytes; i += 4096) {
    EXPECT_TRUE(dst[i] == 0 || dst[i] == src[i]) << "garbage at byte " << i;
  }
  const bool changed = testing::poll_until(
      [&] {
        target->acquire_inbound_writes();
        return std::memcmp(tail, tail_at_report.data(), kTail) != 0;
      },
      300ms);
  EXPECT_FALSE(changed) << "bytes of a batch reported timed out landed after the report";
  return true;
}

TEST(MooncakeEngine, ATimedOutBatchLandsNothingAfterItsReport) {
  bool exercised = false;
  for (int attempt = 0; attempt < 3 && !exercised && !HasFailure(); ++attempt) {
    exercised = timed_out_batch_lands_nothing_after_its_report();
  }
  EXPECT_TRUE(exercised) << "in 3 tries the whole batch landed before its report: nothing was "
                            "left to drop";
}

// Every prefix of a real descriptor, and random bytes, are refused cleanly.
TEST(MooncakeEngine, BrokenDescriptorsAreRefusedNotCrashes) {
  auto engine = TransferEngine::create(tcp_config()).value();
  std::vector<char> buffer(4096);
  ASSERT_TRUE(engine->register_local_memory(buffer.data(), buffer.size()).is_ok());
  const std::string good = engine->segment_descriptor();
  ASSERT_TRUE(SegmentDescriptor::decode(good).is_ok());
  for (size_t n = 0; n < good.size(); ++n) {
    const auto broken = SegmentDescriptor::decode(good.substr(0, n));
    ASSERT_EQ(broken.status().code(), StatusCode::kInvalidArgument) << n;
  }
  EXPECT_EQ(SegmentDescriptor::decode(good + "x").status().code(), StatusCode::kInvalidArgument);
  std::mt19937 rng(3);
  for (int i = 0; i < 200; ++i) {
    std::string noise(rng() % 300, '\0');
    for (auto& c : noise) c = static_cast<char>(rng());
    EXPECT_FALSE(engine->open_segment(noise).is_ok());
  }
  // A rail address that is not one.
  SegmentDescriptor bad = SegmentDescriptor::decode(good).value();
  bad.rails = {"not-an-address"};
  const auto refused = engine->open_segment(bad.encode());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("not-an-address"), std::string::npos);
}

}  // namespace
}  // namespace pdkv::backends::mooncake

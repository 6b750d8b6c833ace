// The backend conformance suite: what every transport backend must do,
// parameterised by backend name. Each test checks bytes, not just statuses.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "pdkv/transport.h"
#include "support/child_process.h"
#include "support/poll.h"
#include "support/transport_pair.h"

namespace pdkv {
namespace {

using namespace std::chrono_literals;

using testing::poll_until;

BatchStatus wait(Transport& t, BatchId batch,
                 std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  return testing::wait_batch(t, batch, limit);
}

// A byte that a transfer may be writing at this moment, read on purpose:
// the test watches bytes flow in while a batch is in flight, and that none
// do after its failure's report. Old or new value, either is an answer, so
// the read is not ordered with the writer and ThreadSanitizer is told not
// to look at it (it flagged every such read as a race with the provider's
// memcpy).
// (A volatile load, so that the compiler cannot move it into the caller,
// where it would be instrumented again.)
__attribute__((no_sanitize("thread"), noinline)) uint8_t byte_in_flight(const uint8_t* at) {
  return *static_cast<const volatile uint8_t*>(at);
}

// A backend name and its options; printed as `label` so that CTest lists
// ".../nixl" or ".../nixl_peer".
struct Backend {
  std::string name;
  TransportOptions options;
  std::string label;
};
void PrintTo(const Backend& b, std::ostream* os) { *os << (b.label.empty() ? b.name : b.label); }

class Conformance : public ::testing::TestWithParam<Backend>, protected testing::TransportPair {
 protected:
  void SetUp() override {
    auto a = create_transport(GetParam().name, GetParam().options);
    auto b = create_transport(GetParam().name, GetParam().options);
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    ASSERT_TRUE(b.is_ok()) << b.status().to_string();
    sender_ = std::move(a).value();
    receiver_ = std::move(b).value();
  }
  // Which pages of the destination hold the source's bytes, one byte a page
  // (copying the whole region would take long enough for late bytes to
  // slip into the copy).
  std::vector<bool> landed_pages() {
    const std::vector<uint8_t>& dst = received();
    std::vector<bool> pages;
    for (size_t i = 0; i < dst.size(); i += 4096) {
      pages.push_back(byte_in_flight(&dst[i]) == src_[i]);
    }
    return pages;
  }
};

TEST_P(Conformance, WritesFromOneByteTo64MiB) {
  connect(64 << 20);
  size_t offset = 0;
  for (size_t size :
       {size_t{1}, size_t{7}, size_t{4096}, size_t{(1 << 20) + 3}, size_t{48 << 20}}) {
    // Odd offsets on both sides, distinct per size.
    const size_t src_off = offset + 3, dst_off = (offset * 7 + 5) % ((64 << 20) - size);
    reset_destination();
    const std::vector<WriteOp> ops = {{src_key_, src_off, dst_key_, dst_off, size}};
    auto batch = sender_->write(peer_, ops);
    ASSERT_TRUE(batch.is_ok()) << batch.status().to_string();
    const BatchStatus st = wait(*sender_, *batch);
    ASSERT_EQ(st.state, BatchState::kDone) << st.error.to_string();
    ASSERT_EQ(std::memcmp(received().data() + dst_off, src_.data() + src_off, size), 0)
        << size << " B";
    if (dst_off > 0) {
      EXPECT_EQ(dst_[dst_off - 1], 0xEE);
    }
    if (dst_off + size < dst_.size()) {
      EXPECT_EQ(dst_[dst_off + size], 0xEE);
    }
    offset += 1 << 20;
  }
}

TEST_P(Conformance, TenThousandTinyFragments) {
  connect(1 << 20);
  std::mt19937 rng(5);
  std::vector<WriteOp> ops;
  std::vector<size_t> slots(10000);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  for (size_t i = 0; i < 10000; ++i) {
    const uint64_t len = 1 + rng() % 16;  // 1..16 B into 100 B slots, shuffled
    ops.push_back({src_key_, i * 97, dst_key_, slots[i] * 100 + 3, len});
  }
  auto batch = sender_->write(peer_, ops);
  ASSERT_TRUE(batch.is_ok()) << batch.status().to_string();
  ASSERT_EQ(wait(*sender_, *batch).state, BatchState::kDone);
  std::vector<uint8_t> expected(dst_.size(), 0xEE);
  for (const WriteOp& op : ops) {
    std::memcpy(expected.data() + op.remote_offset, src_.data() + op.local_offset, op.length);
  }
  EXPECT_TRUE(expected == received());
}

TEST_P(Conformance, ManyBatchesInFlight) {
  connect(8 << 20);
  std::vector<BatchId> batches;
  for (size_t i = 0; i < 128; ++i) {
    const std::vector<WriteOp> ops = {{src_key_, i * 65536, dst_key_, (127 - i) * 65536, 65536}};
    batches.push_back(sender_->write(peer_, ops).value());
  }
  for (BatchId b : batches) ASSERT_EQ(wait(*sender_, b).state, BatchState::kDone);
  received();
  for (size_t i = 0; i < 128; ++i) {
    ASSERT_EQ(std::memcmp(dst_.data() + (127 - i) * 65536, src_.data() + i * 65536, 65536), 0) << i;
  }
  EXPECT_EQ(sender_->poll(batches[0]).error.code(),
            StatusCode::kNotFound);  // ended batches are gone
}

TEST_P(Conformance, WriteOutsideARegionIsRefusedNotACrash) {
  connect(4096);
  auto beyond = sender_->write(peer_, std::vector<WriteOp>{{src_key_, 0, dst_key_, 4000, 200}});
  EXPECT_EQ(beyond.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(beyond.status().message().find("remote bytes [4000, 4200) outside remote region 0 of "
                                           "4096 bytes"),
            std::string::npos)
      << beyond.status().message();
  EXPECT_EQ(
      sender_->write(peer_, std::vector<WriteOp>{{src_key_, 4095, dst_key_, 0, 2}}).status().code(),
      StatusCode::kOutOfRange);
  EXPECT_EQ(sender_->write(peer_, std::vector<WriteOp>{{9, 0, dst_key_, 0, 1}}).status().code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(sender_->write(peer_, std::vector<WriteOp>{{src_key_, 0, 9, 0, 1}}).status().code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(sender_->connect("garbage").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(received()[4000], 0xEE);
  // The transport still works afterwards.
  auto ok = sender_->write(peer_, std::vector<WriteOp>{{src_key_, 10, dst_key_, 20, 5}});
  ASSERT_TRUE(ok.is_ok());
  EXPECT_EQ(wait(*sender_, *ok).state, BatchState::kDone);
  EXPECT_EQ(std::memcmp(received().data() + 20, src_.data() + 10, 5), 0);
}

// One-sided reads, for backends that declare them: the peer's bytes land in
// the local region, byte for byte, at odd offsets, in sizes across slices.
TEST_P(Conformance, ReadsBytesBackByteForByte) {
  if (!sender_->capabilities().reads) {
    EXPECT_EQ(sender_->read(0, {}).status().code(), StatusCode::kFailedPrecondition);
    GTEST_SKIP() << GetParam().name << " declares no reads";
  }
  connect(8 << 20);
  // The receiver's region is the source of a read: give it its own pattern.
  for (size_t i = 0; i < dst_.size(); ++i) dst_[i] = static_cast<uint8_t>(i * 29 + 1);
  receiver_->release_to_peers();
  std::vector<uint8_t> expected = src_;
  std::vector<ReadOp> ops;
  for (uint64_t size : {uint64_t{1}, uint64_t{4099}, uint64_t{(3 << 20) + 5}}) {
    const uint64_t local = ops.empty() ? 3 : ops.back().local_offset + ops.back().length + 11;
    const uint64_t remote = (local * 5 + 1) % ((8 << 20) - size);
    ops.push_back({src_key_, local, dst_key_, remote, size});
    std::memcpy(expected.data() + local, dst_.data() + remote, size);
  }
  auto batch = sender_->read(peer_, ops);
  ASSERT_TRUE(batch.is_ok()) << batch.status().to_string();
  ASSERT_EQ(wait(*sender_, *batch).state, BatchState::kDone);
  EXPECT_TRUE(expected == src_);
  EXPECT_EQ(sender_->read(peer_, std::vector<ReadOp>{{src_key_, 0, dst_key_, (8 << 20) - 1, 2}})
                .status()
                .code(),
            StatusCode::kOutOfRange);
}

TEST_P(Conformance, NotificationArrivesAfterTheBytes) {
  if (!sender_->capabilities().notifications)
    GTEST_SKIP() << GetParam().name << " has no notifications";
  // Announced (Transport::set_notification_callback): taken only after the
  // callback ran, the notification is there.
  auto announced = std::make_shared<std::atomic<int>>(0);
  receiver_->set_notification_callback([announced] { ++*announced; });
  connect(1 << 20);
  auto batch = sender_->write_and_notify(
      peer_, std::vector<WriteOp>{{src_key_, 0, dst_key_, 0, 1 << 20}}, "room 7 done");
  ASSERT_TRUE(batch.is_ok()) << batch.status().to_string();
  ASSERT_TRUE(poll_until([&] { return announced->load() > 0; }, 20s)) << "never announced";
  const std::vector<std::string> got = receiver_->take_notifications();
  EXPECT_EQ(got, std::vector<std::string>{"room 7 done"});
  EXPECT_TRUE(
      std::equal(src_.begin(), src_.end(), received().begin()));  // visible before the notice
  EXPECT_EQ(wait(*sender_, *batch).state, BatchState::kDone);
}

// Batch ends are announced (Transport::set_batch_end_callback): polling
// only after an announcement, the test sees every batch end. It fails when
// a batch ends and nothing says so within 20 s.
void await_announced_ends(Transport& t, const std::atomic<int>& announced,
                          std::vector<BatchId> open, std::vector<BatchStatus>& ends) {
  int seen = 0;
  while (!open.empty()) {
    ASSERT_TRUE(poll_until([&] { return announced.load() > seen; }, 20s))
        << open.size() << " batches not announced as ended";
    seen = announced.load();
    std::erase_if(open, [&](BatchId b) {
      const BatchStatus st = t.poll(b);
      if (st.state == BatchState::kInProgress) return false;
      ends.push_back(st);
      return true;
    });
  }
}

TEST_P(Conformance, BatchEndsAreAnnounced) {
  ASSERT_TRUE(sender_->capabilities().batch_end_events) << GetParam().name;
  // Shared: the transport may call it back after the test's body is over.
  auto announced = std::make_shared<std::atomic<int>>(0);
  sender_->set_batch_end_callback([announced] { ++*announced; });
  connect(8 << 20);
  std::vector<BatchId> batches;
  for (uint64_t i = 0; i < 8; ++i) {
    const uint64_t len = (1 << 20) >> i;  // 1 MiB down to 8 KiB
    batches.push_back(
        sender_->write(peer_, std::vector<WriteOp>{{src_key_, i << 20, dst_key_, i << 20, len}})
            .value());
  }
  std::vector<BatchStatus> ends;
  await_announced_ends(*sender_, *announced, batches, ends);
  ASSERT_EQ(ends.size(), batches.size());
  for (const BatchStatus& st : ends) EXPECT_EQ(st.state, BatchState::kDone) << st.error.to_string();
}

TEST_P(Conformance, FailedBatchesAreAnnounced) {
  // Shared: the transport may call it back after the test's body is over.
  auto announced = std::make_shared<std::atomic<int>>(0);
  sender_->set_batch_end_callback([announced] { ++*announced; });
  connect(64 << 20);
  std::vector<BatchId> batches;
  for (int i = 0; i < 4; ++i) {
    batches.push_back(
        sender_->write(peer_, std::vector<WriteOp>{{src_key_, 0, dst_key_, 0, 64 << 20}}).value());
  }
  sender_->fail_peer(peer_, Status::unavailable("the test failed it"));
  std::vector<BatchStatus> ends;
  await_announced_ends(*sender_, *announced, batches, ends);
  EXPECT_EQ(ends.size(), batches.size());  // done before the failure, or failed
}

// Memory the transport offers (Transport::allocate) comes zeroed, registers
// whole or in parts, and carries writes and reads byte for byte. A backend
// with none says so with kFailedPrecondition, naming itself.
TEST_P(Conformance, OwnMemoryIsZeroedAndCarriesWrites) {
  constexpr uint64_t kBytes = (4 << 20) + 3;
  auto src = sender_->allocate(kBytes);
  if (!src.is_ok()) {
    EXPECT_EQ(src.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(src.status().message().find(GetParam().name), std::string::npos)
        << src.status().message();
    return;
  }
  auto dst = receiver_->allocate(kBytes);
  ASSERT_TRUE(dst.is_ok()) << dst.status().to_string();
  ASSERT_EQ(src->length, kBytes);
  ASSERT_EQ(dst->length, kBytes);
  auto* s = static_cast<uint8_t*>(src->base);
  auto* d = static_cast<uint8_t*>(dst->base);
  EXPECT_EQ(std::count(d, d + kBytes, 0), static_cast<long>(kBytes));
  for (uint64_t i = 0; i < kBytes; ++i) s[i] = static_cast<uint8_t>(i * 29 + (i >> 11));
  // The destination registers in two parts, the second at an odd offset of
  // the allocation: each part is a region of its own.
  const uint64_t split = (1 << 20) + 5;
  const RegionKey sk = sender_->register_region(*src).value();
  const RegionKey low = receiver_->register_region({d, split}).value();
  const RegionKey high = receiver_->register_region({d + split, kBytes - split}).value();
  receiver_->release_to_peers();
  const PeerId peer = sender_->connect(receiver_->descriptor()).value();
  const std::vector<WriteOp> ops = {{sk, 1, low, 3, split - 3},
                                    {sk, split + 9, high, 0, kBytes - split - 9}};
  auto batch = sender_->write(peer, ops);
  ASSERT_TRUE(batch.is_ok()) << batch.status().to_string();
  ASSERT_EQ(wait(*sender_, *batch).state, BatchState::kDone);
  receiver_->acquire_remote_writes();
  EXPECT_EQ(std::memcmp(d + 3, s + 1, split - 3), 0);
  EXPECT_EQ(std::memcmp(d + split, s + split + 9, kBytes - split - 9), 0);
  EXPECT_EQ(d[0] | d[1] | d[2], 0);  // untouched around the writes
  // A region keeps its own bounds, though its allocation is larger.
  EXPECT_EQ(sender_->write(peer, std::vector<WriteOp>{{sk, 0, low, split - 1, 2}}).status().code(),
            StatusCode::kOutOfRange);
  if (sender_->capabilities().reads) {
    std::fill(s, s + kBytes, 0);
    auto read = sender_->read(peer, std::vector<ReadOp>{{sk, 0, high, 0, kBytes - split}});
    ASSERT_TRUE(read.is_ok()) << read.status().to_string();
    ASSERT_EQ(wait(*sender_, *read).state, BatchState::kDone);
    EXPECT_EQ(std::memcmp(s, d + split, kBytes - split), 0);
  }
}

// The peer process is killed with batches in flight: within 2 s the peer is
// reported failed (once) and every batch has ended, none hangs. Detection may
// come from the transport or from the liveness signal passed down here
// (fail_peer when the process is seen gone), as the protocol layer does.
TEST_P(Conformance, PeerKilledMidBatch) {
  std::vector<std::string> argv = {PDKV_BACKEND_PEER, GetParam().name, std::to_string(64 << 20)};
  for (const auto& [k, v] : GetParam().options) argv.push_back(k + "=" + v);
  testing::ChildProcess child(argv);
  const std::string desc = testing::from_hex(child.read_line());
  ASSERT_FALSE(desc.empty()) << "the peer process printed no descriptor";

  src_.assign(64 << 20, 1);
  src_key_ = sender_->register_region({src_.data(), src_.size()}).value();
  std::atomic<int> failures{0};
  sender_->set_peer_failure_callback([&](PeerId, const Status&) { ++failures; });
  const PeerId peer = sender_->connect(desc).value();
  std::vector<BatchId> batches;
  for (int i = 0; i < 16; ++i) {
    batches.push_back(
        sender_->write(peer, std::vector<WriteOp>{{src_key_, 0, 0, 0, 64 << 20}}).value());
  }
  const auto killed = std::chrono::steady_clock::now();
  child.kill_now();  // SIGKILL, then reaped: the liveness signal, the process is gone
  sender_->fail_peer(peer, Status::unavailable("peer process exited"));
  ASSERT_TRUE(poll_until(
      [&] {
        for (BatchId b : batches) {
          if (sender_->poll(b).state == BatchState::kInProgress) return false;
        }
        return failures.load() > 0;
      },
      2s));
  EXPECT_LT(std::chrono::steady_clock::now() - killed, 2s);
  EXPECT_EQ(failures.load(), 1);
  EXPECT_FALSE(sender_->write(peer, std::vector<WriteOp>{{src_key_, 0, 0, 0, 1}}).is_ok());
}

// kFailed means over (transport.h): once a batch is reported failed, none
// of its bytes lands any more. The batch is failed in flight (fail_peer just
// after it is posted); what landed before the report may stay, but it is
// the source's bytes, and the destination does not change afterwards while
// the receiver keeps running. A batch that finished before the failure
// counts for nothing; one of three tries must fail in flight.
TEST_P(Conformance, AFailedBatchLandsNothingAfterItsReport) {
  constexpr size_t kOp = 64 << 10, kOps = 2048;  // 128 MiB: long enough to fail in flight
  connect(kOp * kOps);
  std::vector<WriteOp> ops;
  for (size_t i = 0; i < kOps; ++i) ops.push_back({src_key_, i * kOp, dst_key_, i * kOp, kOp});
  const std::string desc = receiver_->descriptor();
  int failed_in_flight = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    reset_destination();
    const PeerId peer = attempt == 0 ? peer_ : sender_->connect(desc).value();
    const BatchId batch = sender_->write(peer, ops).value();
    // Failed at once, then (later tries) once bytes flow: operations are
    // then with the transport's library, not just queued in the backend.
    const auto pages_landed = [&] {
      const std::vector<uint8_t>& dst = received();
      size_t n = 0;
      for (size_t i = 0; i < dst.size(); i += 4096) {
        n += byte_in_flight(&dst[i]) == src_[i] && src_[i] != 0xEE;
      }
      return n;
    };
    if (attempt > 0) (void)poll_until([&] { return pages_landed() > 0; }, 2s);
    sender_->fail_peer(peer, Status::aborted("failed by the test"));
    // Longer than any backend's drain cap (10 s), which a busy one may use.
    const BatchStatus end = wait(*sender_, batch, std::chrono::seconds(15));
    ASSERT_NE(end.state, BatchState::kInProgress) << "the failed batch never ended";
    // Which pages had landed at the report, read at once.
    const std::vector<bool> at_report = landed_pages();
    if (end.state == BatchState::kDone) {
      ASSERT_TRUE(received() == src_) << "a batch reported done is missing bytes";
      continue;
    }
    ++failed_in_flight;
    const std::vector<uint8_t>& dst = received();
    for (size_t i = 0; i < dst.size(); ++i) {
      ASSERT_TRUE(dst[i] == 0xEE || dst[i] == src_[i]) << "garbage at byte " << i;
    }
    // Observed for a while: a late page would show as a change.
    const bool changed = poll_until([&] { return landed_pages() != at_report; }, 300ms);
    EXPECT_FALSE(changed) << "bytes of a batch reported failed landed after the report";
  }
  EXPECT_GT(failed_in_flight, 0) << "no try failed in flight: the case was not exercised";
}

// The receiver's fence (transport.h, fence_inbound): once it returns, what
// the source had sent and not yet landed is dropped, even though the path
// stays up, and the source's batch does not end done; if it did end done,
// every byte had landed before the fence. `at_once`: the fence comes right
// after the write, before the receiver has heard anything of the new
// connection; else once bytes flow. Three tries, of which one must be
// fenced in flight (a batch that finished first counts for nothing); then
// a new connection of the same source writes again.
class Fence : public Conformance {
 protected:
  void SetUp() override {
    Conformance::SetUp();
    if (HasFatalFailure()) return;
    if (!receiver_->capabilities().fences_inbound) {
      GTEST_SKIP() << GetParam().label << " has no receiver's fence (capabilities)";
    }
  }
  void run(bool at_once) {
    constexpr size_t kOp = 64 << 10, kOps = 2048;  // 128 MiB: long enough to fence in flight
    connect(kOp * kOps);
    std::vector<WriteOp> ops;
    for (size_t i = 0; i < kOps; ++i) ops.push_back({src_key_, i * kOp, dst_key_, i * kOp, kOp});
    const std::string source = sender_->descriptor(), target = receiver_->descriptor();
    int fenced_in_flight = 0;
    for (int attempt = 0; attempt < 3; ++attempt) {
      reset_destination();
      const PeerId peer = sender_->connect(target).value();
      const BatchId batch = sender_->write(peer, ops).value();
      // Bytes flow (a bool here: vector<bool>'s element of a temporary dangles).
      if (!at_once) (void)poll_until([&]() -> bool { return landed_pages()[0]; }, 2s);
      receiver_->fence_inbound(source, std::nullopt);  // every connection of the source
      const std::vector<bool> at_fence = landed_pages();
      const BatchStatus end = wait(*sender_, batch, std::chrono::seconds(10));
      ASSERT_NE(end.state, BatchState::kInProgress) << "the fenced batch never ended";
      if (end.state == BatchState::kDone) {
        ASSERT_TRUE(received() == src_) << "a batch reported done is missing bytes";
        EXPECT_TRUE(std::all_of(at_fence.begin(), at_fence.end(), [](bool b) { return b; }))
            << "the batch ended done with bytes that landed after the fence";
        continue;
      }
      ++fenced_in_flight;
      const bool changed = poll_until([&] { return landed_pages() != at_fence; }, 300ms);
      EXPECT_FALSE(changed) << "bytes sent before the fence landed after it";
    }
    EXPECT_GT(fenced_in_flight, 0) << "no try was fenced in flight: the case was not exercised";
    // The source's next connection is not fenced.
    reset_destination();
    const PeerId again = sender_->connect(target).value();
    const BatchId small =
        sender_->write(again, std::vector<WriteOp>{{src_key_, 0, dst_key_, 0, kOp}}).value();
    ASSERT_EQ(wait(*sender_, small).state, BatchState::kDone);
    EXPECT_EQ(std::memcmp(received().data(), src_.data(), kOp), 0);
  }
};

TEST_P(Fence, AFencedSourceLandsNothingAfterTheFence) { run(/*at_once=*/false); }

// The same, fenced before the receiver has heard of the connection.
TEST_P(Fence, TheFenceCoversAConnectionNotYetHeardFrom) {
  if (GetParam().name == "mori") {
    GTEST_SKIP() << "mori's fence closes the connections the provider has; one not yet "
                    "made is not covered (docs/reliability.md, limit 5)";
  }
  run(/*at_once=*/true);
}

// A fence that names the cut connection spares the source's newer one: the
// source's replacement for the cut connection goes on writing.
TEST_P(Fence, AFenceOfACutConnectionSparesTheNewerOne) {
  constexpr size_t kBytes = 1 << 20;
  connect(kBytes);
  const std::string source = sender_->descriptor(), target = receiver_->descriptor();
  const PeerId newer = sender_->connect(target).value();
  ASSERT_GT(newer, peer_);
  receiver_->fence_inbound(source, peer_);  // peer_ was cut
  const BatchId batch =
      sender_->write(newer, std::vector<WriteOp>{{src_key_, 0, dst_key_, 0, kBytes}}).value();
  const BatchStatus end = wait(*sender_, batch);
  ASSERT_EQ(end.state, BatchState::kDone) << end.error.to_string();
  EXPECT_TRUE(received() == src_);
}

// Every backend of this build, with the variants that take different paths.
std::vector<Backend> backends() {
  std::vector<Backend> all;
#ifdef PDKV_WITH_NIXL
  // Shared memory (UCX's default choice here), and the network path: TCP,
  // where UCX's peer error handling is on (error_handling=auto).
  all.push_back({"nixl", {}, "nixl"});
  all.push_back({"nixl", {{"tls", "tcp"}}, "nixl_tcp"});  // the message path (data_path=auto)
  all.push_back({"nixl", {{"tls", "tcp"}, {"data_path", "put"}}, "nixl_tcp_put"});
#endif
  // mooncake over TCP rails, and on the same-host path (required, so that a
  // silent fall-back to TCP cannot pass for it).
  all.push_back({"mooncake", {{"same_host", "off"}}, "mooncake_tcp"});
  all.push_back({"mooncake", {{"same_host", "require"}}, "mooncake_same_host"});
#ifdef PDKV_WITH_MORI
  all.push_back({"mori", {{"provider", "shm"}}, "mori_shm"});
  all.push_back({"mori", {{"provider", "tcp;ofi_rxm"}}, "mori_tcp"});
#endif
  return all;
}

INSTANTIATE_TEST_SUITE_P(Backends, Conformance, ::testing::ValuesIn(backends()));
INSTANTIATE_TEST_SUITE_P(Backends, Fence, ::testing::ValuesIn(backends()));

}  // namespace
}  // namespace pdkv

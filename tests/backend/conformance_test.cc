// The backend conformance suite: what every transport backend must do,
// parameterised by backend name. Each test checks bytes, not just statuses.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "pdkv/transport.h"
#include "support/poll.h"

extern char** environ;

namespace pdkv {
namespace {

using namespace std::chrono_literals;

using testing::poll_until;

// Waits for a batch to end; its final status.
BatchStatus wait(Transport& t, BatchId batch) {
  BatchStatus st;
  poll_until(
      [&] {
        st = t.poll(batch);
        return st.state != BatchState::kInProgress;
      },
      20s);
  return st;
}

// A backend name and its options; printed as `label` so that CTest lists
// ".../nixl" or ".../nixl_peer".
struct Backend {
  std::string name;
  TransportOptions options;
  std::string label;
};
void PrintTo(const Backend& b, std::ostream* os) { *os << (b.label.empty() ? b.name : b.label); }

class Conformance : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    auto a = create_transport(GetParam().name, GetParam().options);
    auto b = create_transport(GetParam().name, GetParam().options);
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    ASSERT_TRUE(b.is_ok()) << b.status().to_string();
    sender_ = std::move(a).value();
    receiver_ = std::move(b).value();
  }
  // Registers `bytes` on each side (source filled with a pattern, destination
  // with 0xEE) and connects sender -> receiver.
  void connect(size_t bytes) {
    src_.resize(bytes);
    for (size_t i = 0; i < bytes; ++i) src_[i] = static_cast<uint8_t>(i * 131 + (i >> 13));
    dst_.assign(bytes, 0xEE);
    src_key_ = sender_->register_region({src_.data(), src_.size()}).value();
    dst_key_ = receiver_->register_region({dst_.data(), dst_.size()}).value();
    auto peer = sender_->connect(receiver_->descriptor());
    ASSERT_TRUE(peer.is_ok()) << peer.status().to_string();
    peer_ = *peer;
  }
  std::unique_ptr<Transport> sender_, receiver_;
  std::vector<uint8_t> src_, dst_;
  RegionKey src_key_ = 0, dst_key_ = 0;
  PeerId peer_ = 0;
};

TEST_P(Conformance, WritesFromOneByteTo64MiB) {
  connect(64 << 20);
  size_t offset = 0;
  for (size_t size :
       {size_t{1}, size_t{7}, size_t{4096}, size_t{(1 << 20) + 3}, size_t{48 << 20}}) {
    // Odd offsets on both sides, distinct per size.
    const size_t src_off = offset + 3, dst_off = (offset * 7 + 5) % ((64 << 20) - size);
    std::fill(dst_.begin(), dst_.end(), 0xEE);
    const std::vector<WriteOp> ops = {{src_key_, src_off, dst_key_, dst_off, size}};
    auto batch = sender_->write(peer_, ops);
    ASSERT_TRUE(batch.is_ok()) << batch.status().to_string();
    const BatchStatus st = wait(*sender_, *batch);
    ASSERT_EQ(st.state, BatchState::kDone) << st.error.to_string();
    ASSERT_EQ(std::memcmp(dst_.data() + dst_off, src_.data() + src_off, size), 0) << size << " B";
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
  EXPECT_TRUE(expected == dst_);
}

TEST_P(Conformance, ManyBatchesInFlight) {
  connect(8 << 20);
  std::vector<BatchId> batches;
  for (size_t i = 0; i < 128; ++i) {
    const std::vector<WriteOp> ops = {{src_key_, i * 65536, dst_key_, (127 - i) * 65536, 65536}};
    batches.push_back(sender_->write(peer_, ops).value());
  }
  for (BatchId b : batches) ASSERT_EQ(wait(*sender_, b).state, BatchState::kDone);
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
  EXPECT_EQ(dst_[4000], 0xEE);
  // The transport still works afterwards.
  auto ok = sender_->write(peer_, std::vector<WriteOp>{{src_key_, 10, dst_key_, 20, 5}});
  ASSERT_TRUE(ok.is_ok());
  EXPECT_EQ(wait(*sender_, *ok).state, BatchState::kDone);
  EXPECT_EQ(std::memcmp(dst_.data() + 20, src_.data() + 10, 5), 0);
}

TEST_P(Conformance, NotificationArrivesAfterTheBytes) {
  if (!sender_->capabilities().notifications)
    GTEST_SKIP() << GetParam().name << " has no notifications";
  connect(1 << 20);
  auto batch = sender_->write_and_notify(
      peer_, std::vector<WriteOp>{{src_key_, 0, dst_key_, 0, 1 << 20}}, "room 7 done");
  ASSERT_TRUE(batch.is_ok()) << batch.status().to_string();
  std::vector<std::string> got;
  ASSERT_TRUE(poll_until(
      [&] {
        auto more = receiver_->take_notifications();
        got.insert(got.end(), more.begin(), more.end());
        return !got.empty();
      },
      20s));
  EXPECT_EQ(got, std::vector<std::string>{"room 7 done"});
  EXPECT_TRUE(std::equal(src_.begin(), src_.end(), dst_.begin()));  // visible before the notice
  EXPECT_EQ(wait(*sender_, *batch).state, BatchState::kDone);
}

// The peer process is killed with batches in flight: within 2 s the peer is
// reported failed (once) and every batch has ended, none hangs. Detection may
// come from the transport or from the liveness signal passed down here
// (fail_peer when the process is seen gone), as the protocol layer does.
TEST_P(Conformance, PeerKilledMidBatch) {
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  const std::string backend = GetParam().name, bytes = std::to_string(64 << 20);
  std::string option;
  for (const auto& [k, v] : GetParam().options) option = k + "=" + v;
  std::vector<char*> argv = {const_cast<char*>(PDKV_BACKEND_PEER),
                             const_cast<char*>(backend.c_str()), const_cast<char*>(bytes.c_str())};
  if (!option.empty()) argv.push_back(option.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  ASSERT_EQ(posix_spawn(&pid, PDKV_BACKEND_PEER, &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  FILE* child = fdopen(out[0], "r");
  std::string hex;
  for (int c; (c = fgetc(child)) != EOF && c != '\n';) hex.push_back(static_cast<char>(c));
  fclose(child);
  std::string desc;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    desc.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
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
  kill(pid, SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  waitpid(pid, nullptr, 0);  // the liveness signal: the process is gone
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

INSTANTIATE_TEST_SUITE_P(Backends, Conformance, ::testing::Values(PDKV_BACKENDS));

}  // namespace
}  // namespace pdkv

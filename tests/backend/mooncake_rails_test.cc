// Rails: two network namespaces made by this test, joined by two veth pairs
// whose addresses exist only inside them. The target listens on both links,
// the initiator binds one rail to each. Taking a link down mid-transfer
// moves its slices to the other rail; taking both down fails the batch with
// each rail's reason, inside the configured timeout. Everything the test
// creates is removed when it ends. Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN)
// and iproute2; skips, saying so, where namespaces cannot be created.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <future>
#include <thread>

#include "pdkv/transport.h"
#include "support/poll.h"
#include "support/run_command.h"
#include "support/transport_pair.h"

namespace pdkv {
namespace {

using namespace std::chrono_literals;

// Runs `fn` on a thread that has joined network namespace `ns`. Sockets and
// threads a transport creates there (listeners, I/O loops) stay in it.
template <typename F>
auto in_namespace(const std::string& ns, F fn) -> decltype(fn()) {
  return std::async(std::launch::async,
                    [&] {
                      const int fd = ::open(("/var/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
                      EXPECT_GE(fd, 0) << ns;
                      EXPECT_EQ(::setns(fd, CLONE_NEWNET), 0) << std::strerror(errno);
                      ::close(fd);
                      return fn();
                    })
      .get();
}

bool sh(const std::string& command) {
  const auto r = testing::run_command(command);
  EXPECT_EQ(r.exit_code, 0) << command << ": " << r.err;
  return r.exit_code == 0;
}

class MooncakeRails : public ::testing::Test, protected testing::TransportPair {
 protected:
  void SetUp() override {
    const std::string id = std::to_string(::getpid());
    a_ = "pdkv-a-" + id;
    b_ = "pdkv-b-" + id;
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to create network namespaces";
    const auto probe = testing::run_command("ip netns add " + a_);
    if (probe.exit_code != 0) {
      GTEST_SKIP() << "cannot create a network namespace here: " << probe.err;
    }
    created_ = true;
    ASSERT_TRUE(sh("ip netns add " + b_));
    for (int link : {0, 1}) {
      const std::string l = std::to_string(link);
      ASSERT_TRUE(sh("ip link add va" + l + " netns " + a_ + " type veth peer name vb" + l +
                     " netns " + b_));
      ASSERT_TRUE(sh("ip -n " + a_ + " addr add 10.231." + l + ".1/24 dev va" + l));
      ASSERT_TRUE(sh("ip -n " + b_ + " addr add 10.231." + l + ".2/24 dev vb" + l));
      ASSERT_TRUE(sh("ip -n " + a_ + " link set va" + l + " up"));
      ASSERT_TRUE(sh("ip -n " + b_ + " link set vb" + l + " up"));
    }
    // Both sides in one process: the same-host path is off so that bytes
    // take the rails.
    receiver_ = in_namespace(b_, [] {
                  return create_transport(
                      "mooncake", {{"listen", "10.231.0.2,10.231.1.2"}, {"same_host", "off"}});
                }).value();
    sender_ = in_namespace(a_, [] {
                return create_transport("mooncake", {{"listen", "10.231.0.1"},
                                                     {"bind", "10.231.0.1,10.231.1.1"},
                                                     {"rails", "2"},
                                                     {"slice_timeout_ms", "300"},
                                                     {"request_timeout_ms", "3000"},
                                                     {"same_host", "off"}});
              }).value();
  }
  void TearDown() override {
    sender_.reset();
    receiver_.reset();
    if (created_) {  // veth pairs go with their namespaces
      testing::run_command("ip netns del " + a_);
      testing::run_command("ip netns del " + b_);
    }
  }
  void connect(size_t bytes) {
    TransportPair::connect(bytes, [this](Transport& t, const std::string& desc) {
      return in_namespace(a_, [&] { return t.connect(desc); });
    });
  }
  BatchStatus wait(BatchId batch) { return testing::wait_batch(*sender_, batch); }
  // Throttles both links (tbf), so that a transfer lasts long enough to
  // take a link down in the middle of it.
  void throttle() {
    for (int link : {0, 1}) {
      const std::string l = std::to_string(link);
      ASSERT_TRUE(sh("ip netns exec " + a_ + " tc qdisc add dev va" + l +
                     " root tbf rate 400mbit burst 256kb latency 100ms"));
    }
  }
  // Bytes the target's end of `link` received (the kernel's counter).
  uint64_t rx_bytes(int link) {
    const auto r = testing::run_command("ip netns exec " + b_ + " cat /sys/class/net/vb" +
                                        std::to_string(link) + "/statistics/rx_bytes");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.exit_code == 0 ? std::stoull(r.out) : 0;
  }
  void link_down(int link) {
    ASSERT_TRUE(sh("ip -n " + a_ + " link set va" + std::to_string(link) + " down"));
  }

  std::string a_, b_;
  bool created_ = false;
};

TEST_F(MooncakeRails, BothRailsCarryBytes) {
  connect(16 << 20);
  auto batch = sender_->write(peer_, std::vector<WriteOp>{{src_key_, 0, dst_key_, 0, 16 << 20}});
  ASSERT_TRUE(batch.is_ok()) << batch.status().to_string();
  const BatchStatus st = wait(*batch);
  ASSERT_EQ(st.state, BatchState::kDone) << st.error.to_string();
  EXPECT_TRUE(src_ == received());
  // Both links carried traffic: each veth in the target's namespace received
  // at least a quarter of the bytes (the kernel's counters, not ours).
  for (int link : {0, 1}) EXPECT_GT(rx_bytes(link), uint64_t{4} << 20) << "link " << link;
}

TEST_F(MooncakeRails, ALinkDownMidTransferMovesItsSlicesToTheOtherRail) {
  connect(64 << 20);
  throttle();  // 2 x 400 Mbit/s: 64 MiB take over a second
  auto batch = sender_->write(peer_, std::vector<WriteOp>{{src_key_, 0, dst_key_, 0, 64 << 20}});
  ASSERT_TRUE(batch.is_ok()) << batch.status().to_string();
  // Mid-transfer: some megabytes have crossed each link, the batch is not done.
  ASSERT_TRUE(testing::poll_until(
      [&] { return rx_bytes(0) > (uint64_t{4} << 20) && rx_bytes(1) > (uint64_t{4} << 20); }, 10s));
  link_down(0);
  ASSERT_EQ(sender_->poll(*batch).state, BatchState::kInProgress) << "finished too soon to test";
  const BatchStatus st = wait(*batch);
  ASSERT_EQ(st.state, BatchState::kDone) << st.error.to_string();
  EXPECT_TRUE(src_ == received());
  // Later batches go on the surviving rail.
  reset_destination();
  auto again = sender_->write(peer_, std::vector<WriteOp>{{src_key_, 5, dst_key_, 7, 1 << 20}});
  ASSERT_EQ(wait(*again).state, BatchState::kDone);
  EXPECT_EQ(std::memcmp(received().data() + 7, src_.data() + 5, 1 << 20), 0);
}

TEST_F(MooncakeRails, BothLinksDownFailsTheBatchWithAReasonInTime) {
  connect(16 << 20);
  // The rails are up and proven.
  auto first = sender_->write(peer_, std::vector<WriteOp>{{src_key_, 0, dst_key_, 0, 1 << 20}});
  ASSERT_EQ(wait(*first).state, BatchState::kDone);
  link_down(0);
  link_down(1);
  const auto start = std::chrono::steady_clock::now();
  auto batch = sender_->write(peer_, std::vector<WriteOp>{{src_key_, 0, dst_key_, 0, 16 << 20}});
  ASSERT_TRUE(batch.is_ok()) << batch.status().to_string();
  const BatchStatus st = wait(*batch);
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(st.state, BatchState::kFailed);
  // Within the configured request timeout (3 s); the rails' own timeout
  // (300 ms without progress) normally ends it much sooner.
  EXPECT_LT(took, 3s) << std::chrono::duration_cast<std::chrono::milliseconds>(took).count();
  EXPECT_NE(st.error.message().find("rail 0"), std::string::npos) << st.error.to_string();
  EXPECT_NE(st.error.message().find("rail 1"), std::string::npos) << st.error.to_string();
}

}  // namespace
}  // namespace pdkv

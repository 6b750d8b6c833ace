// The bootstrap service: registry rules directly, then the same over gRPC.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>

#include "bootstrap/client.h"
#include "bootstrap/registry.h"
#include "pdkv.grpc.pb.h"
#include "pdkv/bootstrap.h"
#include "support/rank_info.h"

namespace pdkv {
namespace {

using namespace std::chrono_literals;

using testing::registered_rank;

TEST(BootstrapRegistry, TopologyUnavailableUntilEveryRankRegistered) {
  bootstrap::Registry reg;
  EXPECT_EQ(reg.topology("prefill-a", 0).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(reg.register_rank(registered_rank(1, 2)).is_ok());
  auto partial = reg.topology("prefill-a", 0);
  EXPECT_EQ(partial.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(partial.status().message(), "engine 'prefill-a' dp 0: 1 of 2 ranks registered");
  ASSERT_TRUE(reg.register_rank(registered_rank(0, 2)).is_ok());
  auto full = reg.topology("prefill-a", 0).value();
  ASSERT_EQ(full.size(), 2u);
  EXPECT_EQ(full[0].tp_rank(), 0u);  // ordered by (pp, tp)
  EXPECT_EQ(full[1].tp_rank(), 1u);
}

// Live ranks renew their registration every second, so that a restarted
// service learns them again; a renewal never displaces a newer incarnation
// (a process that was frozen, then replaced, thaws and renews).
TEST(BootstrapRegistry, ARenewalRestoresARankButNeverDisplacesItsSuccessor) {
  bootstrap::Registry reg;
  auto first = registered_rank(0, 1);
  auto renewed = reg.register_rank(first, /*renewal=*/true);  // a restarted service
  ASSERT_TRUE(renewed.is_ok()) << renewed.status().message();
  EXPECT_FALSE(renewed->replaced);
  EXPECT_TRUE(reg.register_rank(first, /*renewal=*/true).value().replaced);
  auto successor = registered_rank(0, 1);
  successor.set_incarnation(2);
  successor.set_control_address("127.0.0.1:7100");
  ASSERT_TRUE(reg.register_rank(successor).is_ok());  // a restart replaces
  const auto stale = reg.register_rank(first, /*renewal=*/true);
  EXPECT_EQ(stale.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(stale.status().message(),
            "prefill-a dp 0 tp 0 pp 0: incarnation 1 renews, but incarnation 2 registered since");
  EXPECT_EQ(reg.topology("prefill-a", 0).value()[0].control_address(), "127.0.0.1:7100");
}

TEST(BootstrapRegistry, MismatchedSpecRefusedNamingBothValues) {
  bootstrap::Registry reg;
  ASSERT_TRUE(reg.register_rank(registered_rank(0, 2)).is_ok());
  auto bad = registered_rank(1, 2);
  bad.mutable_kv_spec()->set_page_size(32);
  EXPECT_EQ(reg.register_rank(bad).status().message(),
            "prefill-a dp 0 tp 1 pp 0 registers page_size 32 but prefill-a dp 0 tp 0 pp 0 "
            "registered 16");
  bad = registered_rank(1, 2);
  bad.set_backend("nixl");
  EXPECT_EQ(reg.register_rank(bad).status().message(),
            "prefill-a dp 0 tp 1 pp 0 registers backend nixl but prefill-a dp 0 tp 0 pp 0 "
            "registered loopback");
  bad = registered_rank(1, 2);
  bad.mutable_kv_spec()->set_layout(proto::LAYOUT_HND);
  EXPECT_EQ(reg.register_rank(bad).status().message(),
            "prefill-a dp 0 tp 1 pp 0 registers layout hnd but prefill-a dp 0 tp 0 pp 0 "
            "registered nhd");
  for (auto mutate : {+[](proto::RankInfo& r) { r.mutable_kv_spec()->set_dtype_bytes(4); },
                      +[](proto::RankInfo& r) { r.mutable_kv_spec()->set_head_dim(64); },
                      +[](proto::RankInfo& r) { r.mutable_kv_spec()->set_total_heads(4); },
                      +[](proto::RankInfo& r) { r.set_tp_size(4); }}) {
    bad = registered_rank(1, 2);
    mutate(bad);
    EXPECT_EQ(reg.register_rank(bad).status().code(), StatusCode::kInvalidArgument);
  }
  // Nothing refused was stored: the engine still waits for rank 1.
  EXPECT_EQ(reg.topology("prefill-a", 0).status().code(), StatusCode::kUnavailable);
}

TEST(BootstrapRegistry, RankOutsideItsSizes) {
  bootstrap::Registry reg;
  EXPECT_EQ(reg.register_rank(registered_rank(2, 2)).status().message(),
            "prefill-a dp 0 tp 2 pp 0: tp rank 2 is outside tp size 2");
  EXPECT_EQ(reg.register_rank(registered_rank(0, 1, 0, 1, 30, 4)).status().message(),
            "prefill-a dp 0 tp 0 pp 0: layers [30, 34) outside the model's 32");
}

TEST(BootstrapRegistry, RestartReplacesTheEntry) {
  bootstrap::Registry reg;
  EXPECT_FALSE(reg.register_rank(registered_rank(0, 1)).value().replaced);
  auto again = registered_rank(0, 1);
  again.set_incarnation(2);
  again.set_control_address("127.0.0.1:9999");
  EXPECT_TRUE(reg.register_rank(again).value().replaced);
  auto topo = reg.topology("prefill-a", 0).value();
  ASSERT_EQ(topo.size(), 1u);
  EXPECT_EQ(topo[0].incarnation(), 2u);
  EXPECT_EQ(topo[0].control_address(), "127.0.0.1:9999");
}

TEST(BootstrapRegistry, PipelineStagesMustCoverTheLayers) {
  bootstrap::Registry reg;
  ASSERT_TRUE(reg.register_rank(registered_rank(0, 1, 0, 2, 0, 16)).is_ok());
  ASSERT_TRUE(reg.register_rank(registered_rank(0, 1, 1, 2, 20, 12)).is_ok());
  EXPECT_EQ(reg.topology("prefill-a", 0).status().message(),
            "engine 'prefill-a' dp 0: prefill PP stage 1 starts at 20 but prefill PP stage 0 "
            "ends at 16: ranges of layers must be consecutive");
  ASSERT_TRUE(reg.register_rank(registered_rank(0, 1, 1, 2, 16, 16)).is_ok());  // restart, fixed
  EXPECT_EQ(reg.topology("prefill-a", 0).value().size(), 2u);
}

TEST(Registry, EnginesAndTheirSizesAreBounded) {
  Limits limits;
  limits.engines = 1;
  limits.ranks_per_engine = 4;
  bootstrap::Registry reg(limits);
  ASSERT_TRUE(reg.register_rank(registered_rank(0, 4)).is_ok());
  const Status big = reg.register_rank(registered_rank(0, 8)).status();
  EXPECT_EQ(big.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(big.message(),
            "prefill-a dp 0 tp 0 pp 0: an engine of 8 ranks (tp 8 x pp 1 x dp 1) is more than 4 "
            "(Limits::ranks_per_engine)");
  auto other = registered_rank(0, 1);
  other.set_engine_id("prefill-b");
  const Status more = reg.register_rank(other).status();
  EXPECT_EQ(more.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(more.message(),
            "prefill-b dp 0 tp 0 pp 0: 1 engines (and dp ranks) are registered already "
            "(Limits::engines)");
  EXPECT_TRUE(
      reg.register_rank(registered_rank(1, 4)).is_ok());  // the known engine still registers
}

class BootstrapOverGrpc : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::move(BootstrapServer::start("127.0.0.1:0")).value();
    address_ = "127.0.0.1:" + std::to_string(server_->port());
  }
  std::unique_ptr<BootstrapServer> server_;
  std::string address_;
};

TEST_F(BootstrapOverGrpc, RegisterThenTopology) {
  bootstrap::Client client(address_, Security{});
  EXPECT_FALSE(client.register_rank(registered_rank(0, 2), 2s).value());
  EXPECT_EQ(client.topology("prefill-a", 0, 2s).status().code(), StatusCode::kUnavailable);
  EXPECT_FALSE(client.register_rank(registered_rank(1, 2), 2s).value());
  auto topo = client.topology("prefill-a", 0, 2s).value();
  EXPECT_EQ(topo.size(), 2u);
}

TEST_F(BootstrapOverGrpc, RefusalKeepsCodeAndMessage) {
  bootstrap::Client client(address_, Security{});
  ASSERT_TRUE(client.register_rank(registered_rank(0, 2), 2s).is_ok());
  auto bad = registered_rank(1, 2);
  bad.mutable_kv_spec()->set_head_dim(64);
  const Status st = client.register_rank(bad, 2s).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "bootstrap " + address_ +
                              " RegisterRank: prefill-a dp 0 tp 1 pp 0 registers head_dim 64 "
                              "but prefill-a dp 0 tp 0 pp 0 registered 128");
}

TEST_F(BootstrapOverGrpc, IncompleteEngineIsUnavailableSayingHowFar) {
  bootstrap::Client client(address_, Security{});
  ASSERT_TRUE(client.register_rank(registered_rank(0, 2), 2s).is_ok());
  const Status st = client.topology("prefill-a", 0, 2s).status();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("1 of 2 ranks registered"), std::string::npos) << st.message();
}

TEST_F(BootstrapOverGrpc, OtherProtocolVersionRefused) {
  auto stub =
      proto::Bootstrap::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  proto::TopologyRequest request;
  request.set_protocol_version(99);
  request.set_engine_id("prefill-a");
  proto::TopologyReply reply;
  grpc::ClientContext ctx;
  const grpc::Status s = stub->GetTopology(&ctx, request, &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(),
            "peer speaks pdkv protocol version 99, this process speaks version 4");
}

// A service that never answers a connection its kernel accepted (a frozen
// process, replaced on the same port by its supervisor) must not hold a
// rank's connection attempt for gRPC's default 20 s: the attempt is given
// up and the new service is found within seconds.
TEST(BootstrapClient, AnAttemptTheServiceNeverAnswersIsGivenUpForItsSuccessor) {
  const int mute = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(mute, 0);
  const int one = 1;
  ::setsockopt(mute, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof at;
  ASSERT_EQ(::bind(mute, reinterpret_cast<sockaddr*>(&at), sizeof at), 0);
  ASSERT_EQ(::listen(mute, 4), 0);
  ASSERT_EQ(::getsockname(mute, reinterpret_cast<sockaddr*>(&at), &length), 0);
  const std::string address = "127.0.0.1:" + std::to_string(ntohs(at.sin_port));

  bootstrap::Client client(address, Security{});
  auto registered = std::async(
      std::launch::async, [&] { return client.register_rank(registered_rank(0, 1), 8s).status(); });
  // The client's first attempt reaches the mute listener; it stays open,
  // silent, while the real service takes the port over.
  pollfd wait{mute, POLLIN, 0};
  ASSERT_EQ(::poll(&wait, 1, 5000), 1) << "the client never connected";
  const int held = ::accept4(mute, nullptr, nullptr, SOCK_CLOEXEC);
  ASSERT_GE(held, 0);
  ::close(mute);
  auto server = BootstrapServer::start(address);
  ASSERT_TRUE(server.is_ok()) << server.status().message();
  const Status st = registered.get();
  ::close(held);
  EXPECT_TRUE(st.is_ok()) << st.message();
}

}  // namespace
}  // namespace pdkv

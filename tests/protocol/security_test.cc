// With a cluster secret, nobody without it is served on any RPC of either
// service, a captured call cannot be replayed or given another body, and an
// authenticated process that is not a room's peer cannot steer the room
// (issue 17, points 1 and 5). Expected codes and texts are written here by
// hand; the signed metadata is built with the documented layout.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "bootstrap/client.h"
#include "engine/routing.h"
#include "pdkv.grpc.pb.h"
#include "security/call_auth.h"
#include "security/grpc_security.h"
#include "support/cluster.h"

namespace pdkv {
namespace {

using namespace std::chrono_literals;
using testing::Cluster;
using testing::ClusterSpec;
using testing::first_pages;
using testing::poll_until;

Security with_secret(const std::string& secret) {
  Security s;
  s.secret = secret;
  return s;
}

const std::string kSecret = "0123456789abcdef-cluster-secret";

class Security17 : public ::testing::Test {
 protected:
  void SetUp() override {
    ClusterSpec spec;
    spec.kv.total_heads = 8;
    spec.prefill_tp = 1;
    spec.decode_tp = 1;
    spec.security = with_secret(kSecret);
    cluster_ = Cluster::start(spec);
    ASSERT_NE(cluster_, nullptr);
    bootstrap::Client client(cluster_->bootstrap_address(), spec.security);
    decode_ = client.topology("decode", 0, 2s).value().at(0);
    prefill_ = client.topology("prefill", 0, 2s).value().at(0);
  }

  static std::shared_ptr<grpc::Channel> channel(const std::string& address,
                                                const Security& security) {
    return security::make_channel(address, grpc::ChannelArguments(), security);
  }

  // One call of every RPC of both services over `security`; their codes.
  std::vector<grpc::StatusCode> every_rpc(const Security& security) {
    std::vector<grpc::StatusCode> codes;
    auto boot = proto::Bootstrap::NewStub(channel(cluster_->bootstrap_address(), security));
    {
      proto::RegisterRankRequest r;
      r.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
      *r.mutable_rank() = prefill_;
      r.set_renewal(true);
      proto::RegisterRankReply reply;
      grpc::ClientContext ctx;
      codes.push_back(boot->RegisterRank(&ctx, r, &reply).error_code());
    }
    {
      proto::TopologyRequest r;
      r.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
      r.set_engine_id("prefill");
      proto::TopologyReply reply;
      grpc::ClientContext ctx;
      codes.push_back(boot->GetTopology(&ctx, r, &reply).error_code());
    }
    auto to_prefill = proto::Control::NewStub(channel(prefill_.control_address(), security));
    auto to_decode = proto::Control::NewStub(channel(decode_.control_address(), security));
    proto::ControlReply reply;
    {
      grpc::ClientContext ctx;
      codes.push_back(to_prefill->SendTransferInfo(&ctx, info(900), &reply).error_code());
    }
    {
      grpc::ClientContext ctx;
      codes.push_back(to_decode->ReportStatus(&ctx, status(900, prefill_), &reply).error_code());
    }
    {
      grpc::ClientContext ctx;
      codes.push_back(to_prefill->AbortRoom(&ctx, abort(900, decode_), &reply).error_code());
    }
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + 5s);
      auto stream = to_prefill->Watch(&ctx);
      proto::Heartbeat hello;
      hello.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
      *hello.mutable_from() = engine::ref_of(decode_);
      stream->Write(hello);
      stream->WritesDone();
      proto::Heartbeat in;
      while (stream->Read(&in)) {
      }
      codes.push_back(stream->Finish().error_code());
    }
    return codes;
  }

  proto::TransferInfo info(RoomId room, const proto::RankInfo& from_rank = {}) const {
    proto::TransferInfo i;
    i.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
    i.set_room(room);
    *i.mutable_decode() = engine::ref_of(from_rank.engine_id().empty() ? decode_ : from_rank);
    const auto pages = first_pages(2, 4);
    i.mutable_dst_pages()->Add(pages.begin(), pages.end());
    return i;
  }
  static proto::RoomStatus status(RoomId room, const proto::RankInfo& from) {
    proto::RoomStatus s;
    s.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
    s.set_room(room);
    *s.mutable_prefill() = engine::ref_of(from);
    s.set_success(true);
    return s;
  }
  static proto::AbortRequest abort(RoomId room, const proto::RankInfo& from) {
    proto::AbortRequest a;
    a.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
    a.set_room(room);
    *a.mutable_decode() = engine::ref_of(from);
    a.set_reason("forged");
    return a;
  }

  std::unique_ptr<Cluster> cluster_;
  proto::RankInfo decode_, prefill_;
};

TEST_F(Security17, NoSecretOrWrongSecretIsRefusedOnEveryRpc) {
  const std::vector<grpc::StatusCode> refused(6, grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(every_rpc(Security{}), refused);
  EXPECT_EQ(every_rpc(with_secret("another-secret-of-32-bytes-......")), refused);
  // Positive control: with the secret, no call is refused for its credentials.
  for (grpc::StatusCode code : every_rpc(with_secret(kSecret))) {
    EXPECT_NE(code, grpc::StatusCode::UNAUTHENTICATED);
  }
}

// A call signed by hand: `pdkv-auth: <ms>.<nonce hex>.<mac hex>`.
class SignedCalls : public Security17 {
 protected:
  grpc::Status send(const proto::TransferInfo& body, const std::string& metadata) {
    auto stub = proto::Control::NewStub(
        grpc::CreateChannel(prefill_.control_address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.AddMetadata(security::kAuthMetadata, metadata);
    proto::ControlReply reply;
    return stub->SendTransferInfo(&ctx, body, &reply);
  }
  static constexpr char kMethod[] = "/pdkv.proto.Control/SendTransferInfo";
  const std::string nonce_ = std::string(security::kNonceBytes, '\x5a');
};

TEST_F(SignedCalls, AReplayedCallIsRefused) {
  const proto::TransferInfo body = info(910);
  const std::string signed_once = security::sign_call(kSecret, kMethod, body.SerializeAsString(),
                                                      security::unix_ms_now(), nonce_);
  EXPECT_NE(send(body, signed_once).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  const grpc::Status again = send(body, signed_once);
  EXPECT_EQ(again.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(again.error_message(), "control: a replayed call (nonce seen before)");
}

TEST_F(SignedCalls, ASignatureDoesNotCoverAnotherBodyMethodOrTime) {
  const proto::TransferInfo body = info(911);
  const int64_t now = security::unix_ms_now();
  const std::string for_body =
      security::sign_call(kSecret, kMethod, body.SerializeAsString(), now, nonce_);
  const grpc::Status other_body = send(info(912), for_body);
  EXPECT_EQ(other_body.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(other_body.error_message(),
            "control call /pdkv.proto.Control/SendTransferInfo: wrong credentials (not signed "
            "with this cluster's secret)");
  const std::string for_abort = security::sign_call(kSecret, "/pdkv.proto.Control/AbortRoom",
                                                    body.SerializeAsString(), now, nonce_);
  EXPECT_EQ(send(body, for_abort).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // Signed two minutes ago (the window is 30 s either side).
  const std::string stale =
      security::sign_call(kSecret, kMethod, body.SerializeAsString(), now - 120'000, nonce_);
  const grpc::Status old = send(body, stale);
  EXPECT_EQ(old.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(old.error_message().find("from this host's clock (allowed: 30000 ms)"),
            std::string::npos)
      << old.error_message();
  EXPECT_EQ(send(body, "12.zz.00").error_message(),
            "malformed pdkv-auth on /pdkv.proto.Control/SendTransferInfo");
}

// Forged control messages from a process that holds the secret but is not
// the room's peer: refused, and the room goes on to a verified success.
class ForgedByAPeer : public Security17 {
 protected:
  void SetUp() override {
    Security17::SetUp();
    stranger_ = decode_;
    stranger_.set_engine_id("intruder");
    impostor_ = decode_;
    impostor_.set_incarnation(decode_.incarnation() + 1);  // the rank's name, not its process
    stale_source_ = prefill_;
    stale_source_.set_incarnation(prefill_.incarnation() + 1);
    const Security mine = with_secret(kSecret);
    to_prefill_ = proto::Control::NewStub(channel(prefill_.control_address(), mine));
    to_decode_ = proto::Control::NewStub(channel(decode_.control_address(), mine));
  }

  // Opens room `room` on both sides (prefill's Sender names the decode
  // engine) with its metadata accepted, not yet sent.
  void open_room(RoomId room) {
    cluster_->fill(room, pages_, 0, {});
    rx_ = std::move(cluster_->decode[0]->receiver(room, "prefill")).value();
    ASSERT_TRUE(rx_->init().is_ok());
    tx_ = std::move(cluster_->prefill[0]->sender(room, "decode")).value();
    ASSERT_TRUE(tx_->init(pages_.size()).is_ok());
    ASSERT_TRUE(rx_->send_metadata(pages_).is_ok());
    ASSERT_TRUE(poll_until([&] { return tx_->poll() == PollState::kWaitingForInput; }))
        << tx_->failure().to_string();
  }
  void finish_room(RoomId room) {
    ASSERT_TRUE(tx_->send(pages_, true).is_ok());
    ASSERT_TRUE(poll_until([&] { return rx_->poll() == PollState::kSuccess; }))
        << rx_->failure().to_string();
    EXPECT_EQ(cluster_->verify(room, pages_, 0, {}), "");
  }
  grpc::Status call_info(const proto::TransferInfo& i) {
    grpc::ClientContext ctx;
    proto::ControlReply reply;
    return to_prefill_->SendTransferInfo(&ctx, i, &reply);
  }
  grpc::Status call_abort(const proto::AbortRequest& a) {
    grpc::ClientContext ctx;
    proto::ControlReply reply;
    return to_prefill_->AbortRoom(&ctx, a, &reply);
  }
  grpc::Status call_status(const proto::RoomStatus& s) {
    grpc::ClientContext ctx;
    proto::ControlReply reply;
    return to_decode_->ReportStatus(&ctx, s, &reply);
  }

  const std::vector<uint64_t> pages_ = first_pages(2, 3);
  proto::RankInfo stranger_, impostor_, stale_source_;
  std::unique_ptr<proto::Control::Stub> to_prefill_, to_decode_;
  std::unique_ptr<Receiver> rx_;
  std::unique_ptr<Sender> tx_;
};

TEST_F(ForgedByAPeer, TransferInfoFromAnotherEngineOrProcess) {
  open_room(920);
  const grpc::Status other_engine = call_info(info(920, stranger_));
  EXPECT_EQ(other_engine.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(other_engine.error_message(),
            "room 920 is bound for engine 'decode' dp 0, not intruder dp 0 tp 0 pp 0");
  // Its own engine's name with another process's incarnation.
  const grpc::Status other_process = call_info(info(920, impostor_));
  EXPECT_EQ(other_process.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  finish_room(920);
}

TEST_F(ForgedByAPeer, AbortFromAnotherEngineOrProcess) {
  open_room(921);
  const grpc::Status other_engine = call_abort(abort(921, stranger_));
  EXPECT_EQ(other_engine.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  const grpc::Status other_process = call_abort(abort(921, impostor_));
  EXPECT_EQ(other_process.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(other_process.error_message(),
            fmt::format("room 921: decode dp 0 tp 0 pp 0 incarnation {} is not the registered "
                        "one ({})",
                        impostor_.incarnation(), decode_.incarnation()));
  EXPECT_EQ(tx_->poll(), PollState::kWaitingForInput);
  finish_room(921);
}

TEST_F(ForgedByAPeer, SuccessReportForBytesNeverWritten) {
  open_room(922);
  // Claims success before a byte was written: from a process that is not
  // the registered source, and from a rank that is no source at all.
  const grpc::Status not_the_process = call_status(status(922, stale_source_));
  EXPECT_EQ(not_the_process.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(not_the_process.error_message(),
            "room 922: prefill dp 0 tp 0 pp 0 is not a source of decode dp 0 tp 0 pp 0");
  proto::RankInfo other = prefill_;
  other.set_engine_id("intruder");
  EXPECT_EQ(call_status(status(922, other)).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(rx_->poll(), PollState::kSuccess);
  finish_room(922);
}

}  // namespace
}  // namespace pdkv

namespace pdkv {
namespace {

// A throwaway CA and one node certificate for 127.0.0.1, made with the
// openssl command (a real CA's tools, not ours), in a fresh directory.
class Tls : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/pdkv-tls-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
    std::ofstream(dir_ + "/san.cnf") << "subjectAltName=IP:127.0.0.1\n";
    const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    const std::string script = "cd " + dir_ + " && openssl req -x509 " + key +
                               " -keyout ca.key -out ca.pem -days 1 -subj /CN=pdkv-test-ca && "
                               "openssl req " +
                               key +
                               " -keyout node.key -out node.csr -subj /CN=node && "
                               "openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key "
                               "-CAcreateserial -out node.pem -days 1 -extfile san.cnf";
    ASSERT_EQ(std::system((script + " >/dev/null 2>&1").c_str()), 0) << script;
    auto loaded = load_security("", dir_ + "/node.pem", dir_ + "/node.key", dir_ + "/ca.pem");
    ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
    mutual_ = *loaded;
    mutual_.secret = kSecret;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
  Security mutual_;
};

TEST_F(Tls, AMutualTlsClusterMovesARoomAndRefusesPlaintextAndStrangers) {
  ClusterSpec spec;
  spec.security = mutual_;
  auto cluster = Cluster::start(spec);
  ASSERT_NE(cluster, nullptr);
  const auto pages = first_pages(2, 1);
  cluster->fill(930, pages, 0, {});
  auto rx = std::move(cluster->decode[0]->receiver(930, "prefill")).value();
  auto tx = std::move(cluster->prefill[0]->sender(930, "decode")).value();
  ASSERT_TRUE(rx->init().is_ok());
  ASSERT_TRUE(rx->send_metadata(pages).is_ok());
  ASSERT_TRUE(tx->init(2).is_ok());
  ASSERT_TRUE(tx->send(pages, true).is_ok());
  ASSERT_TRUE(poll_until([&] { return rx->poll() == PollState::kSuccess; }))
      << rx->failure().to_string();
  EXPECT_EQ(cluster->verify(930, pages, 0, {}), "");

  auto topology = [&](const Security& s) {
    return bootstrap::Client(cluster->bootstrap_address(), s).topology("prefill", 0, 2s).status();
  };
  EXPECT_TRUE(topology(mutual_).is_ok());
  // Plaintext to a TLS port, and TLS without a client certificate: no answer.
  EXPECT_EQ(topology(with_secret(kSecret)).code(), StatusCode::kUnavailable);
  Security no_client_cert;
  no_client_cert.secret = kSecret;
  no_client_cert.tls_ca = mutual_.tls_ca;
  EXPECT_EQ(bootstrap::Client(cluster->bootstrap_address(), no_client_cert)
                .topology("prefill", 0, 2s)
                .status()
                .code(),
            StatusCode::kUnavailable);
}

}  // namespace
}  // namespace pdkv

// Bad input on the control port gets an error back to whoever sent it and
// leaves every other room untouched (issue: protocol layer, point 7).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <numeric>

#include "bootstrap/client.h"
#include "engine/routing.h"
#include "pdkv.grpc.pb.h"
#include "support/cluster.h"

namespace pdkv {
namespace {

using namespace std::chrono_literals;
using testing::Cluster;
using testing::ClusterSpec;
using testing::first_pages;
using testing::poll_until;
using testing::shape;

class BadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    ClusterSpec spec;
    spec.kv.total_heads = 8;
    spec.prefill_tp = 4;  // prefill 0, 1 -> decode 0; prefill 2, 3 -> decode 1
    spec.decode_tp = 2;
    cluster_ = Cluster::start(spec);
    ASSERT_NE(cluster_, nullptr);
    bootstrap::Client client(cluster_->bootstrap_address(), Security{});
    decode_ranks_ = client.topology("decode", 0, 2s).value();
    prefill_ranks_ = client.topology("prefill", 0, 2s).value();
  }

  std::unique_ptr<proto::Control::Stub> stub_to(const std::string& address) {
    return proto::Control::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  }

  // Metadata as decode rank `d` would send it, straight to prefill rank `p`.
  grpc::Status send_info(int p, int d, RoomId room, const std::vector<uint64_t>& pages,
                         uint32_t version = proto::PROTOCOL_VERSION_CURRENT) {
    proto::TransferInfo info;
    info.set_protocol_version(version);
    info.set_room(room);
    *info.mutable_decode() = engine::ref_of(decode_ranks_[d]);
    info.mutable_dst_pages()->Add(pages.begin(), pages.end());
    proto::ControlReply reply;
    grpc::ClientContext ctx;
    return stub_to(prefill_ranks_[p].control_address())->SendTransferInfo(&ctx, info, &reply);
  }

  // A report as prefill rank `p` would make it.
  proto::RoomStatus status_of(int p, RoomId room, bool success, const std::string& reason = "") {
    proto::RoomStatus st;
    st.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
    st.set_room(room);
    *st.mutable_prefill() = engine::ref_of(prefill_ranks_[p]);
    st.set_success(success);
    st.set_reason(reason);
    st.set_code(static_cast<uint32_t>(StatusCode::kInternal));
    return st;
  }

  grpc::Status send_status(int p, int d, RoomId room, bool success,
                           const std::string& reason = "") {
    proto::ControlReply reply;
    grpc::ClientContext ctx;
    return stub_to(decode_ranks_[d].control_address())
        ->ReportStatus(&ctx, status_of(p, room, success, reason), &reply);
  }

  // Several reports in one call to decode rank `d`.
  grpc::Status send_statuses(int d, const std::vector<proto::RoomStatus>& statuses,
                             proto::ControlReplies* reply,
                             uint32_t version = proto::PROTOCOL_VERSION_CURRENT) {
    proto::RoomStatuses batch;
    batch.set_protocol_version(version);
    batch.mutable_statuses()->Add(statuses.begin(), statuses.end());
    grpc::ClientContext ctx;
    return stub_to(decode_ranks_[d].control_address())->ReportStatuses(&ctx, batch, reply);
  }

  // A complete, healthy room alongside the bad input: it must still succeed.
  void expect_other_room_succeeds(RoomId room) {
    Cluster& c = *cluster_;
    std::vector<std::unique_ptr<Receiver>> rx;
    std::vector<std::unique_ptr<Sender>> tx;
    const auto pages = first_pages(3, 10);
    c.fill(room, pages, 0, {});
    for (auto& e : c.decode) {
      rx.push_back(std::move(e->receiver(room, "prefill")).value());
      ASSERT_TRUE(rx.back()->init().is_ok());
      ASSERT_TRUE(rx.back()->send_metadata(pages).is_ok());
    }
    for (auto& e : c.prefill) {
      tx.push_back(std::move(e->sender(room, "decode")).value());
      ASSERT_TRUE(tx.back()->init(3).is_ok());
      ASSERT_TRUE(tx.back()->send(pages, true).is_ok());
    }
    ASSERT_TRUE(poll_until([&] {
      for (auto& r : rx)
        if (r->poll() != PollState::kSuccess) return false;
      return true;
    })) << rx[0]->failure().to_string()
        << " / " << rx[1]->failure().to_string();
    EXPECT_EQ(c.verify(room, pages, 0, {}), "");
  }

  std::unique_ptr<Cluster> cluster_;
  std::vector<proto::RankInfo> decode_ranks_, prefill_ranks_;
};

TEST_F(BadInput, MetadataFromARankTheMapDoesNotName) {
  const grpc::Status s = send_info(0, 1, 100, first_pages(2));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(),
            "room 100: prefill dp 0 tp 0 pp 0 has nothing to send to decode dp 0 tp 1 pp 0; its "
            "destinations are [decode dp 0 tp 0 pp 0]");
  expect_other_room_succeeds(101);
}

TEST_F(BadInput, PageBeyondTheDecodePool) {
  const grpc::Status s = send_info(0, 0, 100, {3, 16});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(s.error_message(),
            "room 100: decode dp 0 tp 0 pp 0 page list entry 1 is page 16, but "
            "its pool has 16 pages");
  EXPECT_EQ(send_info(0, 0, 100, {3, 3}).error_message(),
            "room 100: decode dp 0 tp 0 pp 0 lists page 3 twice");
  expect_other_room_succeeds(101);
}

TEST_F(BadInput, DuplicateMetadataAndPageCountMismatch) {
  auto tx = std::move(cluster_->prefill[0]->sender(100, "decode")).value();
  ASSERT_TRUE(tx->init(3).is_ok());
  EXPECT_EQ(send_info(0, 0, 100, first_pages(2)).error_message(),
            "room 100: decode dp 0 tp 0 pp 0 offers 2 pages, prefill sends 3");
  EXPECT_TRUE(send_info(0, 0, 100, first_pages(3)).ok());
  const grpc::Status again = send_info(0, 0, 100, first_pages(3));
  EXPECT_EQ(again.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(again.error_message(), "room 100: second metadata from decode dp 0 tp 0 pp 0");
  expect_other_room_succeeds(101);
}

TEST_F(BadInput, OtherProtocolVersion) {
  const grpc::Status s = send_info(0, 0, 100, first_pages(2), 7);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(),
            "peer speaks pdkv protocol version 7, this process speaks version 4");
}

TEST_F(BadInput, ClosedRoomIsNeverResurrected) {
  { auto tx = std::move(cluster_->prefill[0]->sender(100, "decode")).value(); }
  const grpc::Status s = send_info(0, 0, 100, first_pages(2));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(), "room 100 is closed on prefill dp 0 tp 0 pp 0");
  EXPECT_EQ(cluster_->prefill[0]->sender(100, "decode").status().message(),
            "room 100 was used and closed already");
  { auto rx = std::move(cluster_->decode[0]->receiver(200, "prefill")).value(); }
  EXPECT_EQ(send_status(0, 0, 200, true).error_message(),
            "room 200 is closed on decode dp 0 tp 0 pp 0");
}

TEST_F(BadInput, StatusForUnknownRoomOrFromAStranger) {
  EXPECT_EQ(send_status(0, 0, 300, true).error_code(), grpc::StatusCode::NOT_FOUND);
  auto rx = std::move(cluster_->decode[0]->receiver(301, "prefill")).value();
  ASSERT_TRUE(rx->init().is_ok());
  ASSERT_TRUE(poll_until([&] { return rx->poll() == PollState::kWaitingForInput; }));
  const grpc::Status s = send_status(2, 0, 301, true);  // prefill 2 sends only to decode 1
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(),
            "room 301: prefill dp 0 tp 2 pp 0 is not a source of decode dp 0 tp 0 pp 0");
  EXPECT_EQ(rx->poll(), PollState::kWaitingForInput);  // untouched
}

// Each report of a call of several is checked and answered as a call of its
// own would be, in order; one bad report fails nothing but its own answer.
TEST_F(BadInput, ReportsInOneCallAreAnsweredEachOnItsOwn) {
  auto rx = std::move(cluster_->decode[0]->receiver(301, "prefill")).value();
  ASSERT_TRUE(rx->init().is_ok());
  ASSERT_TRUE(poll_until([&] { return rx->poll() == PollState::kWaitingForInput; }));
  proto::RoomStatus other_version = status_of(0, 301, true);
  other_version.set_protocol_version(7);
  proto::ControlReplies reply;
  const grpc::Status s = send_statuses(0,
                                       {status_of(0, 300, true), status_of(2, 301, true),
                                        other_version, status_of(0, 301, false, "disk on fire")},
                                       &reply);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(reply.items_size(), 4);
  const std::vector<std::pair<grpc::StatusCode, std::string>> expected = {
      {grpc::StatusCode::NOT_FOUND, "room 300 is not open on decode dp 0 tp 0 pp 0"},
      {grpc::StatusCode::INVALID_ARGUMENT,
       "room 301: prefill dp 0 tp 2 pp 0 is not a source of decode dp 0 tp 0 pp 0"},
      {grpc::StatusCode::FAILED_PRECONDITION,
       "peer speaks pdkv protocol version 7, this process speaks version 4"},
      {grpc::StatusCode::OK, ""}};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(reply.items(i).code(), static_cast<uint32_t>(expected[i].first)) << "report " << i;
    EXPECT_EQ(reply.items(i).message(), expected[i].second) << "report " << i;
  }
  ASSERT_TRUE(poll_until([&] { return rx->poll() == PollState::kFailed; }));
  EXPECT_EQ(rx->failure().message(), "prefill dp 0 tp 0 pp 0 failed room 301: disk on fire");
  expect_other_room_succeeds(302);
}

TEST_F(BadInput, ACallOfReportsIsRefusedWholeOutsideItsBounds) {
  proto::ControlReplies reply;
  grpc::Status s = send_statuses(0, {}, &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "ReportStatuses carries 0 reports; a call carries 1 to 64");
  s = send_statuses(0, std::vector<proto::RoomStatus>(65, status_of(0, 300, true)), &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "ReportStatuses carries 65 reports; a call carries 1 to 64");
  s = send_statuses(0, {status_of(0, 300, true)}, &reply, 7);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(),
            "peer speaks pdkv protocol version 7, this process speaks version 4");
  EXPECT_EQ(reply.items_size(), 0);
  // 64 is the most: each answered.
  s = send_statuses(0, std::vector<proto::RoomStatus>(64, status_of(0, 300, true)), &reply);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(reply.items_size(), 64);
  EXPECT_EQ(reply.items(63).code(), static_cast<uint32_t>(grpc::StatusCode::NOT_FOUND));
}

TEST_F(BadInput, SuccessAfterFailureStaysFailure) {
  auto rx = std::move(cluster_->decode[0]->receiver(400, "prefill")).value();
  ASSERT_TRUE(rx->init().is_ok());
  ASSERT_TRUE(poll_until([&] { return rx->poll() == PollState::kWaitingForInput; }));
  EXPECT_TRUE(send_status(0, 0, 400, false, "disk on fire").ok());
  // A success after the failure is refused, so that its source fails too.
  for (int p : {0, 1}) {
    const grpc::Status late = send_status(p, 0, 400, true);
    EXPECT_EQ(late.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_EQ(late.error_message(),
              "room 400 failed on decode dp 0 tp 0 pp 0 already: prefill dp 0 tp 0 pp 0 failed "
              "room 400: disk on fire");
  }
  ASSERT_TRUE(poll_until([&] { return rx->poll() == PollState::kFailed; }));
  EXPECT_EQ(rx->failure().message(), "prefill dp 0 tp 0 pp 0 failed room 400: disk on fire");
}

// A source reports once: a second report is refused and changes nothing
// (before, a second success started a second scatter of a staged block).
TEST_F(BadInput, ASecondReportFromTheSameSourceIsRefused) {
  auto rx = std::move(cluster_->decode[0]->receiver(600, "prefill")).value();
  ASSERT_TRUE(rx->init().is_ok());
  ASSERT_TRUE(poll_until([&] { return rx->poll() == PollState::kWaitingForInput; }));
  EXPECT_TRUE(send_status(0, 0, 600, true).ok());
  const grpc::Status again = send_status(0, 0, 600, true);
  EXPECT_EQ(again.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(again.error_message(), "room 600: prefill dp 0 tp 0 pp 0 reported already");
  // The other source's report still counts, and the room succeeds.
  EXPECT_TRUE(send_status(1, 0, 600, true).ok());
  EXPECT_TRUE(poll_until([&] { return rx->poll() == PollState::kSuccess; }))
      << rx->failure().to_string();
}

TEST_F(BadInput, GarbageAndTruncatedBytesOnTheControlPort) {
  const std::string address = prefill_ranks_[0].control_address();
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  const std::vector<std::string> payloads = {
      std::string("\x00\xff\x13garbage that is not HTTP/2 at all\r\n\r\n", 40),
      "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x12\x04",  // a preface, then a truncated frame
      std::string(4096, '\x7f'),
  };
  for (const std::string& bytes : payloads) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    ASSERT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    close(fd);
  }
  expect_other_room_succeeds(500);
}

TEST_F(BadInput, ApiRefusalsNameTheValue) {
  auto& decode = cluster_->decode[0];
  auto rx = std::move(decode->receiver(600, "prefill")).value();
  EXPECT_EQ(decode->receiver(600, "prefill").status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(rx->send_metadata(first_pages(2)).message(), "room 600: send_metadata() before init()");
  ASSERT_TRUE(rx->init().is_ok());
  EXPECT_EQ(rx->send_metadata(std::vector<uint64_t>{1, 99}).message(),
            "room 600: page list entry 1 is page 99, but this pool has 16 pages");
  // Refused input loses nothing: the room still takes valid metadata.
  EXPECT_TRUE(rx->send_metadata(std::vector<uint64_t>{1, 2}).is_ok());
  auto tx = std::move(cluster_->prefill[0]->sender(601, "decode")).value();
  EXPECT_EQ(tx->send(first_pages(1), true).message(), "room 601: send() before init()");
  ASSERT_TRUE(tx->init(2).is_ok());
  EXPECT_EQ(tx->send(first_pages(3), true).message(),
            "room 601: chunks add up to 3 pages but init() announced 2");
  EXPECT_EQ(tx->send(first_pages(1), true).message(),
            "room 601: the last chunk ends at 1 pages but init() announced 2");
  EXPECT_EQ(tx->send(std::vector<uint64_t>{16}, false).message(),
            "room 601: page 16 is beyond this pool's 16 pages");
  EXPECT_EQ(cluster_->decode[0]->sender(1, "prefill").status().message(),
            "sender() needs a prefill engine; this one is decode");
}

}  // namespace
}  // namespace pdkv

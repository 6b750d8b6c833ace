// What a caller can make a rank hold is bounded, and a call beyond a bound
// is refused naming it (issue 17, point 3). Limits are set small here; the
// expected texts are written by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "bootstrap/client.h"
#include "engine/routing.h"
#include "pdkv.grpc.pb.h"
#include "pdkv/bootstrap.h"
#include "support/cluster.h"
#include "support/rooms.h"

namespace pdkv {
namespace {

using namespace std::chrono_literals;
using testing::Cluster;
using testing::ClusterSpec;
using testing::first_pages;
using testing::poll_until;

class Bounds : public ::testing::Test {
 protected:
  // The bounds under test (the rest default), and what else the cluster
  // needs (faults, timeouts).
  virtual void shape(ClusterSpec& spec) const {
    spec.limits.page_list = 4;
    spec.limits.early_rooms = 2;
    spec.limits.watches_per_peer = 1;
  }
  void SetUp() override {
    ClusterSpec spec;
    spec.timeouts.bootstrap = 3s;
    shape(spec);
    cluster_ = Cluster::start(spec);
    ASSERT_NE(cluster_, nullptr);
    bootstrap::Client client(cluster_->bootstrap_address(), Security{});
    decode_ = client.topology("decode", 0, 2s).value().at(0);
    prefill_ = client.topology("prefill", 0, 2s).value().at(0);
    stub_ = proto::Control::NewStub(
        grpc::CreateChannel(prefill_.control_address(), grpc::InsecureChannelCredentials()));
  }

  grpc::Status send_info(RoomId room, uint64_t pages, const std::string& engine = "decode") {
    proto::TransferInfo info;
    info.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
    info.set_room(room);
    *info.mutable_decode() = engine::ref_of(decode_);
    info.mutable_decode()->set_engine_id(engine);
    const auto list = first_pages(pages);
    info.mutable_dst_pages()->Add(list.begin(), list.end());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    proto::ControlReply reply;
    return stub_->SendTransferInfo(&ctx, info, &reply);
  }

  std::unique_ptr<Cluster> cluster_;
  proto::RankInfo decode_, prefill_;
  std::unique_ptr<proto::Control::Stub> stub_;
};

TEST_F(Bounds, ALongerPageListIsRefused) {
  const grpc::Status s = send_info(1, 5);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(s.error_message(),
            "room 1: decode dp 0 tp 0 pp 0 lists 5 pages, more than 4 (Limits::page_list)");
}

TEST_F(Bounds, RoomsOpenedByEarlyMessagesAreBounded) {
  EXPECT_TRUE(send_info(1, 2).ok());
  EXPECT_TRUE(send_info(2, 2).ok());
  const grpc::Status third = send_info(3, 2);
  EXPECT_EQ(third.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(third.error_message(),
            "room 3: 2 rooms known only from early messages are open on prefill dp 0 tp 0 pp 0 "
            "already (Limits::early_rooms)");
  // A Sender's own room is not an early one.
  auto tx = cluster_->prefill[0]->sender(4, "decode");
  EXPECT_TRUE(tx.is_ok());
}

class LookupBounds : public Bounds {
 protected:
  void shape(ClusterSpec& spec) const override { spec.limits.pending_lookups = 1; }
};

TEST_F(LookupBounds, LookupsOfUnknownEnginesAreBounded) {
  // Two engines nobody registered, at once: the first to arrive is looked up
  // (until the bootstrap timeout, 3 s), the other is refused meanwhile.
  auto one = std::async(std::launch::async, [&] { return send_info(1, 2, "ghost-1"); });
  auto two = std::async(std::launch::async, [&] { return send_info(2, 2, "ghost-2"); });
  std::vector<grpc::Status> answers = {one.get(), two.get()};
  std::sort(answers.begin(), answers.end(), [](const grpc::Status& a, const grpc::Status& b) {
    return a.error_code() < b.error_code();
  });
  EXPECT_EQ(answers[0].error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(answers[1].error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(
      answers[1].error_message().find("lookups are waiting already (Limits::pending_lookups)"),
      std::string::npos)
      << answers[1].error_message();
}

TEST_F(Bounds, WatchStreamsPerPeerAreBounded) {
  // Two Watch streams of one watcher at once, the bound 1: whichever the
  // server counts second is refused (the order the two hellos arrive in is
  // the server's), the other stays open until cancelled.
  grpc::ClientContext contexts[2];
  std::unique_ptr<grpc::ClientReaderWriter<proto::Heartbeat, proto::Heartbeat>> streams[2];
  for (int i = 0; i < 2; ++i) {
    streams[i] = stub_->Watch(&contexts[i]);
    proto::Heartbeat hello;
    hello.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
    hello.mutable_from()->set_engine_id("watcher");
    ASSERT_TRUE(streams[i]->Write(hello));
  }
  std::mutex mu;
  std::condition_variable ended_cv;
  std::vector<int> ended;  // stream indices, in the order their reads ended
  grpc::Status statuses[2];
  std::vector<std::thread> readers;
  for (int i = 0; i < 2; ++i) {
    readers.emplace_back([&, i] {
      proto::Heartbeat in;
      while (streams[i]->Read(&in)) {
      }
      statuses[i] = streams[i]->Finish();
      std::lock_guard lock(mu);
      ended.push_back(i);
      ended_cv.notify_all();
    });
  }
  int refused = -1;
  {
    std::unique_lock lock(mu);
    if (ended_cv.wait_for(lock, 10s, [&] { return !ended.empty(); })) refused = ended.front();
  }
  for (int i = 0; i < 2; ++i) {
    if (i != refused) contexts[i].TryCancel();  // both, when neither was refused
  }
  for (auto& t : readers) t.join();
  ASSERT_NE(refused, -1) << "neither stream was refused within 10 s";
  EXPECT_EQ(statuses[refused].error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(statuses[refused].error_message(),
            "'watcher' dp 0 tp 0 pp 0 holds 1 Watch streams here already "
            "(Limits::watches_per_peer)");
  EXPECT_EQ(statuses[1 - refused].error_code(), grpc::StatusCode::CANCELLED)
      << "the stream counted first was held: " << statuses[1 - refused].error_message();
}

// One control call at a time: a decode rank's abort, held at the prefill
// rank while its stalled batch is in flight, fills the bound; a call
// meanwhile is refused naming it, and once the abort is answered the next
// is served again.
class ControlCallBounds : public Bounds {
 protected:
  void shape(ClusterSpec& spec) const override {
    spec.limits.control_calls = 1;
    spec.limits.page_list = 4;  // the probe's TransferInfo is refused by the engine when served
    spec.prefill_faults = parse_faults({"stall_batch=1", "seed=1"}).value();
    spec.timeouts.transfer = 3s;  // a stalled batch is ended after this
  }
  // What the prefill rank says to a call it serves; another text when full.
  std::string probe() { return send_info(99, 5).error_message(); }
  const std::string served_ =
      "room 99: decode dp 0 tp 0 pp 0 lists 5 pages, more than 4 (Limits::page_list)";
  const std::string refused_ = "1 control calls are being served here (Limits::control_calls)";
};

TEST_F(ControlCallBounds, CallsBeyondTheBoundAreRefusedWhileOneIsServed) {
  EXPECT_EQ(probe(), served_);
  auto room = testing::open_room(*cluster_, 4, 3, /*send=*/true);
  ASSERT_TRUE(poll_until([&] { return cluster_->prefill[0]->stats().batches_in_flight == 1; }));
  room.receivers[0]->abort("client went away");
  // The abort travels on its own; once it is held, a probe is refused.
  std::string answer;
  EXPECT_TRUE(poll_until([&] { return (answer = probe()) == refused_; }, 10s)) << answer;
  // Once the stalled batch ends (the transfer timeout) the abort is
  // answered and no longer counts.
  EXPECT_TRUE(poll_until([&] { return (answer = probe()) == served_; }, 20s)) << answer;
  EXPECT_TRUE(poll_until([&] { return room.receivers[0]->poll() == PollState::kFailed; }, 20s));
}

// Each report of a ReportStatuses counts against Limits::control_calls: the
// reports that fit are served, the rest refused one by one, naming it, as
// calls of their own arriving together would be.
class ReportBounds : public Bounds {
 protected:
  void shape(ClusterSpec& spec) const override { spec.limits.control_calls = 2; }
  grpc::Status send_reports(int reports, proto::ControlReplies* reply) {
    proto::RoomStatuses batch;
    batch.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
    for (int i = 0; i < reports; ++i) {
      proto::RoomStatus* st = batch.add_statuses();
      st->set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
      st->set_room(500 + i);
      *st->mutable_prefill() = engine::ref_of(prefill_);
      st->set_success(true);
    }
    auto to_decode = proto::Control::NewStub(
        grpc::CreateChannel(decode_.control_address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    return to_decode->ReportStatuses(&ctx, batch, reply);
  }
};

TEST_F(ReportBounds, EachReportOfACallCounts) {
  proto::ControlReplies reply;
  grpc::Status s = send_reports(3, &reply);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(reply.items_size(), 3);
  EXPECT_EQ(reply.items(0).message(), "room 500 is not open on decode dp 0 tp 0 pp 0");
  EXPECT_EQ(reply.items(1).message(), "room 501 is not open on decode dp 0 tp 0 pp 0");
  EXPECT_EQ(reply.items(2).code(), static_cast<uint32_t>(grpc::StatusCode::RESOURCE_EXHAUSTED));
  EXPECT_EQ(reply.items(2).message(),
            "2 control calls are being served here (Limits::control_calls)");
  // Once answered they no longer count: two are served, twice in a row.
  for (int round = 0; round < 2; ++round) {
    s = send_reports(2, &reply);
    ASSERT_TRUE(s.ok()) << "round " << round << ": " << s.error_message();
    ASSERT_EQ(reply.items_size(), 2);
    EXPECT_EQ(reply.items(1).message(), "room 501 is not open on decode dp 0 tp 0 pp 0");
  }
}

TEST(ReplayCacheBound, ACallBeyondTheCacheIsRefusedNamingTheLimit) {
  Security security;
  security.secret = "0123456789abcdef-cluster-secret";
  Limits limits;
  limits.replay_cache = 2;
  auto server = std::move(BootstrapServer::start("127.0.0.1:0", security, limits)).value();
  bootstrap::Client client("127.0.0.1:" + std::to_string(server->port()), security);
  // Each call is signed with a fresh nonce, remembered for the clock-skew
  // window either side (2 x 30 s, longer than this test).
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(client.topology("nobody", 0, 5s).status().code(), StatusCode::kNotFound);
  }
  const Status third = client.topology("nobody", 0, 5s).status();
  EXPECT_EQ(third.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(third.message(), "bootstrap 127.0.0.1:" + std::to_string(server->port()) +
                                 " GetTopology: bootstrap: 2 calls within 60000 ms fill the "
                                 "replay cache (Limits::replay_cache 2)");
}

}  // namespace
}  // namespace pdkv

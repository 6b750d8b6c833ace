// A link sends the reports that are ready together in one call, and hands
// each report its own answer. The peer here is a recording stand-in for a
// decode rank's Control service, so that the calls themselves can be seen;
// the expected calls and answers are written by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <numeric>
#include <vector>

#include "engine/control_link.h"
#include "engine/control_service.h"
#include "support/poll.h"

namespace pdkv {
namespace {

using namespace std::chrono_literals;
using testing::poll_until;

// Answers a report of an even room OK and one of an odd room NOT_FOUND, and
// records the rooms each call carried.
class RecordingPeer final : public proto::Control::CallbackService {
 public:
  std::vector<std::vector<uint64_t>> calls() {
    std::lock_guard lock(mu_);
    return calls_;
  }

  grpc::ServerUnaryReactor* ReportStatus(grpc::CallbackServerContext* ctx,
                                         const proto::RoomStatus* request,
                                         proto::ControlReply*) override {
    record({request->room()});
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(answer_for(request->room()));
    return reactor;
  }

  grpc::ServerUnaryReactor* ReportStatuses(grpc::CallbackServerContext* ctx,
                                           const proto::RoomStatuses* request,
                                           proto::ControlReplies* reply) override {
    std::vector<uint64_t> rooms;
    for (const proto::RoomStatus& status : request->statuses()) {
      rooms.push_back(status.room());
      const grpc::Status answer = answer_for(status.room());
      proto::ItemReply* item = reply->add_items();
      item->set_code(static_cast<uint32_t>(answer.error_code()));
      item->set_message(answer.error_message());
    }
    record(std::move(rooms));
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  // Held open until the link goes, as a rank's is.
  grpc::ServerBidiReactor<proto::Heartbeat, proto::Heartbeat>* Watch(
      grpc::CallbackServerContext*) override {
    return new OpenWatch();
  }

  static grpc::Status answer_for(uint64_t room) {
    if (room % 2 == 0) return grpc::Status::OK;
    return {grpc::StatusCode::NOT_FOUND, "room " + std::to_string(room) + " is odd"};
  }

 private:
  class OpenWatch final : public grpc::ServerBidiReactor<proto::Heartbeat, proto::Heartbeat> {
   public:
    OpenWatch() {
      StartSendInitialMetadata();
      StartRead(&in_);
    }
    void OnReadDone(bool ok) override {
      if (ok) return StartRead(&in_);
      Finish(grpc::Status::OK);
    }
    void OnDone() override { delete this; }

   private:
    proto::Heartbeat in_;
  };

  void record(std::vector<uint64_t> rooms) {
    std::lock_guard lock(mu_);
    calls_.push_back(std::move(rooms));
  }

  std::mutex mu_;
  std::vector<std::vector<uint64_t>> calls_;
};

class ReportBatching : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&peer_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    loop_.start();
    run_on_loop([&] {
      link_ = std::make_shared<engine::ControlLink>(
          loop_, tracker_, "127.0.0.1:" + std::to_string(port), "decode (recording peer)",
          proto::RankRef{}, Security{}, 5s, 5s, engine::ControlLink::Events{});
      link_->start();
    });
  }

  void TearDown() override {
    run_on_loop([&] { link_.reset(); });  // stops the link: its stream and calls end
    EXPECT_TRUE(tracker_.wait_idle(10s));
    loop_.stop();
    server_->Shutdown(std::chrono::system_clock::now() + 1s);
  }

  // Runs `task` on the loop and waits until it has run.
  template <typename F>
  void run_on_loop(F task) {
    std::atomic<bool> ran{false};
    loop_.post([&] {
      task();
      ran = true;
    });
    ASSERT_TRUE(poll_until([&] { return ran.load(); }));
  }

  // Reports these rooms, all from one loop task, and waits for every answer.
  void report(const std::vector<uint64_t>& rooms, size_t reason_bytes = 0) {
    const size_t before = answered();
    run_on_loop([&] {
      for (uint64_t room : rooms) {
        proto::RoomStatus status;
        status.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
        status.set_room(room);
        status.set_success(true);
        status.set_reason(std::string(reason_bytes, 'r'));
        link_->report_status(std::move(status), 5s, [this, room](const grpc::Status& s) {
          std::lock_guard lock(mu_);
          answers_[room] = s;
        });
      }
    });
    ASSERT_TRUE(poll_until([&] { return answered() == before + rooms.size(); }))
        << answered() - before << " of " << rooms.size() << " reports answered";
  }

  size_t answered() {
    std::lock_guard lock(mu_);
    return answers_.size();
  }

  RecordingPeer peer_;
  std::unique_ptr<grpc::Server> server_;
  engine::EventLoop loop_{"link-test"};
  engine::CallTracker tracker_;
  std::shared_ptr<engine::ControlLink> link_;  // loop thread
  std::mutex mu_;
  std::map<uint64_t, grpc::Status> answers_;  // by room
};

TEST_F(ReportBatching, ReportsReadyTogetherTravelInOneCallAndEachGetsItsOwnAnswer) {
  report({1, 2, 3});
  report({4});  // alone: a ReportStatus of its own
  std::vector<uint64_t> many(70);
  std::iota(many.begin(), many.end(), 10);  // rooms 10 ... 79: 64 a call at most
  report(many);
  // 1 MiB of reports a call at most: 400 KiB reasons go two and one.
  report({100, 101, 102}, 400 << 10);

  std::vector<uint64_t> first(many.begin(), many.begin() + 64), rest(many.begin() + 64, many.end());
  // Calls in flight together may arrive in either order: compared sorted.
  std::vector<std::vector<uint64_t>> calls = peer_.calls();
  std::sort(calls.begin(), calls.end());
  const std::vector<std::vector<uint64_t>> expected = {{1, 2, 3}, {4},        first,
                                                       rest,      {100, 101}, {102}};
  EXPECT_EQ(calls, expected);

  std::lock_guard lock(mu_);
  ASSERT_EQ(answers_.size(), 77u);
  for (const auto& [room, answer] : answers_) {
    if (room % 2 == 0) {
      EXPECT_TRUE(answer.ok()) << "room " << room << ": " << answer.error_message();
    } else {
      EXPECT_EQ(answer.error_code(), grpc::StatusCode::NOT_FOUND) << "room " << room;
      EXPECT_EQ(answer.error_message(), "room " + std::to_string(room) + " is odd");
    }
  }
}

}  // namespace
}  // namespace pdkv

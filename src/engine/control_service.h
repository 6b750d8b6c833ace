// The Control gRPC service of one rank, on gRPC's callback API: a handler
// checks the protocol version and the caller's credentials (call_auth.h),
// and the bounds on calls being served and Watch streams per peer; it hands the request to the
// engine (a ControlSink, which posts it to the loop) and returns at once. The reply goes out when
// the loop has decided (an Answer), which may be much later (an abort is answered once the room's
// writes have ended) without holding any thread meanwhile.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "pdkv.grpc.pb.h"
#include "pdkv/security.h"
#include "pdkv/status.h"
#include "security/call_auth.h"

namespace pdkv::engine {

// Reports in one ReportStatuses call, at most: a bound on what one call can
// make a rank hold, and the size of the batches a link sends.
inline constexpr int kMaxStatusesPerCall = 64;

// The replies of one call of several items (ReportStatuses): the call
// finishes, OK with every item's answer, once the last item is answered.
class ItemReplies;

// The answer to one control request: a unary call of its own, whose reactor
// it finishes, or one item of a call of several. Sent exactly once; dropped
// unanswered (the engine shutting down), it answers UNAVAILABLE.
class Answer {
 public:
  // `serving` counts the answers not yet sent (Limits::control_calls).
  Answer(grpc::ServerUnaryReactor* reactor, std::shared_ptr<std::atomic<uint32_t>> serving)
      : reactor_(reactor), serving_(std::move(serving)) {}
  Answer(std::shared_ptr<ItemReplies> call, int item,
         std::shared_ptr<std::atomic<uint32_t>> serving);
  ~Answer();
  Answer(const Answer&) = delete;
  Answer& operator=(const Answer&) = delete;
  void send(const Status& status);

 private:
  std::atomic<bool> sent_{false};
  grpc::ServerUnaryReactor* const reactor_ = nullptr;  // a unary call's
  const std::shared_ptr<ItemReplies> call_;            // or an item's
  const int item_ = 0;
  std::shared_ptr<std::atomic<uint32_t>> serving_;
};
using AnswerPtr = std::shared_ptr<Answer>;

// Where the service delivers requests. Called on gRPC's threads; must not
// block. The request is gRPC's: valid only until the call returns or the
// answer is sent, whichever comes first (copy what is kept).
class ControlSink {
 public:
  virtual ~ControlSink() = default;
  virtual void on_transfer_info(const proto::TransferInfo& info, AnswerPtr answer) = 0;
  virtual void on_room_status(const proto::RoomStatus& status, AnswerPtr answer) = 0;
  virtual void on_abort(const proto::AbortRequest& request, AnswerPtr answer) = 0;
};

class ControlService final : public proto::Control::CallbackService {
 public:
  ControlService(const Security& security, const Limits& limits);

  // Until open(), requests are refused with UNAVAILABLE ("starting"): the
  // server runs before the rank knows its own address.
  void open(ControlSink* sink) { sink_.store(sink); }
  // Shutdown, first step: end the peers' Watch streams and refuse new ones;
  // unary calls are still delivered, so that decided replies go out.
  void close_watches();
  // Shutdown, last step: refuse every request.
  void close() { sink_.store(nullptr); }

  grpc::ServerUnaryReactor* SendTransferInfo(grpc::CallbackServerContext* ctx,
                                             const proto::TransferInfo* request,
                                             proto::ControlReply* reply) override;
  grpc::ServerUnaryReactor* ReportStatus(grpc::CallbackServerContext* ctx,
                                         const proto::RoomStatus* request,
                                         proto::ControlReply* reply) override;
  grpc::ServerUnaryReactor* ReportStatuses(grpc::CallbackServerContext* ctx,
                                           const proto::RoomStatuses* request,
                                           proto::ControlReplies* reply) override;
  grpc::ServerUnaryReactor* AbortRoom(grpc::CallbackServerContext* ctx,
                                      const proto::AbortRequest* request,
                                      proto::ControlReply* reply) override;
  grpc::ServerBidiReactor<proto::Heartbeat, proto::Heartbeat>* Watch(
      grpc::CallbackServerContext* ctx) override;

 private:
  class WatchReactor;
  friend class WatchReactor;
  // Refuses a request that cannot be delivered (another protocol version,
  // bad credentials, not serving) and returns null, or the sink to deliver
  // it to.
  template <typename Request>
  ControlSink* admit(grpc::CallbackServerContext* ctx, grpc::ServerUnaryReactor* reactor,
                     const char* method, const Request& request);
  // Counts up to `wanted` requests as being served, as many as
  // Limits::control_calls leaves room for; returns how many.
  uint32_t take_slots(uint32_t wanted);
  Status full() const;  // what a request beyond Limits::control_calls is told
  // admit() and a slot, then deliver(sink, answer) with the call's one answer.
  template <typename Request, typename Deliver>
  grpc::ServerUnaryReactor* serve(grpc::CallbackServerContext* ctx, const char* method,
                                  const Request& request, Deliver deliver);

  // The peer a Watch stream says it is from: "engine dp tp pp".
  static std::string watcher_of(const proto::RankRef& from);
  // False (and nothing counted) when that peer holds the most streams allowed.
  bool count_watch(const std::string& watcher);
  void uncount_watch(const std::string& watcher);

  security::CallAuthenticator auth_;
  const Limits limits_;
  std::shared_ptr<std::atomic<uint32_t>> serving_ = std::make_shared<std::atomic<uint32_t>>(0);
  std::atomic<ControlSink*> sink_{nullptr};
  std::mutex closing_mu_;  // held by close_watches(); OnDone waits for it (taken before mu_)
  std::mutex mu_;          // guards watches_, closing_ and the reactors' flags
  bool closing_ = false;
  std::set<WatchReactor*> watches_;
  std::map<std::string, uint32_t> watches_per_peer_;
};

}  // namespace pdkv::engine

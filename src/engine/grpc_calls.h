// Client-side gRPC calls of one engine, made without blocking: each runs on
// gRPC's threads and hands its outcome to the engine's loop as an event.
//
// CallTracker counts the calls and streams in flight and can cancel them, by
// group (one peer's link) or all, so that shutdown can end every one and
// wait until gRPC is done with them before anything they touch goes away.
//
// Thread-safety: CallTracker from any thread (one lock, never held while
// calling into gRPC); start_unary from the loop's thread.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "engine/event_loop.h"

namespace pdkv::engine {

class CallTracker {
 public:
  using Group = uint64_t;               // calls cancelled together (one peer link's); 0: none
  enum class Kind { kUnary, kStream };  // a stream (Watch) never ends by itself

  // A call about to start; end() it when gRPC has finished with it.
  uint64_t begin(Group group, std::weak_ptr<grpc::ClientContext> ctx, Kind kind = Kind::kUnary);
  void end(uint64_t call);
  void cancel(Group group);
  void cancel_all();
  // Until no call of `kind` (or of any kind) is in flight (true) or `limit`
  // passed (false).
  bool wait_idle(std::chrono::milliseconds limit, std::optional<Kind> kind = std::nullopt);
  size_t in_flight() const;

 private:
  struct Entry {
    Group group;
    std::weak_ptr<grpc::ClientContext> ctx;
    Kind kind;
  };
  bool idle(std::optional<Kind> kind) const;  // mu_ held
  void cancel_if(const std::function<bool(const Entry&)>& pick);

  mutable std::mutex mu_;
  std::condition_variable idle_;
  std::unordered_map<uint64_t, Entry> calls_;
  uint64_t next_ = 1;
};

// A group no other caller has (process-wide, any thread).
CallTracker::Group new_call_group();

// What start_unary needs of a stub method: launch(ctx, request, reply, on_done)
// starts the call, e.g. [&stub](auto... a) { stub.async()->ReportStatus(a...); }.
template <typename Request, typename Reply>
using UnaryLaunch = std::function<void(grpc::ClientContext*, const Request*, Reply*,
                                       std::function<void(grpc::Status)>)>;

// Starts one unary call with a deadline of `timeout` (waiting for the
// connection when `wait_for_ready`); `done(status, reply)` runs on the loop.
// Request, reply and context live until then.
template <typename Request, typename Reply>
void start_unary(EventLoop& loop, CallTracker& tracker, CallTracker::Group group,
                 std::chrono::milliseconds timeout, bool wait_for_ready, Request request,
                 const UnaryLaunch<Request, Reply>& launch,
                 std::function<void(const grpc::Status&, const Reply&)> done) {
  struct Call {
    std::shared_ptr<grpc::ClientContext> ctx = std::make_shared<grpc::ClientContext>();
    Request request;
    Reply reply;
    uint64_t id = 0;
  };
  auto call = std::make_shared<Call>();
  call->request = std::move(request);
  call->ctx->set_deadline(std::chrono::system_clock::now() + timeout);
  call->ctx->set_wait_for_ready(wait_for_ready);
  call->id = tracker.begin(group, call->ctx);
  launch(call->ctx.get(), &call->request, &call->reply,
         [call, &loop, &tracker, done = std::move(done)](grpc::Status status) mutable {
           tracker.end(call->id);
           loop.post([call, status = std::move(status), done = std::move(done)] {
             done(status, call->reply);
           });
         });
}

}  // namespace pdkv::engine

// The control connection to one peer rank: a gRPC channel of its own with
// keepalive, a Watch stream held open as the liveness signal, and the unary
// calls of the protocol. Nothing here blocks or owns a thread: every outcome
// reaches the engine's loop as an event.
//
// Life of a link:
//   connecting  start() opens the Watch stream; while the peer refuses it is
//               retried every 50 ms, for at most one keepalive period of
//               refusals, and for `connect_timeout` in all
//   up          the peer answered the stream (`events.up`)
//   lost        the stream ended other than by stop(): the peer died, its
//               host went silent past keepalive, or it left (`events.lost`,
//               once). Calls in flight are cancelled, except when the peer
//               left in good order (its decided replies are on their way).
// A lost link stays lost; PeerRegistry opens a fresh one when a room needs
// the peer again (a paused peer that resumed, a partition that healed).
//
// Thread-safety: loop thread only.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/event_loop.h"
#include "engine/grpc_calls.h"
#include "pdkv.grpc.pb.h"
#include "pdkv/security.h"
#include "pdkv/status.h"

namespace pdkv::engine {

class ControlLink : public std::enable_shared_from_this<ControlLink> {
 public:
  struct Events {
    std::function<void()> up;
    std::function<void(const Status& reason)> lost;
  };
  using Done = std::function<void(const grpc::Status&)>;

  // `name` says whom the link reaches: "decode-a dp 0 tp 1 pp 0 (127.0.0.1:5000)".
  ControlLink(EventLoop& loop, CallTracker& tracker, std::string address, std::string name,
              proto::RankRef self, const Security& security, std::chrono::milliseconds keepalive,
              std::chrono::milliseconds connect_timeout, Events events);
  ~ControlLink();

  void start();
  // Cancels the stream and every call; no event is delivered after it.
  void stop();
  const std::string& name() const { return name_; }
  bool up() const { return state_ == State::kUp; }

  // The protocol's calls. They wait for the connection (riding out a
  // reconnect), end by `timeout`, and are cancelled when the link is lost.
  void send_transfer_info(proto::TransferInfo info, std::chrono::milliseconds timeout, Done done);
  // Reports made before the loop comes back to this link travel together
  // (ReportStatuses, up to kMaxStatusesPerCall a call; one alone as
  // ReportStatus): rooms that complete in one burst cost one call. Each
  // report's `done` gets its own answer.
  void report_status(proto::RoomStatus status, std::chrono::milliseconds timeout, Done done);
  void abort_room(proto::AbortRequest request, std::chrono::milliseconds timeout, Done done);

 private:
  class WatchStream;
  enum class State { kIdle, kConnecting, kUp, kLost, kStopped };

  void open_stream();
  // Events from the stream (loop thread).
  void on_stream_up();
  void on_stream_done(const grpc::Status& status, bool was_up);
  void declare_lost(const Status& reason, bool cancel_calls);
  // Starts a call, or answers UNAVAILABLE (through the loop) on a lost link.
  template <typename Request, typename Reply>
  void call(Request request, std::chrono::milliseconds timeout,
            const UnaryLaunch<Request, Reply>& launch,
            std::function<void(const grpc::Status&, const Reply&)> done);
  template <typename Request>
  void call(Request request, std::chrono::milliseconds timeout,
            const UnaryLaunch<Request, proto::ControlReply>& launch, Done done);

  // A report waiting for flush_reports(), which the loop runs once it has
  // run the tasks queued before the first of them.
  struct PendingReport {
    proto::RoomStatus status;
    Clock::time_point deadline;
    Done done;
  };
  void flush_reports();
  void send_reports(std::span<PendingReport> reports);

  EventLoop& loop_;
  CallTracker& tracker_;
  const std::string address_, name_;
  const proto::RankRef self_;
  const std::chrono::milliseconds keepalive_, connect_timeout_;
  Events events_;
  const CallTracker::Group group_;  // this link's calls and stream
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<proto::Control::Stub> stub_;

  State state_ = State::kIdle;
  Clock::time_point connect_deadline_;
  std::optional<Clock::time_point> refused_since_;
  EventLoop::TimerId retry_timer_ = 0, connect_timer_ = 0;
  std::vector<PendingReport> reports_;
  bool flush_posted_ = false;
};

// Server-side channel arguments: keepalive matching the links' (gRPC refuses
// pings more frequent than the server allows, so both ends are set together),
// and a port of its own (no SO_REUSEPORT).
void configure_server(grpc::ServerBuilder& builder, std::chrono::milliseconds keepalive);

}  // namespace pdkv::engine

#include "engine/control_service.h"

#include <utility>
#include <vector>

#include "grpc_status.h"

namespace pdkv::engine {

Answer::~Answer() { send(Status::unavailable("the engine shut down before answering")); }

void Answer::send(const Status& status) {
  if (grpc::ServerUnaryReactor* r = reactor_.exchange(nullptr)) r->Finish(to_grpc(status));
}

// The server end of one peer's Watch stream: it sends its initial metadata
// at once (how the peer knows the link is up), reads until the peer goes, and
// is ended by close_watches() when this rank shuts down.
// The server end of one peer's Watch stream: it sends its initial metadata
// at once (how the peer knows the link is up), reads until the peer goes, and
// is ended by close_watches() when this rank shuts down.
//
// Its flags are the service's, under the service's lock: Watch() takes that
// lock right after constructing it, which orders the construction before
// the gRPC threads that call it back.
class ControlService::WatchReactor final
    : public grpc::ServerBidiReactor<proto::Heartbeat, proto::Heartbeat> {
 public:
  explicit WatchReactor(ControlService& service) : service_(service) {
    StartSendInitialMetadata();
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return finish(grpc::Status::OK);  // the peer closed its side
    if (take_first()) {
      const Status version = check_protocol_version(in_.protocol_version());
      if (!version.is_ok()) return finish(to_grpc(version));
    }
    StartRead(&in_);
  }
  void OnDone() override {
    std::lock_guard alive(service_.closing_mu_);  // not while close_watches() walks us
    {
      std::lock_guard lock(service_.mu_);
      service_.watches_.erase(this);
    }
    delete this;
  }
  // Ends the stream once, whoever asks first.
  void finish(const grpc::Status& status) {
    {
      std::lock_guard lock(service_.mu_);
      if (finished_) return;
      finished_ = true;
    }
    Finish(status);
  }

 private:
  bool take_first() {
    std::lock_guard lock(service_.mu_);
    return std::exchange(first_, false);
  }

  ControlService& service_;
  proto::Heartbeat in_;
  bool first_ = true;      // service_.mu_
  bool finished_ = false;  // service_.mu_
};

template <typename Request, typename Deliver>
grpc::ServerUnaryReactor* ControlService::serve(grpc::CallbackServerContext* ctx,
                                                const Request& request, Deliver deliver) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto answer = std::make_shared<Answer>(reactor);
  const Status version = check_protocol_version(request.protocol_version());
  ControlSink* sink = sink_.load();
  if (!version.is_ok()) {
    answer->send(version);
  } else if (sink == nullptr) {
    answer->send(Status::unavailable("this rank is not serving (starting or shut down)"));
  } else {
    deliver(*sink, std::move(answer));
  }
  return reactor;
}

grpc::ServerUnaryReactor* ControlService::SendTransferInfo(grpc::CallbackServerContext* ctx,
                                                           const proto::TransferInfo* request,
                                                           proto::ControlReply*) {
  return serve(ctx, *request, [request](ControlSink& sink, AnswerPtr answer) {
    sink.on_transfer_info(*request, std::move(answer));
  });
}

grpc::ServerUnaryReactor* ControlService::ReportStatus(grpc::CallbackServerContext* ctx,
                                                       const proto::RoomStatus* request,
                                                       proto::ControlReply*) {
  return serve(ctx, *request, [request](ControlSink& sink, AnswerPtr answer) {
    sink.on_room_status(*request, std::move(answer));
  });
}

grpc::ServerUnaryReactor* ControlService::AbortRoom(grpc::CallbackServerContext* ctx,
                                                    const proto::AbortRequest* request,
                                                    proto::ControlReply*) {
  return serve(ctx, *request, [request](ControlSink& sink, AnswerPtr answer) {
    sink.on_abort(*request, std::move(answer));
  });
}

grpc::ServerBidiReactor<proto::Heartbeat, proto::Heartbeat>* ControlService::Watch(
    grpc::CallbackServerContext*) {
  auto* reactor = new WatchReactor(*this);  // deletes itself in OnDone
  bool closing;
  {
    std::lock_guard lock(mu_);
    closing = closing_;
    if (!closing) watches_.insert(reactor);
  }
  if (closing) reactor->finish(grpc::Status::OK);
  return reactor;
}

void ControlService::close_watches() {
  // closing_mu_ keeps every reactor alive (OnDone waits for it) while they
  // are finished here, outside mu_, which finish() takes.
  std::lock_guard alive(closing_mu_);
  std::vector<WatchReactor*> open;
  {
    std::lock_guard lock(mu_);
    closing_ = true;
    open.assign(watches_.begin(), watches_.end());
  }
  for (WatchReactor* w : open) w->finish(grpc::Status::OK);
}

}  // namespace pdkv::engine

#include "engine/control_service.h"

#include <algorithm>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "grpc_status.h"

namespace pdkv::engine {

namespace {

constexpr char kTransferInfoMethod[] = "/pdkv.proto.Control/SendTransferInfo";
constexpr char kReportStatusMethod[] = "/pdkv.proto.Control/ReportStatus";
constexpr char kReportStatusesMethod[] = "/pdkv.proto.Control/ReportStatuses";
constexpr char kAbortRoomMethod[] = "/pdkv.proto.Control/AbortRoom";
constexpr char kWatchMethod[] = "/pdkv.proto.Control/Watch";

}  // namespace

// The reply message is gRPC's until the reactor finishes: every item writes
// its answer into it under the lock, and the last one finishes the call.
class ItemReplies {
 public:
  ItemReplies(grpc::ServerUnaryReactor* reactor, proto::ControlReplies* reply, int items)
      : reactor_(reactor), reply_(reply), left_(items) {
    for (int i = 0; i < items; ++i) reply_->add_items();
  }

  void answer(int item, const Status& status) {
    const grpc::Status g = to_grpc(status);
    bool last;
    {
      std::lock_guard lock(mu_);
      proto::ItemReply* r = reply_->mutable_items(item);
      r->set_code(static_cast<uint32_t>(g.error_code()));
      r->set_message(g.error_message());
      last = --left_ == 0;
    }
    if (last) reactor_->Finish(grpc::Status::OK);
  }

 private:
  grpc::ServerUnaryReactor* const reactor_;
  std::mutex mu_;
  proto::ControlReplies* const reply_;  // mu_
  int left_;                            // mu_
};

Answer::Answer(std::shared_ptr<ItemReplies> call, int item,
               std::shared_ptr<std::atomic<uint32_t>> serving)
    : call_(std::move(call)), item_(item), serving_(std::move(serving)) {}

Answer::~Answer() { send(Status::unavailable("the engine shut down before answering")); }

void Answer::send(const Status& status) {
  if (sent_.exchange(true)) return;
  if (serving_) serving_->fetch_sub(1);
  if (call_) {
    call_->answer(item_, status);
  } else {
    reactor_->Finish(to_grpc(status));
  }
}

ControlService::ControlService(const Security& security, const Limits& limits)
    : auth_(security, limits.replay_cache, "control"), limits_(limits) {}

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
      std::string watcher = watcher_of(in_.from());
      if (!service_.count_watch(watcher)) {
        return finish(to_grpc(Status::resource_exhausted(
            fmt::format("{} holds {} Watch streams here already (Limits::watches_per_peer)",
                        watcher, service_.limits_.watches_per_peer))));
      }
      counted_as_ = std::move(watcher);
    }
    StartRead(&in_);
  }
  void OnDone() override {
    std::lock_guard alive(service_.closing_mu_);  // not while close_watches() walks us
    {
      std::lock_guard lock(service_.mu_);
      service_.watches_.erase(this);
    }
    if (!counted_as_.empty()) service_.uncount_watch(counted_as_);
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
  bool first_ = true;       // service_.mu_
  bool finished_ = false;   // service_.mu_
  std::string counted_as_;  // the watcher this stream counts for; read and written by gRPC's
                            // callbacks, one at a time
};

template <typename Request>
ControlSink* ControlService::admit(grpc::CallbackServerContext* ctx,
                                   grpc::ServerUnaryReactor* reactor, const char* method,
                                   const Request& request) {
  const Status version = check_protocol_version(request.protocol_version());
  if (!version.is_ok()) {
    reactor->Finish(to_grpc(version));
    return nullptr;
  }
  const grpc::Status authenticated = auth_.check(*ctx, method, &request);
  if (!authenticated.ok()) {
    reactor->Finish(authenticated);
    return nullptr;
  }
  ControlSink* sink = sink_.load();
  if (sink == nullptr) {
    reactor->Finish(
        to_grpc(Status::unavailable("this rank is not serving (starting or shut down)")));
  }
  return sink;
}

uint32_t ControlService::take_slots(uint32_t wanted) {
  uint32_t serving = serving_->load();
  uint32_t taken;
  do {
    if (serving >= limits_.control_calls) return 0;
    taken = std::min(wanted, limits_.control_calls - serving);
  } while (!serving_->compare_exchange_weak(serving, serving + taken));
  return taken;
}

Status ControlService::full() const {
  return Status::resource_exhausted(fmt::format(
      "{} control calls are being served here (Limits::control_calls)", limits_.control_calls));
}

template <typename Request, typename Deliver>
grpc::ServerUnaryReactor* ControlService::serve(grpc::CallbackServerContext* ctx,
                                                const char* method, const Request& request,
                                                Deliver deliver) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  ControlSink* sink = admit(ctx, reactor, method, request);
  if (sink == nullptr) return reactor;
  if (take_slots(1) == 0) {
    reactor->Finish(to_grpc(full()));
  } else {
    deliver(*sink, std::make_shared<Answer>(reactor, serving_));
  }
  return reactor;
}

grpc::ServerUnaryReactor* ControlService::SendTransferInfo(grpc::CallbackServerContext* ctx,
                                                           const proto::TransferInfo* request,
                                                           proto::ControlReply*) {
  return serve(ctx, kTransferInfoMethod, *request, [request](ControlSink& sink, AnswerPtr answer) {
    sink.on_transfer_info(*request, std::move(answer));
  });
}

grpc::ServerUnaryReactor* ControlService::ReportStatus(grpc::CallbackServerContext* ctx,
                                                       const proto::RoomStatus* request,
                                                       proto::ControlReply*) {
  return serve(ctx, kReportStatusMethod, *request, [request](ControlSink& sink, AnswerPtr answer) {
    sink.on_room_status(*request, std::move(answer));
  });
}

// Each report is delivered, and answered, as a ReportStatus of its own; the
// call ends when the last is answered (ItemReplies).
grpc::ServerUnaryReactor* ControlService::ReportStatuses(grpc::CallbackServerContext* ctx,
                                                         const proto::RoomStatuses* request,
                                                         proto::ControlReplies* reply) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const int items = request->statuses_size();
  if (items == 0 || items > kMaxStatusesPerCall) {
    reactor->Finish(to_grpc(Status::invalid_argument(fmt::format(
        "ReportStatuses carries {} reports; a call carries 1 to {}", items, kMaxStatusesPerCall))));
    return reactor;
  }
  ControlSink* sink = admit(ctx, reactor, kReportStatusesMethod, *request);
  if (sink == nullptr) return reactor;
  // The reports that fit under Limits::control_calls are served; the rest
  // are refused one by one, as calls of their own arriving now would be.
  const int served = static_cast<int>(take_slots(static_cast<uint32_t>(items)));
  auto replies = std::make_shared<ItemReplies>(reactor, reply, items);
  for (int i = 0; i < items; ++i) {
    if (i >= served) {
      Answer(replies, i, nullptr).send(full());
      continue;
    }
    auto answer = std::make_shared<Answer>(replies, i, serving_);
    const proto::RoomStatus& status = request->statuses(i);
    const Status version = check_protocol_version(status.protocol_version());
    if (!version.is_ok()) {
      answer->send(version);
    } else {
      sink->on_room_status(status, std::move(answer));
    }
  }
  return reactor;
}

grpc::ServerUnaryReactor* ControlService::AbortRoom(grpc::CallbackServerContext* ctx,
                                                    const proto::AbortRequest* request,
                                                    proto::ControlReply*) {
  return serve(ctx, kAbortRoomMethod, *request, [request](ControlSink& sink, AnswerPtr answer) {
    sink.on_abort(*request, std::move(answer));
  });
}

grpc::ServerBidiReactor<proto::Heartbeat, proto::Heartbeat>* ControlService::Watch(
    grpc::CallbackServerContext* ctx) {
  auto* reactor = new WatchReactor(*this);  // deletes itself in OnDone
  const grpc::Status authenticated = auth_.check(*ctx, kWatchMethod, nullptr);
  bool closing;
  {
    std::lock_guard lock(mu_);
    closing = closing_;
    if (!closing) watches_.insert(reactor);
  }
  if (!authenticated.ok()) {
    reactor->finish(authenticated);
  } else if (closing) {
    reactor->finish(grpc::Status::OK);
  }
  return reactor;
}

std::string ControlService::watcher_of(const proto::RankRef& from) {
  return fmt::format("'{}' dp {} tp {} pp {}", from.engine_id(), from.dp_rank(), from.tp_rank(),
                     from.pp_rank());
}

bool ControlService::count_watch(const std::string& watcher) {
  std::lock_guard lock(mu_);
  uint32_t& held = watches_per_peer_[watcher];
  if (held >= limits_.watches_per_peer) {
    if (held == 0) watches_per_peer_.erase(watcher);
    return false;
  }
  ++held;
  return true;
}

void ControlService::uncount_watch(const std::string& watcher) {
  std::lock_guard lock(mu_);
  auto it = watches_per_peer_.find(watcher);
  if (it != watches_per_peer_.end() && --it->second == 0) watches_per_peer_.erase(it);
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

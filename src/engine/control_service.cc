#include "engine/control_service.h"

#include <mutex>
#include <set>

#include "engine/core.h"
#include "grpc_status.h"

namespace pdkv::engine {
namespace {

class ControlService final : public proto::Control::Service {
 public:
  explicit ControlService(EngineCore* core) : core_(core) {}

  grpc::Status SendTransferInfo(grpc::ServerContext*, const proto::TransferInfo* info,
                                proto::ControlReply*) override {
    PDKV_GRPC_CHECK(check_protocol_version(info->protocol_version()));
    return to_grpc(core_->on_transfer_info(*info));
  }

  grpc::Status ReportStatus(grpc::ServerContext*, const proto::RoomStatus* status,
                            proto::ControlReply*) override {
    PDKV_GRPC_CHECK(check_protocol_version(status->protocol_version()));
    return to_grpc(core_->on_room_status(*status));
  }

  grpc::Status AbortRoom(grpc::ServerContext*, const proto::AbortRequest* request,
                         proto::ControlReply*) override {
    PDKV_GRPC_CHECK(check_protocol_version(request->protocol_version()));
    return to_grpc(core_->on_abort(*request));
  }

  // The peer keeps this stream open for as long as it has business with us;
  // both ends learn of the other's death when it breaks.
  grpc::Status Watch(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<proto::Heartbeat, proto::Heartbeat>* stream) override {
    {
      std::lock_guard lock(mu_);
      if (closing_) return grpc::Status::OK;
      watches_.insert(ctx);
    }
    proto::Heartbeat hello;
    grpc::Status result = grpc::Status::OK;
    if (stream->Read(&hello)) {
      result = to_grpc(check_protocol_version(hello.protocol_version()));
      proto::Heartbeat next;
      while (result.ok() && stream->Read(&next)) {
      }
    }
    std::lock_guard lock(mu_);
    watches_.erase(ctx);
    return result;
  }

  // Ends every Watch stream (peers see this rank leave) while unary calls in
  // progress still complete, so that a reply already decided is delivered.
  void close_watches() {
    std::lock_guard lock(mu_);
    closing_ = true;
    for (grpc::ServerContext* ctx : watches_) ctx->TryCancel();
  }

 private:
  EngineCore* core_;
  std::mutex mu_;
  bool closing_ = false;
  std::set<grpc::ServerContext*> watches_;
};

}  // namespace

std::unique_ptr<grpc::Service> make_control_service(EngineCore* core) {
  return std::make_unique<ControlService>(core);
}

void close_watches(grpc::Service& service) {
  static_cast<ControlService&>(service).close_watches();
}

}  // namespace pdkv::engine

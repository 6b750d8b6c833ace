#include "engine/control_service.h"

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
      grpc::ServerContext*,
      grpc::ServerReaderWriter<proto::Heartbeat, proto::Heartbeat>* stream) override {
    proto::Heartbeat hello;
    if (!stream->Read(&hello)) return grpc::Status::OK;
    PDKV_GRPC_CHECK(check_protocol_version(hello.protocol_version()));
    proto::Heartbeat next;
    while (stream->Read(&next)) {
    }
    return grpc::Status::OK;
  }

 private:
  EngineCore* core_;
};

}  // namespace

std::unique_ptr<grpc::Service> make_control_service(EngineCore* core) {
  return std::make_unique<ControlService>(core);
}

}  // namespace pdkv::engine

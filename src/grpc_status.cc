#include "grpc_status.h"

#include <fmt/format.h>

#include "pdkv.pb.h"

namespace pdkv {

grpc::Status to_grpc(const Status& s) {
  using grpc::StatusCode;
  StatusCode code = StatusCode::UNKNOWN;
  switch (s.code()) {
    case pdkv::StatusCode::kOk:
      return grpc::Status::OK;
    case pdkv::StatusCode::kInvalidArgument:
      code = StatusCode::INVALID_ARGUMENT;
      break;
    case pdkv::StatusCode::kOutOfRange:
      code = StatusCode::OUT_OF_RANGE;
      break;
    case pdkv::StatusCode::kNotFound:
      code = StatusCode::NOT_FOUND;
      break;
    case pdkv::StatusCode::kAlreadyExists:
      code = StatusCode::ALREADY_EXISTS;
      break;
    case pdkv::StatusCode::kFailedPrecondition:
      code = StatusCode::FAILED_PRECONDITION;
      break;
    case pdkv::StatusCode::kUnavailable:
      code = StatusCode::UNAVAILABLE;
      break;
    case pdkv::StatusCode::kDeadlineExceeded:
      code = StatusCode::DEADLINE_EXCEEDED;
      break;
    case pdkv::StatusCode::kAborted:
      code = StatusCode::ABORTED;
      break;
    case pdkv::StatusCode::kInternal:
      code = StatusCode::INTERNAL;
      break;
    case pdkv::StatusCode::kUnauthenticated:
      code = StatusCode::UNAUTHENTICATED;
      break;
    case pdkv::StatusCode::kResourceExhausted:
      code = StatusCode::RESOURCE_EXHAUSTED;
      break;
  }
  return {code, s.message()};
}

Status from_grpc(const grpc::Status& s, const std::string& context) {
  using grpc::StatusCode;
  pdkv::StatusCode code = pdkv::StatusCode::kInternal;
  switch (s.error_code()) {
    case StatusCode::OK:
      return Status::ok();
    case StatusCode::INVALID_ARGUMENT:
      code = pdkv::StatusCode::kInvalidArgument;
      break;
    case StatusCode::OUT_OF_RANGE:
      code = pdkv::StatusCode::kOutOfRange;
      break;
    case StatusCode::NOT_FOUND:
      code = pdkv::StatusCode::kNotFound;
      break;
    case StatusCode::ALREADY_EXISTS:
      code = pdkv::StatusCode::kAlreadyExists;
      break;
    case StatusCode::FAILED_PRECONDITION:
      code = pdkv::StatusCode::kFailedPrecondition;
      break;
    case StatusCode::UNAVAILABLE:
      code = pdkv::StatusCode::kUnavailable;
      break;
    case StatusCode::DEADLINE_EXCEEDED:
      code = pdkv::StatusCode::kDeadlineExceeded;
      break;
    case StatusCode::UNAUTHENTICATED:
      code = pdkv::StatusCode::kUnauthenticated;
      break;
    case StatusCode::RESOURCE_EXHAUSTED:
      code = pdkv::StatusCode::kResourceExhausted;
      break;
    case StatusCode::ABORTED:
    case StatusCode::CANCELLED:
      code = pdkv::StatusCode::kAborted;
      break;
    default:
      break;
  }
  return {code, context + ": " + s.error_message()};
}

Status check_protocol_version(uint32_t peer_version) {
  if (peer_version == proto::PROTOCOL_VERSION_CURRENT) return Status::ok();
  return Status::failed_precondition(
      fmt::format("peer speaks pdkv protocol version {}, this process speaks version {}",
                  peer_version, static_cast<int>(proto::PROTOCOL_VERSION_CURRENT)));
}

bool is_definitive(const grpc::Status& s) {
  switch (s.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return false;
    default:
      return true;
  }
}

}  // namespace pdkv

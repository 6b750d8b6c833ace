// Converting between pdkv::Status and grpc::Status, so that a refusal keeps
// its code and its message (which names the offending values) across processes.
#pragma once

#include <grpcpp/support/status.h>

#include "pdkv/status.h"

namespace pdkv {

grpc::Status to_grpc(const Status& status);
// `context` says which call failed ("bootstrap 127.0.0.1:5000 GetTopology").
Status from_grpc(const grpc::Status& status, const std::string& context);

// Whether a call's outcome says what the peer did. UNAVAILABLE,
// DEADLINE_EXCEEDED, CANCELLED (and UNKNOWN, RESOURCE_EXHAUSTED) may mean
// that the request never arrived, or that its reply was lost.
bool is_definitive(const grpc::Status& status);

// FAILED_PRECONDITION naming both versions, or ok when `peer_version` is ours.
Status check_protocol_version(uint32_t peer_version);

}  // namespace pdkv

// In a gRPC handler: return the pdkv Status as a grpc::Status if it is not ok.
#define PDKV_GRPC_CHECK(expr)                                                  \
  do {                                                                         \
    ::pdkv::Status pdkv_grpc_status_ = (expr);                                 \
    if (!pdkv_grpc_status_.is_ok()) return ::pdkv::to_grpc(pdkv_grpc_status_); \
  } while (0)

// The Control gRPC service of one rank: decodes requests, checks the protocol
// version and hands them to the EngineCore.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>

namespace pdkv::engine {

class EngineCore;
std::unique_ptr<grpc::Service> make_control_service(EngineCore* core);
// Shutdown, first step: end the peers' Watch streams, refuse new ones.
void close_watches(grpc::Service& service);

}  // namespace pdkv::engine

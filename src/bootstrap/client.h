// A prefill or decode rank's view of the bootstrap service.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pdkv.grpc.pb.h"
#include "pdkv/security.h"
#include "pdkv/status.h"

namespace pdkv::bootstrap {

class Client {
 public:
  Client(std::string address, const Security& security);

  // Returns whether an earlier incarnation of the same rank was replaced.
  Result<bool> register_rank(const proto::RankInfo& rank, std::chrono::milliseconds timeout);
  // One query; unavailable while ranks are missing.
  Result<std::vector<proto::RankInfo>> topology(const std::string& engine_id, uint32_t dp_rank,
                                                std::chrono::milliseconds timeout);
  // For calls made without blocking (the engine's lookups).
  proto::Bootstrap::Stub& stub() { return *stub_; }
  const std::string& address() const { return address_; }

 private:
  std::string address_;
  std::unique_ptr<proto::Bootstrap::Stub> stub_;
};

}  // namespace pdkv::bootstrap

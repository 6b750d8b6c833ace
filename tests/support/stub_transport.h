// A transport that moves nothing, for unit tests that fake one part of the
// interface: every call succeeds trivially (one peer, batches done at
// once), and a fake overrides what its test is about.
#pragma once

#include "pdkv/transport.h"

namespace pdkv::testing {

class StubTransport : public Transport {
 public:
  std::string_view name() const override { return "stub"; }
  TransportCapabilities capabilities() const override { return {}; }
  Result<RegionKey> register_region(const MemoryRegion&) override { return RegionKey{0}; }
  std::string descriptor() const override { return {}; }
  Result<PeerId> connect(std::string_view) override { return PeerId{1}; }
  Result<BatchId> write(PeerId, std::span<const WriteOp>) override { return BatchId{1}; }
  BatchStatus poll(BatchId) override { return {BatchState::kDone, Status::ok()}; }
  void set_peer_failure_callback(PeerFailureCallback) override {}
  void fail_peer(PeerId, const Status&) override {}
};

}  // namespace pdkv::testing

// An engine whose KV pools are GPU memory that its transport cannot register
// (no CUDA-enabled UCX, no FI_HMEM): the staging pool is pinned for the
// GPU, and kernels (gpu/gpu.h) gather a route's head slices into it on the
// prefill side and scatter them into device pages on the decode side. Every
// KV route of such a rank is staged; peers learn it from RankInfo.
#pragma once

#include <memory>

#include "gpu/gpu.h"
#include "pdkv/engine.h"

namespace pdkv::engine {

class DeviceStaging {
 public:
  // Ok(nullptr) when the pools need no device staging (host pools, or a
  // transport that registers their memory); an error naming what is missing
  // when they need it and cannot have it.
  static Result<std::unique_ptr<DeviceStaging>> create(const EngineConfig& config,
                                                       const EnginePools& pools,
                                                       const TransportCapabilities& caps,
                                                       std::string_view backend);
  ~DeviceStaging();

  // Gathers `plan` from the KV pools into staging bytes [offset, offset +
  // plan.bytes()), or scatters them back; returns once the kernel is done.
  Status gather(const TransferPlan& plan, uint64_t offset);
  Status scatter(const TransferPlan& plan, uint64_t offset);

 private:
  DeviceStaging() = default;
  gpu::Runtime* runtime_ = nullptr;
  std::unique_ptr<gpu::Stager> stager_;
  EnginePools pools_;
  void* staging_alias_ = nullptr;  // the staging pool as the device sees it
};

}  // namespace pdkv::engine

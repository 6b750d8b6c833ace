// How a rank's KV pools and its staging pool exchange a plan's bytes, in one
// place for every kind of pool (DESIGN §3, docs/gpu.md):
//   kHost          host pools: memcpy (pdkv::gather / scatter);
//   kDeviceDirect  GPU pools that the transport registers and writes in
//                  place: nothing is staged;
//   kDeviceStaged  GPU pools that the transport cannot register (no
//                  CUDA-enabled UCX, no FI_HMEM): the staging pool is pinned
//                  for the GPU, kernels (gpu/gpu.h) gather and scatter, and
//                  every KV route of the rank is staged; peers learn it from
//                  RankInfo.kv_staged_only.
#pragma once

#include <memory>
#include <string_view>

#include "gpu/gpu.h"
#include "pdkv/engine.h"

namespace pdkv::engine {

class PoolStaging {
 public:
  enum class Mode { kHost, kDeviceDirect, kDeviceStaged };

  // An error names what is inconsistent (kinds or devices mixed, device
  // memory outside the KV pools) or missing (no staging pool, no runtime).
  static Result<std::unique_ptr<PoolStaging>> create(const EngineConfig& config,
                                                     const EnginePools& pools,
                                                     const TransportCapabilities& caps,
                                                     std::string_view backend);
  ~PoolStaging();

  Mode mode() const { return mode_; }
  // Whether gather and scatter may run on a thread of their own: memcpy
  // between host pools may. GPU kernels stay on the loop: a Stager may be
  // used by one thread at a time (gpu.h), and the loop is that thread.
  bool copies_off_loop() const { return mode_ == Mode::kHost; }

  // The plan's bytes from the KV pools into staging bytes [offset, offset +
  // plan.bytes()), or back; returns once they are there. Host copies may run
  // on any thread, one per slot at a time; a device's run on the loop.
  Status gather(const TransferPlan& plan, uint64_t offset);
  Status scatter(const TransferPlan& plan, uint64_t offset);

 private:
  PoolStaging(Mode mode, const EnginePools& pools) : mode_(mode), pools_(pools) {}

  Mode mode_;
  EnginePools pools_;
  // kDeviceStaged only:
  gpu::Runtime* runtime_ = nullptr;
  std::unique_ptr<gpu::Stager> stager_;
  void* staging_alias_ = nullptr;  // the staging pool as the device sees it
};

}  // namespace pdkv::engine

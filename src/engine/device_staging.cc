#include "engine/device_staging.h"

#include <fmt/format.h>

namespace pdkv::engine {

Result<std::unique_ptr<DeviceStaging>> DeviceStaging::create(const EngineConfig& config,
                                                             const EnginePools& pools,
                                                             const TransportCapabilities& caps,
                                                             std::string_view backend) {
  if (pools.kv.empty() || pools.kv.front().kind == MemoryKind::kHost) {
    for (size_t i = 0; i < pools.kv.size(); ++i) {
      if (pools.kv[i].kind != MemoryKind::kHost) {
        return Status::invalid_argument(
            fmt::format("KV buffer {} is {} memory but buffer 0 is host memory: one kind per rank",
                        i, memory_kind_name(pools.kv[i].kind)));
      }
    }
    return std::unique_ptr<DeviceStaging>();
  }
  const MemoryRegion& first = pools.kv.front();
  for (size_t i = 0; i < pools.kv.size(); ++i) {
    if (pools.kv[i].kind != first.kind || pools.kv[i].device != first.device) {
      return Status::invalid_argument(fmt::format(
          "KV buffer {} is {} memory on device {}, buffer 0 {} memory on device {}: one device "
          "per rank",
          i, memory_kind_name(pools.kv[i].kind), pools.kv[i].device, memory_kind_name(first.kind),
          first.device));
    }
  }
  for (const auto& [name, region] :
       {std::pair{"aux", &pools.aux}, {"state", &pools.state}, {"staging", &pools.staging}}) {
    if (region->length > 0 && region->kind != MemoryKind::kHost) {
      return Status::invalid_argument(
          fmt::format("the {} region is {} memory; only KV pools may live on a device", name,
                      memory_kind_name(region->kind)));
    }
  }
  const bool registers = first.kind == MemoryKind::kCuda ? caps.cuda_memory : caps.hip_memory;
  if (registers) return std::unique_ptr<DeviceStaging>();  // the transport moves them directly
  if (config.staging_bytes == 0) {
    return Status::invalid_argument(fmt::format(
        "the KV pools are {} memory, which backend '{}' cannot register: they travel through "
        "the staging pool, and staging_bytes is 0",
        memory_kind_name(first.kind), backend));
  }
  std::unique_ptr<DeviceStaging> d(new DeviceStaging);
  PDKV_ASSIGN_OR_RETURN(d->runtime_, gpu::runtime(first.kind));
  PDKV_ASSIGN_OR_RETURN(d->stager_, d->runtime_->stager(first.device));
  PDKV_ASSIGN_OR_RETURN(d->staging_alias_,
                        d->runtime_->pin(pools.staging.base, pools.staging.length));
  d->pools_ = pools;
  return d;
}

DeviceStaging::~DeviceStaging() {
  stager_.reset();  // drains its stream first
  if (staging_alias_ != nullptr) runtime_->unpin(pools_.staging.base);
}

Status DeviceStaging::gather(const TransferPlan& plan, uint64_t offset) {
  if (offset > pools_.staging.length) return Status::out_of_range("staging offset past the pool");
  PDKV_ASSIGN_OR_RETURN(
      gpu::Stager::Ticket t,
      stager_->gather(plan, pools_.kv, static_cast<std::byte*>(staging_alias_) + offset,
                      pools_.staging.length - offset));
  return stager_->wait(t);
}

Status DeviceStaging::scatter(const TransferPlan& plan, uint64_t offset) {
  if (offset > pools_.staging.length) return Status::out_of_range("staging offset past the pool");
  PDKV_ASSIGN_OR_RETURN(gpu::Stager::Ticket t,
                        stager_->scatter(plan, static_cast<std::byte*>(staging_alias_) + offset,
                                         pools_.staging.length - offset, pools_.kv));
  return stager_->wait(t);
}

}  // namespace pdkv::engine

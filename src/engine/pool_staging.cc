#include "engine/pool_staging.h"

#include <fmt/format.h>

#include <vector>

namespace pdkv::engine {

Result<std::unique_ptr<PoolStaging>> PoolStaging::create(const EngineConfig& config,
                                                         const EnginePools& pools,
                                                         const TransportCapabilities& caps,
                                                         std::string_view backend) {
  const MemoryRegion first = pools.kv.empty() ? MemoryRegion{} : pools.kv.front();
  for (size_t i = 0; i < pools.kv.size(); ++i) {
    if (pools.kv[i].kind != first.kind || pools.kv[i].device != first.device) {
      return Status::invalid_argument(fmt::format(
          "KV buffer {} is {} memory on device {}, buffer 0 {} memory on device {}: one kind and "
          "device per rank",
          i, memory_kind_name(pools.kv[i].kind), pools.kv[i].device, memory_kind_name(first.kind),
          first.device));
    }
  }
  if (first.kind == MemoryKind::kHost) {
    return std::unique_ptr<PoolStaging>(new PoolStaging(Mode::kHost, pools));
  }
  std::vector<std::pair<std::string, const MemoryRegion*>> host_only = {
      {"state", &pools.state}, {"staging", &pools.staging}};
  for (size_t i = 0; i < pools.aux.size(); ++i) {
    host_only.emplace_back(fmt::format("aux {}", i), &pools.aux[i]);
  }
  for (const auto& [name, region] : host_only) {
    if (region->length > 0 && region->kind != MemoryKind::kHost) {
      return Status::invalid_argument(
          fmt::format("the {} region is {} memory; only KV pools may live on a device", name,
                      memory_kind_name(region->kind)));
    }
  }
  const bool registers = first.kind == MemoryKind::kCuda ? caps.cuda_memory : caps.hip_memory;
  if (registers) {
    return std::unique_ptr<PoolStaging>(new PoolStaging(Mode::kDeviceDirect, pools));
  }
  if (config.staging_bytes == 0) {
    return Status::invalid_argument(fmt::format(
        "the KV pools are {} memory, which backend '{}' cannot register: they travel through "
        "the staging pool, and staging_bytes is 0",
        memory_kind_name(first.kind), backend));
  }
  std::unique_ptr<PoolStaging> s(new PoolStaging(Mode::kDeviceStaged, pools));
  PDKV_ASSIGN_OR_RETURN(s->runtime_, gpu::runtime(first.kind));
  PDKV_ASSIGN_OR_RETURN(s->stager_, s->runtime_->stager(first.device));
  PDKV_ASSIGN_OR_RETURN(s->staging_alias_,
                        s->runtime_->pin(pools.staging.base, pools.staging.length));
  return s;
}

PoolStaging::~PoolStaging() {
  stager_.reset();  // drains its stream first
  if (staging_alias_ != nullptr) runtime_->unpin(pools_.staging.base);
}

Status PoolStaging::gather(const TransferPlan& plan, uint64_t offset) {
  if (offset > pools_.staging.length) return Status::out_of_range("staging offset past the pool");
  if (mode_ == Mode::kDeviceStaged) {
    PDKV_ASSIGN_OR_RETURN(
        gpu::Stager::Ticket t,
        stager_->gather(plan, pools_.kv, static_cast<std::byte*>(staging_alias_) + offset,
                        pools_.staging.length - offset));
    return stager_->wait(t);
  }
  std::vector<std::span<const std::byte>> pool;
  for (const MemoryRegion& r : pools_.kv) {
    pool.emplace_back(static_cast<const std::byte*>(r.base), r.length);
  }
  return pdkv::gather(plan, pool,
                      {static_cast<std::byte*>(pools_.staging.base) + offset, plan.bytes()});
}

Status PoolStaging::scatter(const TransferPlan& plan, uint64_t offset) {
  if (offset > pools_.staging.length) return Status::out_of_range("staging offset past the pool");
  if (mode_ == Mode::kDeviceStaged) {
    PDKV_ASSIGN_OR_RETURN(gpu::Stager::Ticket t,
                          stager_->scatter(plan, static_cast<std::byte*>(staging_alias_) + offset,
                                           pools_.staging.length - offset, pools_.kv));
    return stager_->wait(t);
  }
  std::vector<std::span<std::byte>> pool;
  for (const MemoryRegion& r : pools_.kv)
    pool.emplace_back(static_cast<std::byte*>(r.base), r.length);
  return pdkv::scatter(
      plan, {static_cast<const std::byte*>(pools_.staging.base) + offset, plan.bytes()}, pool);
}

}  // namespace pdkv::engine

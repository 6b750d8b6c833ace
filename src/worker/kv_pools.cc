#include "worker/kv_pools.h"

#include <algorithm>

#include "worker/worker.h"

namespace pdkv::worker {

Result<KvPools> KvPools::create(const Shape& shape, const EngineConfig& cfg, uint32_t heads,
                                uint32_t rank) {
  KvPools p;
  p.kind_ = shape.device_kind();
  if (p.kind_ == MemoryKind::kHost) return p;  // the engine allocates them
  PDKV_ASSIGN_OR_RETURN(p.runtime_, gpu::runtime(p.kind_));
  p.device_ = static_cast<int>(rank % static_cast<uint32_t>(p.runtime_->device_count()));
  p.page_bytes_ = cfg.kv.page_bytes(heads);
  const uint64_t bytes = cfg.kv.num_pages * p.page_bytes_;
  for (uint32_t b = 0; b < shape.layers * cfg.kv.buffers_per_layer(); ++b) {
    PDKV_ASSIGN_OR_RETURN(void* memory, p.runtime_->allocate(p.device_, bytes));
    p.regions_.push_back({memory, bytes, p.kind_, p.device_});
    p.mirror_.emplace_back(shape.verify ? bytes : 0);
  }
  // One aux buffer at most (the worker's --aux-bytes), or none.
  for (uint32_t item : cfg.aux_item_bytes) p.aux_.resize(uint64_t{cfg.aux_slots} * item);
  // Page-aligned: the engine pins it for the staging kernels.
  PDKV_ASSIGN_OR_RETURN(engine::HostMapping staging,
                        engine::HostMapping::map(std::max<uint64_t>(1, cfg.staging_bytes)));
  p.staging_.push_back(std::move(staging));
  return p;
}

KvPools::~KvPools() {
  for (const MemoryRegion& r : regions_) runtime_->release(device_, r.base);
}

EnginePools KvPools::engine_pools() {
  EnginePools p;
  p.kv = regions_;
  if (!aux_.empty()) p.aux.push_back({aux_.data(), aux_.size(), MemoryKind::kHost, 0});
  p.staging = staging_.front().region();
  return p;
}

std::byte& KvPools::kv(uint32_t buffer, uint64_t offset) {
  return on_device() ? mirror_[buffer][offset]
                     : static_cast<std::byte*>(pools_->kv[buffer].base)[offset];
}

Status KvPools::move_pages(std::span<const uint64_t> pages, bool up) {
  if (!on_device()) return Status::ok();
  for (size_t b = 0; b < regions_.size(); ++b) {
    auto* device = static_cast<std::byte*>(regions_[b].base);
    for (uint64_t page : pages) {
      const uint64_t at = page * page_bytes_;
      PDKV_RETURN_IF_ERROR(up ? runtime_->copy(device + at, mirror_[b].data() + at, page_bytes_)
                              : runtime_->copy(mirror_[b].data() + at, device + at, page_bytes_));
    }
  }
  return Status::ok();
}

}  // namespace pdkv::worker

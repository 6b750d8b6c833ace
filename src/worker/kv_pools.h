// The KV, aux and staging memory of one worker, as the simulated model sees
// it. Host pools are the engine's own (Engine::create allocates them where
// its transport moves bytes fastest) and are touched in place. Device pools
// (--device) are this worker's allocations, with a host mirror: a room's
// pages are uploaded after the model writes them and downloaded before they
// are checked.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/pool_memory.h"
#include "gpu/gpu.h"
#include "pdkv/engine.h"

namespace pdkv::worker {

struct Shape;

class KvPools {
 public:
  // `heads`: the KV heads this rank owns; `rank`: picks the device.
  static Result<KvPools> create(const Shape& shape, const EngineConfig& cfg, uint32_t heads,
                                uint32_t rank);
  KvPools() = default;
  KvPools(KvPools&&) = default;
  KvPools& operator=(KvPools&&) = default;  // onto an empty one only
  ~KvPools();

  bool on_device() const { return kind_ != MemoryKind::kHost; }
  // For Engine::create: device KV pools, host aux and staging.
  EnginePools engine_pools();
  // The engine's pools, once it runs (host pools live there).
  void bind(const EnginePools& pools) { pools_ = &pools; }

  std::byte& kv(uint32_t buffer, uint64_t offset);
  std::byte& aux(uint64_t offset) { return static_cast<std::byte*>(pools_->aux[0].base)[offset]; }

  // Mirror -> device (upload) or device -> mirror, for these pages of every
  // buffer; nothing to do for host pools.
  Status upload(std::span<const uint64_t> pages) { return move_pages(pages, true); }
  Status download(std::span<const uint64_t> pages) { return move_pages(pages, false); }

 private:
  Status move_pages(std::span<const uint64_t> pages, bool up);

  MemoryKind kind_ = MemoryKind::kHost;
  gpu::Runtime* runtime_ = nullptr;
  int device_ = 0;
  uint64_t page_bytes_ = 0;
  std::vector<MemoryRegion> regions_;
  std::vector<std::vector<std::byte>> mirror_;
  std::vector<std::byte> aux_;
  std::vector<engine::HostMapping> staging_;  // one, or none for host pools
  const EnginePools* pools_ = nullptr;
};

}  // namespace pdkv::worker

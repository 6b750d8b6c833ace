#include "engine/pool_memory.h"

#include <fmt/format.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "log.h"

namespace pdkv::engine {

Result<HostMapping> HostMapping::map(uint64_t length) {
  // MAP_POPULATE: the first transfer into a pool should not pay its page
  // faults (nor should a benchmark count them).
  void* base = mmap(nullptr, length, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (base == MAP_FAILED) {
    return Status::unavailable(
        fmt::format("cannot map {} bytes for a pool: {}", length, std::strerror(errno)));
  }
  return HostMapping(base, length);
}

HostMapping::HostMapping(HostMapping&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)), length_(std::exchange(other.length_, 0)) {}

HostMapping::~HostMapping() {
  if (base_ != nullptr) munmap(base_, length_);
}

Result<EnginePools> allocate_pools(Transport& transport, const PoolSizes& sizes,
                                   std::vector<HostMapping>& owned) {
  bool told = false;  // one log line per engine, not one per buffer
  auto one = [&](uint64_t length) -> Result<MemoryRegion> {
    if (length == 0) return MemoryRegion{};
    auto mine = transport.allocate(length);
    if (mine.is_ok()) return mine;
    if (!told && mine.status().code() != StatusCode::kFailedPrecondition) {
      logger("engine")->warn("{}: pools fall back to ordinary memory ({})", transport.name(),
                             mine.status().message());
      told = true;
    }
    PDKV_ASSIGN_OR_RETURN(HostMapping mapping, HostMapping::map(length));
    owned.push_back(std::move(mapping));
    return owned.back().region();
  };
  EnginePools pools;
  for (uint32_t i = 0; i < sizes.kv_buffers; ++i) {
    PDKV_ASSIGN_OR_RETURN(MemoryRegion r, one(sizes.kv_buffer_bytes));
    pools.kv.push_back(r);
  }
  for (uint64_t bytes : sizes.aux_bytes) {
    PDKV_ASSIGN_OR_RETURN(MemoryRegion r, one(bytes));
    pools.aux.push_back(r);
  }
  PDKV_ASSIGN_OR_RETURN(pools.state, one(sizes.state_bytes));
  PDKV_ASSIGN_OR_RETURN(pools.staging, one(sizes.staging_bytes));
  return pools;
}

}  // namespace pdkv::engine

// The pools of an engine whose application passed none (Engine::create
// without EnginePools): sized from the configuration, allocated where the
// transport moves bytes fastest, else as ordinary page-aligned memory.
#pragma once

#include <cstdint>
#include <vector>

#include "pdkv/engine.h"
#include "pdkv/transport.h"

namespace pdkv::engine {

// What a rank's pools must hold; the one place the sizes are derived from a
// configuration (check_pools compares given pools against it).
struct PoolSizes {
  uint32_t kv_buffers = 0;  // local layers x (K+V, or the latent)
  uint64_t kv_buffer_bytes = 0;
  std::vector<uint64_t> aux_bytes;  // one per aux buffer
  uint64_t state_bytes = 0;
  uint64_t staging_bytes = 0;
};

// Anonymous memory mapped with its pages present, unmapped on destruction.
class HostMapping {
 public:
  static Result<HostMapping> map(uint64_t length);
  HostMapping(HostMapping&& other) noexcept;
  HostMapping& operator=(HostMapping&&) = delete;
  ~HostMapping();
  MemoryRegion region() const { return {base_, length_, MemoryKind::kHost, 0}; }

 private:
  HostMapping(void* base, uint64_t length) : base_(base), length_(length) {}
  void* base_ = nullptr;
  uint64_t length_ = 0;
};

// Allocates every pool of `sizes`, first asking the transport for its own
// memory (Transport::allocate), region by region; what it cannot give comes
// from HostMapping, kept alive in `owned`. Zeroed either way.
Result<EnginePools> allocate_pools(Transport& transport, const PoolSizes& sizes,
                                   std::vector<HostMapping>& owned);

}  // namespace pdkv::engine

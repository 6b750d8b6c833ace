// GPU memory for pools and the staging kernels (DESIGN §3): what pdkv needs
// of a GPU runtime, implemented once for CUDA and once for HIP from one
// source (runtime.cu), each built only when its compiler is found
// (PDKV_WITH_CUDA, PDKV_WITH_HIP).
//
// KV pools on a device move one of two ways. A transport that registers
// device memory (TransportCapabilities::cuda_memory / hip_memory) writes
// them directly. Otherwise every route travels through the host staging
// pool: a kernel gathers the plan's head slices from device pages into
// pinned host memory, the transport moves that block, and on the decode
// side a kernel scatters it into device pages. The kernels walk the
// planner's own arithmetic (pdkv/plan_view.h).
//
// Thread-safety: a Runtime may be used from any thread; a Stager from one
// thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "pdkv/plan.h"
#include "pdkv/status.h"
#include "pdkv/transport.h"

namespace pdkv::gpu {

// Staging kernels on one device, on a stream of their own.
class Stager {
 public:
  using Ticket = uint64_t;
  virtual ~Stager() = default;
  // Enqueue the gather of `plan`'s source bytes from the device `buffers`
  // (by buffer index) into `staging` and return at once; the bytes are
  // there once done(ticket). `staging` is device memory or the device
  // alias of pinned host memory (Runtime::pin). Bounds are checked as the
  // host gather() checks them, before anything is enqueued.
  virtual Result<Ticket> gather(const TransferPlan& plan, std::span<const MemoryRegion> buffers,
                                void* staging, uint64_t staging_bytes) = 0;
  // The reverse: `staging` scattered into the device `buffers`.
  virtual Result<Ticket> scatter(const TransferPlan& plan, const void* staging,
                                 uint64_t staging_bytes, std::span<const MemoryRegion> buffers) = 0;
  // Completion is an event recorded after the kernel.
  virtual bool done(Ticket ticket) = 0;
  virtual Status wait(Ticket ticket) = 0;  // the kernel's error, if any
};

class Runtime {
 public:
  virtual ~Runtime() = default;
  virtual MemoryKind kind() const = 0;
  // Devices visible to this process; 0 without a device or a driver.
  virtual int device_count() const = 0;
  // Plain device memory (never managed memory), zeroed.
  virtual Result<void*> allocate(int device, uint64_t bytes) = 0;
  virtual void release(int device, void* memory) = 0;
  // A copy in any direction between host and device memory, complete (on
  // the device too) when it returns.
  virtual Status copy(void* dst, const void* src, uint64_t bytes) = 0;
  // Page-locks host memory (page-aligned, to be portable across toolkits)
  // for the kernels and DMA; returns the address by which device code
  // reaches it.
  virtual Result<void*> pin(void* host, uint64_t bytes) = 0;
  virtual void unpin(void* host) = 0;
  virtual Result<std::unique_ptr<Stager>> stager(int device) = 0;
};

// The runtime for kCuda or kHip; an error naming the build option when pdkv
// was built without it, or the kind is kHost.
Result<Runtime*> runtime(MemoryKind kind);
// As runtime(), and an error too when it sees no device ("no CUDA device
// found").
Result<Runtime*> runtime_with_device(MemoryKind kind);

}  // namespace pdkv::gpu

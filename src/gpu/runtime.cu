// One source for the CUDA and the HIP runtime of pdkv (gpu/gpu.h): nvcc
// builds it as CUDA, hipcc (with PDKV_GPU_HIP) as HIP. The few names that
// differ go through the GPU_ macros below; everything else is shared,
// the staging kernel above all. (No fmt here: nvcc cannot compile its
// C++20 headers.)
#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "gpu/gpu.h"
#include "gpu/stage_copy.h"

#ifdef PDKV_GPU_HIP
#include <hip/hip_runtime.h>
#define GPU_API(name) hip##name
#define GPU_CONST(name) hip##name
#define PDKV_GPU_TOOLKIT "HIP"
#define PDKV_GPU_KIND MemoryKind::kHip
#define PDKV_GPU_ENTRY hip_runtime
#define GPU_HOST_ALLOC(p, n) hipHostMalloc(p, n, hipHostMallocDefault)
#define GPU_HOST_FREE hipHostFree
#define GPU_ATTR_SMS hipDeviceAttributeMultiprocessorCount
#else
#include <cuda_runtime.h>
#define GPU_API(name) cuda##name
#define GPU_CONST(name) cuda##name
#define PDKV_GPU_TOOLKIT "CUDA"
#define PDKV_GPU_KIND MemoryKind::kCuda
#define PDKV_GPU_ENTRY cuda_runtime
#define GPU_HOST_ALLOC(p, n) cudaMallocHost(p, n)
#define GPU_HOST_FREE cudaFreeHost
#define GPU_ATTR_SMS cudaDevAttrMultiProcessorCount
#endif

namespace pdkv::gpu {
namespace {

using gpu_error = GPU_API(Error_t);
using gpu_stream = GPU_API(Stream_t);
using gpu_event = GPU_API(Event_t);

Status error_of(const char* call, gpu_error e) {
  return Status::internal(std::string(PDKV_GPU_TOOLKIT) + " " + call + ": " +
                          GPU_API(GetErrorString)(e));
}
#define GPU_CHECK(call)                                                       \
  do {                                                                        \
    const gpu_error pdkv_gpu_e = (call);                                      \
    if (pdkv_gpu_e != GPU_CONST(Success)) return error_of(#call, pdkv_gpu_e); \
  } while (0)

// ---- The staging kernel -------------------------------------------------
//
// Each thread does its share (gpu/stage_copy.h, also run on the host by the
// unit tests): a group of lanes (a warp, or a whole block for plans with
// large fragments) copies one fragment at a time, from fragment_at(), the
// planner's own arithmetic.

constexpr int kThreads = 256;

__global__ void stage_kernel(PlanView plan, const uint64_t* buffers, unsigned char* staging,
                             bool gather, unsigned lanes) {
  stage_thread(plan, buffers, staging, gather, lanes, kThreads, blockIdx.x, gridDim.x,
               threadIdx.x);
}

// ---- Stager --------------------------------------------------------------

class DeviceStager final : public Stager {
 public:
  static Result<std::unique_ptr<Stager>> create(int device) {
    std::unique_ptr<DeviceStager> s(new DeviceStager(device));
    GPU_CHECK(GPU_API(SetDevice)(device));
    GPU_CHECK(GPU_API(StreamCreateWithFlags)(&s->stream_, GPU_CONST(StreamNonBlocking)));
    int sms = 0;
    GPU_CHECK(GPU_API(DeviceGetAttribute)(&sms, GPU_ATTR_SMS, device));
    s->max_blocks_ = std::max(1, sms) * 8;
    return std::unique_ptr<Stager>(std::move(s));
  }

  ~DeviceStager() override {
    (void)GPU_API(SetDevice)(device_);
    if (stream_) (void)GPU_API(StreamSynchronize)(stream_);
    for (auto& [ticket, event] : events_) (void)GPU_API(EventDestroy)(event);
    if (device_scratch_) (void)GPU_API(Free)(device_scratch_);
    if (host_scratch_) (void)GPU_HOST_FREE(host_scratch_);
    if (stream_) (void)GPU_API(StreamDestroy)(stream_);
  }

  Result<Ticket> gather(const TransferPlan& plan, std::span<const MemoryRegion> buffers,
                        void* staging, uint64_t staging_bytes) override {
    PDKV_RETURN_IF_ERROR(
        check_staging_bounds(plan, PlanSide::kSource, lengths(buffers), staging_bytes));
    return launch(plan, buffers, static_cast<unsigned char*>(staging), true);
  }

  Result<Ticket> scatter(const TransferPlan& plan, const void* staging, uint64_t staging_bytes,
                         std::span<const MemoryRegion> buffers) override {
    PDKV_RETURN_IF_ERROR(
        check_staging_bounds(plan, PlanSide::kDestination, lengths(buffers), staging_bytes));
    // The kernel only reads staging when scattering.
    return launch(plan, buffers, static_cast<unsigned char*>(const_cast<void*>(staging)), false);
  }

  bool done(Ticket ticket) override {
    auto it = events_.find(ticket);
    return it == events_.end() || GPU_API(EventQuery)(it->second) != GPU_CONST(ErrorNotReady);
  }

  Status wait(Ticket ticket) override {
    auto it = events_.find(ticket);
    if (it == events_.end()) return Status::ok();
    const gpu_error e = GPU_API(EventSynchronize)(it->second);
    (void)GPU_API(EventDestroy)(it->second);
    events_.erase(it);
    if (e != GPU_CONST(Success)) return error_of("EventSynchronize (staging kernel)", e);
    return Status::ok();
  }

 private:
  explicit DeviceStager(int device) : device_(device) {}

  static std::vector<uint64_t> lengths(std::span<const MemoryRegion> buffers) {
    std::vector<uint64_t> out;
    for (const MemoryRegion& r : buffers) out.push_back(r.length);
    return out;
  }

  // Grows the pinned and device scratch that carry a plan's runs, pieces and
  // buffer addresses to the device. The stream must be idle.
  Status reserve(uint64_t bytes) {
    if (bytes <= scratch_bytes_) return Status::ok();
    if (device_scratch_) GPU_CHECK(GPU_API(Free)(device_scratch_));
    if (host_scratch_) GPU_CHECK(GPU_HOST_FREE(host_scratch_));
    device_scratch_ = nullptr;
    host_scratch_ = nullptr;
    scratch_bytes_ = 0;
    const uint64_t size = std::max<uint64_t>(bytes, 64 << 10);
    GPU_CHECK(GPU_API(Malloc)(&device_scratch_, size));
    GPU_CHECK(GPU_HOST_ALLOC(&host_scratch_, size));
    scratch_bytes_ = size;
    return Status::ok();
  }

  Result<Ticket> launch(const TransferPlan& plan, std::span<const MemoryRegion> buffers,
                        unsigned char* staging, bool gather) {
    GPU_CHECK(GPU_API(SetDevice)(device_));
    PlanView view = plan.view();
    const uint64_t count = view.fragment_count();
    const uint64_t pieces_bytes = view.piece_count * sizeof(TemplatePiece);
    const uint64_t runs_bytes = view.run_count * sizeof(PageRun);
    const uint64_t table_bytes = buffers.size() * sizeof(uint64_t);
    const uint64_t total = pieces_bytes + runs_bytes + table_bytes;
    // The scratch is rewritten (or replaced) only once earlier launches have
    // read it.
    GPU_CHECK(GPU_API(StreamSynchronize)(stream_));
    PDKV_RETURN_IF_ERROR(reserve(total));
    auto* host = static_cast<unsigned char*>(host_scratch_);
    std::copy_n(reinterpret_cast<const unsigned char*>(view.pieces), pieces_bytes, host);
    std::copy_n(reinterpret_cast<const unsigned char*>(view.runs), runs_bytes, host + pieces_bytes);
    auto* table = reinterpret_cast<uint64_t*>(host + pieces_bytes + runs_bytes);
    for (size_t b = 0; b < buffers.size(); ++b) {
      table[b] = reinterpret_cast<uint64_t>(buffers[b].base);
    }
    GPU_CHECK(GPU_API(MemcpyAsync)(device_scratch_, host_scratch_, total,
                                   GPU_CONST(MemcpyHostToDevice), stream_));
    auto* device = static_cast<unsigned char*>(device_scratch_);
    view.pieces = reinterpret_cast<const TemplatePiece*>(device);
    view.runs = reinterpret_cast<const PageRun*>(device + pieces_bytes);
    const auto* device_table =
        reinterpret_cast<const uint64_t*>(device + pieces_bytes + runs_bytes);
    if (count > 0) {
      const unsigned lanes = lanes_for(plan.view(), kThreads);
      const uint64_t groups = kThreads / lanes;
      const auto blocks =
          static_cast<unsigned>(std::min<uint64_t>((count + groups - 1) / groups, max_blocks_));
      stage_kernel<<<blocks, kThreads, 0, stream_>>>(view, device_table, staging, gather, lanes);
      GPU_CHECK(GPU_API(GetLastError)());
    }
    gpu_event event = nullptr;
    GPU_CHECK(GPU_API(EventCreateWithFlags)(&event, GPU_CONST(EventDisableTiming)));
    const gpu_error recorded = GPU_API(EventRecord)(event, stream_);
    if (recorded != GPU_CONST(Success)) {
      (void)GPU_API(EventDestroy)(event);
      return error_of("EventRecord", recorded);
    }
    const Ticket ticket = ++last_ticket_;
    events_[ticket] = event;
    return ticket;
  }

  int device_;
  gpu_stream stream_ = nullptr;
  uint64_t max_blocks_ = 1;
  void* device_scratch_ = nullptr;
  void* host_scratch_ = nullptr;
  uint64_t scratch_bytes_ = 0;
  std::map<Ticket, gpu_event> events_;
  Ticket last_ticket_ = 0;
};

// ---- Runtime -------------------------------------------------------------

class ToolkitRuntime final : public Runtime {
 public:
  MemoryKind kind() const override { return PDKV_GPU_KIND; }

  int device_count() const override {
    int n = 0;
    // No driver or no device reads as no device.
    return GPU_API(GetDeviceCount)(&n) == GPU_CONST(Success) ? n : 0;
  }

  Result<void*> allocate(int device, uint64_t bytes) override {
    PDKV_RETURN_IF_ERROR(check_device(device));
    void* p = nullptr;
    GPU_CHECK(GPU_API(SetDevice)(device));
    const gpu_error e = GPU_API(Malloc)(&p, bytes);
    if (e != GPU_CONST(Success)) {
      return Status::unavailable(std::string(PDKV_GPU_TOOLKIT) + " device " +
                                 std::to_string(device) + ": cannot allocate " +
                                 std::to_string(bytes) + " bytes: " + GPU_API(GetErrorString)(e));
    }
    // The memset runs on the default stream, which the stagers' non-blocking
    // streams do not wait for: it is done before the memory is handed out.
    gpu_error zeroed = GPU_API(Memset)(p, 0, bytes);
    if (zeroed == GPU_CONST(Success)) zeroed = GPU_API(DeviceSynchronize)();
    if (zeroed != GPU_CONST(Success)) {
      (void)GPU_API(Free)(p);
      return error_of("Memset", zeroed);
    }
    return p;
  }

  void release(int device, void* memory) override {
    if (memory == nullptr) return;
    (void)GPU_API(SetDevice)(device);
    (void)GPU_API(Free)(memory);
  }

  Status copy(void* dst, const void* src, uint64_t bytes) override {
    GPU_CHECK(GPU_API(Memcpy)(dst, src, bytes, GPU_CONST(MemcpyDefault)));
    // From pageable memory Memcpy may return before its DMA has landed, and
    // the staging kernels run on streams that do not wait for the default
    // one: the copy is complete when this returns.
    GPU_CHECK(GPU_API(StreamSynchronize)(nullptr));
    return Status::ok();
  }

  Result<void*> pin(void* host, uint64_t bytes) override {
    GPU_CHECK(GPU_API(HostRegister)(
        host, bytes, GPU_CONST(HostRegisterMapped) | GPU_CONST(HostRegisterPortable)));
    void* device = nullptr;
    const gpu_error e = GPU_API(HostGetDevicePointer)(&device, host, 0);
    if (e != GPU_CONST(Success)) {
      (void)GPU_API(HostUnregister)(host);
      return error_of("HostGetDevicePointer", e);
    }
    return device;
  }

  void unpin(void* host) override { (void)GPU_API(HostUnregister)(host); }

  Result<std::unique_ptr<Stager>> stager(int device) override {
    PDKV_RETURN_IF_ERROR(check_device(device));
    return DeviceStager::create(device);
  }

 private:
  Status check_device(int device) const {
    const int n = device_count();
    if (device < 0 || device >= n) {
      return Status::invalid_argument(std::string(PDKV_GPU_TOOLKIT) + " device " +
                                      std::to_string(device) + " does not exist (" +
                                      std::to_string(n) + " found)");
    }
    return Status::ok();
  }
};

}  // namespace

Runtime* PDKV_GPU_ENTRY() {
  static ToolkitRuntime runtime;
  return &runtime;
}

}  // namespace pdkv::gpu

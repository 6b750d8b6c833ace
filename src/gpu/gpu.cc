#include "gpu/gpu.h"

#include <fmt/format.h>

namespace pdkv::gpu {

// Defined by runtime.cu when built for that toolkit.
#ifdef PDKV_WITH_CUDA
Runtime* cuda_runtime();
#endif
#ifdef PDKV_WITH_HIP
Runtime* hip_runtime();
#endif

Result<Runtime*> runtime(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kCuda:
#ifdef PDKV_WITH_CUDA
      return cuda_runtime();
#else
      return Status::failed_precondition(
          "pdkv was built without CUDA (PDKV_WITH_CUDA=OFF: no nvcc was found)");
#endif
    case MemoryKind::kHip:
#ifdef PDKV_WITH_HIP
      return hip_runtime();
#else
      return Status::failed_precondition(
          "pdkv was built without HIP (PDKV_WITH_HIP=OFF: no hipcc was found)");
#endif
    case MemoryKind::kHost:
      break;
  }
  return Status::invalid_argument(
      fmt::format("{} memory needs no GPU runtime", memory_kind_name(kind)));
}

Result<Runtime*> runtime_with_device(MemoryKind kind) {
  PDKV_ASSIGN_OR_RETURN(Runtime * rt, runtime(kind));
  if (rt->device_count() == 0) {
    return Status::failed_precondition(
        fmt::format("no {} device found", kind == MemoryKind::kCuda ? "CUDA" : "HIP"));
  }
  return rt;
}

}  // namespace pdkv::gpu

// Host staging: gather a plan's source bytes into one contiguous buffer and
// scatter them back. GPU pools use kernels that walk the same
// TransferPlan::fragment arithmetic.
#include <fmt/format.h>

#include <cstring>

#include "pdkv/plan.h"

namespace pdkv {
namespace {

template <typename Buffer>
Status check_buffers(const char* side, std::span<const Buffer> buffers, uint32_t needed,
                     uint64_t extent) {
  if (buffers.size() < needed) {
    return Status::invalid_argument(fmt::format("{} has {} buffers but the plan touches buffer {}",
                                                side, buffers.size(), needed - 1));
  }
  for (uint32_t b = 0; b < needed; ++b) {
    if (buffers[b].size() < extent) {
      return Status::out_of_range(
          fmt::format("{} buffer {} holds {} bytes but the plan reaches "
                      "byte {}",
                      side, b, buffers[b].size(), extent));
    }
  }
  return Status::ok();
}

Status check_staging(uint64_t size, const TransferPlan& plan) {
  if (size < plan.bytes()) {
    return Status::out_of_range(
        fmt::format("staging buffer holds {} bytes but the plan moves {}", size, plan.bytes()));
  }
  return Status::ok();
}

}  // namespace

Status gather(const TransferPlan& plan, std::span<const std::span<const std::byte>> src_buffers,
              std::span<std::byte> staging) {
  PDKV_RETURN_IF_ERROR(
      check_buffers("source", src_buffers, plan.src_buffers_needed(), plan.src_extent()));
  PDKV_RETURN_IF_ERROR(check_staging(staging.size(), plan));
  plan.for_each([&](const Fragment& f) {
    std::memcpy(staging.data() + f.staging_offset, src_buffers[f.src_buffer].data() + f.src_offset,
                f.length);
  });
  return Status::ok();
}

Status scatter(const TransferPlan& plan, std::span<const std::byte> staging,
               std::span<const std::span<std::byte>> dst_buffers) {
  PDKV_RETURN_IF_ERROR(
      check_buffers("destination", dst_buffers, plan.dst_buffers_needed(), plan.dst_extent()));
  PDKV_RETURN_IF_ERROR(check_staging(staging.size(), plan));
  plan.for_each([&](const Fragment& f) {
    std::memcpy(dst_buffers[f.dst_buffer].data() + f.dst_offset, staging.data() + f.staging_offset,
                f.length);
  });
  return Status::ok();
}

}  // namespace pdkv

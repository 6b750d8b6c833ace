// Host staging: gather a plan's source bytes into one contiguous buffer and
// scatter them back. GPU pools use kernels (src/gpu/staging_kernels.cu) that
// walk the same arithmetic (pdkv/plan_view.h) and make the same checks.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "pdkv/plan.h"

namespace pdkv {
bool staging_pays(const TransferPlan& plan, uint64_t write_overhead_bytes,
                  uint32_t sources_scattered) {
  const uint64_t fragments = plan.fragment_count();
  if (fragments <= 1 || write_overhead_bytes == 0) return false;
  // (fragments - 1) x overhead > sources x bytes, divided through so that
  // that product cannot overflow (for whole numbers, n > floor(c / o) is
  // n x o > c); sources x bytes saturates rather than wraps.
  const uint64_t sources = std::max<uint32_t>(sources_scattered, 1);
  const uint64_t copied = plan.bytes() > UINT64_MAX / sources ? UINT64_MAX : plan.bytes() * sources;
  return fragments - 1 > copied / write_overhead_bytes;
}

Status check_staging_bounds(const TransferPlan& plan, PlanSide side,
                            std::span<const uint64_t> buffer_lengths, uint64_t staging_bytes) {
  const bool source = side == PlanSide::kSource;
  const char* name = source ? "source" : "destination";
  const uint32_t needed = source ? plan.src_buffers_needed() : plan.dst_buffers_needed();
  const uint64_t extent = source ? plan.src_extent() : plan.dst_extent();
  if (buffer_lengths.size() < needed) {
    return Status::invalid_argument(fmt::format("{} has {} buffers but the plan touches buffer {}",
                                                name, buffer_lengths.size(), needed - 1));
  }
  for (uint32_t b = 0; b < needed; ++b) {
    if (buffer_lengths[b] < extent) {
      return Status::out_of_range(
          fmt::format("{} buffer {} holds {} bytes but the plan reaches byte {}", name, b,
                      buffer_lengths[b], extent));
    }
  }
  if (staging_bytes < plan.bytes()) {
    return Status::out_of_range(fmt::format("staging buffer holds {} bytes but the plan moves {}",
                                            staging_bytes, plan.bytes()));
  }
  return Status::ok();
}

namespace {

template <typename Buffer>
std::vector<uint64_t> lengths_of(std::span<const Buffer> buffers) {
  std::vector<uint64_t> lengths;
  lengths.reserve(buffers.size());
  for (const auto& b : buffers) lengths.push_back(b.size());
  return lengths;
}

}  // namespace

Status gather(const TransferPlan& plan, std::span<const std::span<const std::byte>> src_buffers,
              std::span<std::byte> staging) {
  PDKV_RETURN_IF_ERROR(
      check_staging_bounds(plan, PlanSide::kSource, lengths_of(src_buffers), staging.size()));
  plan.for_each([&](const Fragment& f) {
    std::memcpy(staging.data() + f.staging_offset, src_buffers[f.src_buffer].data() + f.src_offset,
                f.length);
  });
  return Status::ok();
}

Status scatter(const TransferPlan& plan, std::span<const std::byte> staging,
               std::span<const std::span<std::byte>> dst_buffers) {
  PDKV_RETURN_IF_ERROR(
      check_staging_bounds(plan, PlanSide::kDestination, lengths_of(dst_buffers), staging.size()));
  plan.for_each([&](const Fragment& f) {
    std::memcpy(dst_buffers[f.dst_buffer].data() + f.dst_offset, staging.data() + f.staging_offset,
                f.length);
  });
  return Status::ok();
}

}  // namespace pdkv

// Moving a plan's bytes in host memory, the two ways a transport does:
// fragment by fragment, or gathered into one block and scattered (staging).
// For tests that check the planner byte for byte without a transport.
#pragma once

#include <cstring>
#include <span>
#include <vector>

#include "pdkv/plan.h"

namespace pdkv::testing {

inline Status copy_plan(const TransferPlan& plan, std::vector<std::vector<std::byte>>& src,
                        std::vector<std::vector<std::byte>>& dst, bool staged) {
  if (!staged) {
    plan.for_each([&](const Fragment& f) {
      std::memcpy(dst[f.dst_buffer].data() + f.dst_offset, src[f.src_buffer].data() + f.src_offset,
                  f.length);
    });
    return Status::ok();
  }
  std::vector<std::span<const std::byte>> from(src.begin(), src.end());
  std::vector<std::span<std::byte>> to(dst.begin(), dst.end());
  std::vector<std::byte> block(plan.bytes());
  PDKV_RETURN_IF_ERROR(gather(plan, from, block));
  return scatter(plan, block, to);
}

}  // namespace pdkv::testing

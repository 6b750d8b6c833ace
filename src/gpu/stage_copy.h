// The body of the staging kernel, one thread's share, as a function that
// host code can run too: tests/unit/stage_copy_test.cc runs every thread of
// a grid on the host, one after another, and compares the result with the
// host gather()/scatter(). The kernel (runtime.cu) only calls it.
//
// A group of `lanes` threads (a warp, or a whole block) copies one fragment
// at a time; groups stride over the plan's fragments. Lanes copy 16-byte
// chunks when source, destination and length allow it, bytes otherwise, so
// the lanes of a group never touch the same byte and any order of threads
// gives the same bytes.
#pragma once

#include <cstdint>

#include "pdkv/plan_view.h"

namespace pdkv::gpu {

struct alignas(16) Chunk16 {
  uint64_t lo, hi;
};

PDKV_HOST_DEVICE inline void copy_lane(unsigned char* dst, const unsigned char* src,
                                       uint64_t length, unsigned lane, unsigned lanes) {
  const bool wide =
      ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | length) & 15) == 0;
  if (wide) {
    auto* d = reinterpret_cast<Chunk16*>(dst);
    const auto* s = reinterpret_cast<const Chunk16*>(src);
    for (uint64_t k = lane; k < length / 16; k += lanes) d[k] = s[k];
  } else {
    for (uint64_t k = lane; k < length; k += lanes) dst[k] = src[k];
  }
}

// Lanes per fragment for a plan: a warp, or all `threads` of a block when
// its fragments can exceed 64 KiB (whole pages merged into runs).
inline unsigned lanes_for(const PlanView& plan, unsigned threads) {
  uint64_t piece = 0, pages = 0;
  for (uint64_t p = 0; p < plan.piece_count; ++p) {
    piece = plan.pieces[p].length > piece ? plan.pieces[p].length : piece;
  }
  for (uint64_t r = 0; r < plan.run_count; ++r) {
    pages = plan.runs[r].count > pages ? plan.runs[r].count : pages;
  }
  return piece * pages > (64 << 10) ? threads : 32;
}

// Thread `thread` of block `block`, in a grid of `blocks` blocks of
// `threads` threads. gather: pool -> staging; otherwise staging -> pool.
// `buffers` holds the address of each pool buffer, by buffer index.
PDKV_HOST_DEVICE inline void stage_thread(const PlanView& plan, const uint64_t* buffers,
                                          unsigned char* staging, bool gather, unsigned lanes,
                                          unsigned threads, uint64_t block, uint64_t blocks,
                                          unsigned thread) {
  const unsigned groups = threads / lanes;
  const unsigned lane = thread % lanes;
  const uint64_t count = plan.fragment_count();
  for (uint64_t i = block * groups + thread / lanes; i < count; i += blocks * groups) {
    const Fragment f = fragment_at(plan, i);
    unsigned char* stage = staging + f.staging_offset;
    if (gather) {
      const auto* pool = reinterpret_cast<const unsigned char*>(buffers[f.src_buffer]);
      copy_lane(stage, pool + f.src_offset, f.length, lane, lanes);
    } else {
      auto* pool = reinterpret_cast<unsigned char*>(buffers[f.dst_buffer]);
      copy_lane(pool + f.dst_offset, stage, f.length, lane, lanes);
    }
  }
}

}  // namespace pdkv::gpu

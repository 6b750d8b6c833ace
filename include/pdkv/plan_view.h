// The index arithmetic of a transfer plan, in a form that host code and GPU
// kernels share: plain structs, raw pointers, no allocation.
//
// A plan moves, for each of its (layer, K/V) buffers and each run of
// consecutive pages, the pieces of one page template (pdkv/plan.h).
// fragment_at(view, i) is the i-th of those fragments: the planner's own
// TransferPlan::fragment() is this function, so the host tests of the
// planner check the very arithmetic that the staging kernels run
// (src/gpu/staging_kernels.cu).
#pragma once

#include <cstdint>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define PDKV_HOST_DEVICE __host__ __device__
#else
#define PDKV_HOST_DEVICE
#endif

namespace pdkv {

struct Fragment {
  uint32_t src_buffer = 0;
  uint32_t dst_buffer = 0;
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t length = 0;
  uint64_t staging_offset = 0;  // where the bytes sit in the staging buffer
  bool operator==(const Fragment&) const = default;
};

// One coalesced fragment inside a page, offsets relative to the page start.
struct TemplatePiece {
  uint64_t src_offset;
  uint64_t dst_offset;
  uint64_t length;
  uint64_t staging_offset;  // prefix sum of the lengths before this piece
};

// Consecutive request pages [first_index, first_index + count) of the page
// lists that map to consecutive pool pages on both sides.
struct PageRun {
  uint64_t src_page;
  uint64_t dst_page;
  uint64_t count;
  uint64_t first_index;
};

struct PlanView {
  const TemplatePiece* pieces = nullptr;
  uint64_t piece_count = 0;
  const PageRun* runs = nullptr;
  uint64_t run_count = 0;
  uint64_t pages = 0;  // pages of the request (the runs' total count)
  uint64_t src_page_bytes = 0;
  uint64_t dst_page_bytes = 0;
  uint64_t template_bytes = 0;  // bytes of one page's pieces
  uint32_t src_layer = 0;       // first local layer on each side
  uint32_t dst_layer = 0;
  uint32_t layers = 0;
  uint32_t buffers_per_layer = 0;

  PDKV_HOST_DEVICE uint64_t fragment_count() const {
    return uint64_t{layers} * buffers_per_layer * run_count * piece_count;
  }
};

// Fragment i in [0, view.fragment_count()), in the order in which staging
// lays them out: buffer-major, then run, then piece.
PDKV_HOST_DEVICE inline Fragment fragment_at(const PlanView& v, uint64_t i) {
  const uint64_t per_buffer = v.run_count * v.piece_count;
  const uint64_t buffer = i / per_buffer;
  const uint64_t rest = i % per_buffer;
  const PageRun& run = v.runs[rest / v.piece_count];
  const TemplatePiece& piece = v.pieces[rest % v.piece_count];
  const auto layer = static_cast<uint32_t>(buffer / v.buffers_per_layer);
  const auto kv = static_cast<uint32_t>(buffer % v.buffers_per_layer);
  Fragment f;
  f.src_buffer = (v.src_layer + layer) * v.buffers_per_layer + kv;
  f.dst_buffer = (v.dst_layer + layer) * v.buffers_per_layer + kv;
  f.src_offset = run.src_page * v.src_page_bytes + piece.src_offset;
  f.dst_offset = run.dst_page * v.dst_page_bytes + piece.dst_offset;
  // A run longer than one page only exists for whole-page templates.
  f.length = piece.length * run.count;
  f.staging_offset = buffer * v.pages * v.template_bytes + run.first_index * v.template_bytes +
                     piece.staging_offset;
  return f;
}

}  // namespace pdkv

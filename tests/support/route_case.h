// A route between one source and one destination rank, for tests that plan
// it on the host or stage it on a GPU: layouts, head count, the TP pair and
// which ranks, MLA or not.
#pragma once

#include <gtest/gtest.h>

#include <ostream>

#include "pdkv/plan.h"

namespace pdkv::testing {

struct RouteCase {
  const char* name;
  Layout src_layout, dst_layout;
  uint32_t heads, src_tp, src_rank, dst_tp, dst_rank;
  bool mla;
};
inline void PrintTo(const RouteCase& c, std::ostream* os) { *os << c.name; }

struct RouteShards {
  RankShard src, dst;
  Route route;  // the case's head segment, every layer
};

// The shards and route of `c` in a model of `head_dim` x 2-byte elements
// (MLA: one latent of that width), `page_size` tokens a page, `layers`
// layers and `pages` pages in each pool. Fails the test when the two ranks
// exchange no heads.
inline RouteShards route_shards(const RouteCase& c, uint32_t head_dim, uint32_t page_size,
                                uint32_t layers, uint64_t pages) {
  const KvSpec base{c.mla ? 1u : c.heads, head_dim, 2, page_size, layers, pages,
                    Layout::kNhd,         c.mla};
  KvSpec src_spec = base, dst_spec = base;
  src_spec.layout = c.src_layout;
  dst_spec.layout = c.dst_layout;
  const uint32_t units = c.mla ? 1 : c.heads;
  const auto src_axis = AxisSharding::even(units, c.src_tp).value();
  const auto dst_axis = AxisSharding::even(units, c.dst_tp).value();
  Segment seg;
  for (const Segment& s : segments_from(transfer_map(src_axis, dst_axis).value(), c.src_rank)) {
    if (s.dst_rank == c.dst_rank) seg = s;
  }
  EXPECT_GT(seg.count, 0u) << c.name << ": the ranks exchange no heads";
  return {{src_spec, src_axis.owned(c.src_rank).value(), {0, layers}},
          {dst_spec, dst_axis.owned(c.dst_rank).value(), {0, layers}},
          {seg, {0, 0, 0, 0, layers}}};
}

// The cases both the host and the GPU tests run.
inline constexpr RouteCase kRouteCases[] = {
    {"nhd_to_nhd_tp2_to_tp4", Layout::kNhd, Layout::kNhd, 8, 2, 0, 4, 1, false},
    {"nhd_to_hnd_tp4_to_tp2", Layout::kNhd, Layout::kHnd, 8, 4, 3, 2, 1, false},
    {"hnd_to_nhd_tp1_to_tp4_2kv", Layout::kHnd, Layout::kNhd, 2, 1, 0, 4, 3, false},
    {"hnd_to_hnd_equal_tp", Layout::kHnd, Layout::kHnd, 8, 1, 0, 1, 0, false},
    {"mla_tp1_to_tp2", Layout::kNhd, Layout::kNhd, 1, 1, 0, 2, 1, true},
};

}  // namespace pdkv::testing

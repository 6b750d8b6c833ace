// Byte-exact planner tests: every source element gets a value derived from
// (layer, K/V, global head, token, byte); fragments are applied with memcpy
// (or gathered and scattered through staging); every byte of every decode
// pool is then checked against what that element should hold. Pool addresses
// come from the layout formulas written out here, not from the planner.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "pdkv/plan.h"
#include "support/kv_oracle.h"
#include "support/plan_copy.h"

namespace pdkv {
namespace {

using testing::element_byte;
using testing::untouched_byte;

struct Side {
  uint32_t tp;
  std::vector<UnitRange> pp;  // layer range per pipeline stage
  Layout layout;
};

struct Case {
  std::string name;
  uint32_t heads;
  Side prefill, decode;
  bool mla = false;
  bool staging = false;
  bool contiguous_pages = false;
};

constexpr uint32_t kLayers = 5, kHeadDim = 3, kDtype = 2, kPageSize = 4, kPoolPages = 12,
                   kRequestPages = 5;

struct Rank {
  RankShard shard;
  std::vector<std::vector<std::byte>> buffers;  // (local layer, kv)
  uint32_t tp, pp;
};

std::vector<Rank> make_ranks(const Case& c, const Side& side, bool prefill) {
  const uint32_t heads = c.mla ? 1 : c.heads;
  auto head_axis = AxisSharding::even(heads, side.tp).value();
  std::vector<Rank> ranks;
  for (uint32_t pp = 0; pp < side.pp.size(); ++pp) {
    for (uint32_t tp = 0; tp < side.tp; ++tp) {
      Rank r;
      r.shard.spec =
          KvSpec{heads, kHeadDim, kDtype, kPageSize, kLayers, kPoolPages, side.layout, c.mla};
      r.shard.heads = head_axis.owned(tp).value();
      r.shard.layers = side.pp[pp];
      r.tp = tp;
      r.pp = pp;
      const uint64_t bytes = kPoolPages * r.shard.spec.page_bytes(r.shard.heads.count);
      const uint32_t nbuf = r.shard.layers.count * r.shard.spec.buffers_per_layer();
      for (uint32_t b = 0; b < nbuf; ++b) {
        std::vector<std::byte> buf(bytes);
        if (!prefill) {
          const uint32_t id = static_cast<uint32_t>(ranks.size());
          for (uint64_t o = 0; o < bytes; ++o) buf[o] = std::byte{untouched_byte(id, b, o)};
        }
        r.buffers.push_back(std::move(buf));
      }
      ranks.push_back(std::move(r));
    }
  }
  return ranks;
}

template <typename F>
void for_each_element(const Rank& r, const std::vector<uint64_t>& pages, F&& visit) {
  testing::for_each_element(r.shard.spec, r.shard.heads, r.shard.layers, pages, 0, visit);
}

std::vector<uint64_t> page_list(bool contiguous, uint32_t seed) {
  std::vector<uint64_t> pages(kPoolPages);
  std::iota(pages.begin(), pages.end(), 0);
  if (!contiguous) std::shuffle(pages.begin(), pages.end(), std::mt19937(seed));
  pages.resize(kRequestPages);
  return pages;
}

class PlannerByteExact : public ::testing::TestWithParam<Case> {};

TEST_P(PlannerByteExact, EveryDecodeByteIsRight) {
  const Case& c = GetParam();
  auto prefill = make_ranks(c, c.prefill, true);
  auto decode = make_ranks(c, c.decode, false);
  const auto src_pages = page_list(c.contiguous_pages, 11);
  const auto dst_pages = page_list(c.contiguous_pages, 29);

  for (Rank& r : prefill) {
    for_each_element(r, src_pages, [&](uint32_t buf, uint64_t off, uint8_t v) {
      r.buffers[buf][off] = std::byte{v};
    });
  }

  const uint32_t heads = c.mla ? 1 : c.heads;
  auto head_map = transfer_map(AxisSharding::even(heads, c.prefill.tp).value(),
                               AxisSharding::even(heads, c.decode.tp).value())
                      .value();
  auto layer_map = transfer_map(AxisSharding::from_ranges(kLayers, c.prefill.pp).value(),
                                AxisSharding::from_ranges(kLayers, c.decode.pp).value())
                       .value();
  Planner planner;
  for (const Segment& hs : head_map) {
    for (const Segment& ls : layer_map) {
      Rank& src = prefill[ls.src_rank * c.prefill.tp + hs.src_rank];
      Rank& dst = decode[ls.dst_rank * c.decode.tp + hs.dst_rank];
      auto plan = planner.plan(src.shard, dst.shard, {hs, ls}, src_pages, dst_pages);
      ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
      ASSERT_TRUE(testing::copy_plan(*plan, src.buffers, dst.buffers, c.staging).is_ok());
    }
  }

  for (uint32_t id = 0; id < decode.size(); ++id) {
    const Rank& r = decode[id];
    std::vector<size_t> sizes;
    for (const auto& b : r.buffers) sizes.push_back(b.size());
    const auto expected = testing::expected_image(id, r.shard, sizes, dst_pages);
    for (uint32_t b = 0; b < r.buffers.size(); ++b) {
      for (uint64_t o = 0; o < expected[b].size(); ++o) {
        ASSERT_EQ(std::to_integer<uint8_t>(r.buffers[b][o]), expected[b][o])
            << "decode tp " << r.tp << " pp " << r.pp << " buffer " << b << " byte " << o;
      }
    }
  }
}

const std::vector<UnitRange> kOneStage = {{0, kLayers}};
const std::vector<UnitRange> kTwoStages = {{0, 2}, {2, 3}};  // uneven PP split

std::vector<Case> cases() {
  std::vector<Case> out;
  for (Layout src : {Layout::kNhd, Layout::kHnd}) {
    for (Layout dst : {Layout::kNhd, Layout::kHnd}) {
      const std::string lay = std::string(layout_name(src)) + "_to_" + layout_name(dst);
      out.push_back({"h8_tp4_to_2_" + lay, 8, {4, kOneStage, src}, {2, kOneStage, dst}});
      out.push_back({"h8_tp2_to_4_" + lay, 8, {2, kOneStage, src}, {4, kOneStage, dst}});
      out.push_back({"h2_tp1_to_4_" + lay, 2, {1, kOneStage, src}, {4, kOneStage, dst}});
      out.push_back({"h2_tp4_to_8_" + lay, 2, {4, kOneStage, src}, {8, kOneStage, dst}});
      out.push_back({"h8_tp2_to_2_" + lay, 8, {2, kOneStage, src}, {2, kOneStage, dst}});
    }
    const std::string l = layout_name(src);
    out.push_back({"mla_tp2_to_4_" + l, 1, {2, kOneStage, src}, {4, kOneStage, src}, true});
    out.push_back({"mla_tp4_to_2_" + l, 1, {4, kOneStage, src}, {2, kOneStage, src}, true});
    out.push_back({"pp2_to_pp1_h8_tp2_to_4_" + l, 8, {2, kTwoStages, src}, {4, kOneStage, src}});
    out.push_back({"pp1_to_pp2_h4_tp4_to_1_" + l, 4, {4, kOneStage, src}, {1, kTwoStages, src}});
    out.push_back(
        {"staging_h2_tp1_to_4_" + l, 2, {1, kOneStage, src}, {4, kOneStage, src}, false, true});
    out.push_back(
        {"staging_h8_tp4_to_2_" + l, 8, {4, kOneStage, src}, {2, kOneStage, src}, false, true});
    out.push_back(
        {"staging_mla_tp2_to_4_" + l, 1, {2, kOneStage, src}, {4, kOneStage, src}, true, true});
    out.push_back({"contiguous_h8_tp2_to_2_" + l,
                   8,
                   {2, kOneStage, src},
                   {2, kOneStage, src},
                   false,
                   false,
                   true});
    // Consecutive pages that must not merge: only part of each page moves.
    out.push_back({"contiguous_h8_tp2_to_4_" + l,
                   8,
                   {2, kOneStage, src},
                   {4, kOneStage, src},
                   false,
                   false,
                   true});
    out.push_back({"staging_contiguous_h8_tp2_to_2_" + l,
                   8,
                   {2, kOneStage, src},
                   {2, kOneStage, src},
                   false,
                   true,
                   true});
  }
  return out;
}

// Printing the name makes CTest list each case by it.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

INSTANTIATE_TEST_SUITE_P(Matrix, PlannerByteExact, ::testing::ValuesIn(cases()));

}  // namespace
}  // namespace pdkv

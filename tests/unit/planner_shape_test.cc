// Fragment counts derived by hand, the template cache, and every planner refusal.
#include <gtest/gtest.h>

#include <vector>

#include "pdkv/plan.h"

namespace pdkv {
namespace {

// 8 heads, head_dim 3 x 2 bytes = 6 B per head vector, 4 tokens per page, 2 layers.
KvSpec spec(Layout layout) { return KvSpec{8, 3, 2, 4, 2, 16, layout, false}; }

RankShard shard(Layout layout, uint32_t tp, uint32_t rank) {
  return {spec(layout), AxisSharding::even(8, tp).value().owned(rank).value(), {0, 2}};
}

const Segment kAllLayers{0, 0, 0, 0, 2};
const std::vector<uint64_t> kPages = {3, 9, 1, 4, 12};

// TP 2 -> 4 under NHD, the route of decode rank 1 (source heads 2-3).
TransferPlan nhd_half_rows(Planner& planner) {
  return planner
      .plan(shard(Layout::kNhd, 2, 0), shard(Layout::kNhd, 4, 1), {{0, 1, 2, 0, 2}, kAllLayers},
            kPages, kPages)
      .value();
}

TEST(PlannerShape, NhdHalfRowsOneFragmentPerToken) {
  // TP 2 -> 4, decode 1 takes source heads 2-3: 12 B per token, contiguous on
  // the decode side (its whole row) but strided on the prefill side (24 B rows).
  Planner planner;
  const TransferPlan plan = nhd_half_rows(planner);
  EXPECT_EQ(plan.page_template()->pieces.size(), 4u);  // one per token
  EXPECT_EQ(plan.fragment_count(), 2u * 2 * 5 * 4);    // layers x K/V x pages x tokens
  EXPECT_EQ(plan.uncoalesced_fragment_count(), 2u * 2 * 5 * 4 * 2);
  EXPECT_EQ(plan.bytes(), 2u * 2 * 5 * 4 * 12);
  const Fragment f = plan.fragment(1);  // layer 0, K, first page, token 1
  EXPECT_EQ(f.src_buffer, 0u);
  EXPECT_EQ(f.src_offset, 3u * 96 + 1 * 24 + 12);  // page 3 of 96 B, token 1, head 2
  EXPECT_EQ(f.dst_offset, 3u * 48 + 1 * 12);
  EXPECT_EQ(f.length, 12u);
  EXPECT_EQ(f.staging_offset, 12u);
  const Fragment last = plan.fragment(plan.fragment_count() - 1);  // layer 1, V, page 12, token 3
  EXPECT_EQ(last.src_buffer, 3u);
  EXPECT_EQ(last.dst_offset, 12u * 48 + 3 * 12);
  EXPECT_EQ(last.staging_offset + last.length, plan.bytes());
}

TEST(PlannerShape, StagingPaysWhenTheWritesItSavesCostMoreThanTheDestinationsScatters) {
  // The NHD plan above: 80 fragments, 960 bytes. Staging saves 79 writes and
  // costs the destination a scatter of 960 bytes for each source it stages:
  // with one source it pays above 960 / 79 = 12.2 bytes of overhead per
  // write, with two above 1920 / 79 = 24.3, with four above 3840 / 79 = 48.6.
  Planner planner;
  const TransferPlan plan = nhd_half_rows(planner);
  ASSERT_EQ(plan.fragment_count(), 80u);
  ASSERT_EQ(plan.bytes(), 960u);
  EXPECT_FALSE(staging_pays(plan, 0, 1));
  EXPECT_FALSE(staging_pays(plan, 12, 1));                         // 79 x 12 = 948 < 960
  EXPECT_TRUE(staging_pays(plan, 13, 1));                          // 79 x 13 = 1027 > 960
  EXPECT_TRUE(staging_pays(plan, 13, 0));                          // no sources counts as one
  EXPECT_FALSE(staging_pays(plan, 24, 2));                         // 79 x 24 = 1896 < 1920
  EXPECT_TRUE(staging_pays(plan, 25, 2));                          // 79 x 25 = 1975 > 1920
  EXPECT_FALSE(staging_pays(plan, 48, 4));                         // 79 x 48 = 3792 < 3840
  EXPECT_TRUE(staging_pays(plan, 49, 4));                          // 79 x 49 = 3871 > 3840
  EXPECT_TRUE(staging_pays(plan, uint64_t{1} << 62, UINT32_MAX));  // no overflow
}

TEST(PlannerShape, HndOneFragmentPerPage) {
  // Head-major: heads 2-3 of a page are 2 x 4 rows = 48 contiguous bytes.
  Planner planner;
  auto plan = planner
                  .plan(shard(Layout::kHnd, 2, 0), shard(Layout::kHnd, 4, 1),
                        {{0, 1, 2, 0, 2}, kAllLayers}, kPages, kPages)
                  .value();
  ASSERT_EQ(plan.page_template()->pieces.size(), 1u);
  EXPECT_FALSE(plan.page_template()->whole_page);  // not the whole prefill page
  EXPECT_EQ(plan.fragment_count(), 2u * 2 * 5);
  const Fragment f = plan.fragment(0);
  EXPECT_EQ(f.src_offset, 3u * 96 + 2 * 4 * 6);
  EXPECT_EQ(f.length, 48u);
}

TEST(PlannerShape, WholePagesMergeIntoRuns) {
  // Equal TP moves whole pages; consecutive on both sides become one fragment.
  Planner planner;
  const RankShard s = shard(Layout::kNhd, 2, 1), d = shard(Layout::kNhd, 2, 1);
  const Route route{{1, 1, 0, 0, 4}, kAllLayers};
  auto contiguous = planner
                        .plan(s, d, route, std::vector<uint64_t>{0, 1, 2, 3, 4},
                              std::vector<uint64_t>{0, 1, 2, 3, 4})
                        .value();
  EXPECT_EQ(contiguous.fragment_count(), 2u * 2 * 1);
  EXPECT_EQ(contiguous.fragment(0).length, 5u * 96);
  auto two_runs = planner
                      .plan(s, d, route, std::vector<uint64_t>{0, 1, 2, 3, 4},
                            std::vector<uint64_t>{3, 4, 5, 0, 1})
                      .value();
  EXPECT_EQ(two_runs.fragment_count(), 2u * 2 * 2);
  EXPECT_EQ(two_runs.fragment(1).src_offset, 3u * 96);
  EXPECT_EQ(two_runs.fragment(1).dst_offset, 0u);
  EXPECT_EQ(two_runs.fragment(1).length, 2u * 96);
  EXPECT_EQ(two_runs.fragment(1).staging_offset, 3u * 96);
  EXPECT_EQ(two_runs.uncoalesced_fragment_count(), 2u * 2 * 5 * 4 * 4);
}

TEST(PlannerShape, ForEachVisitsFragmentIInOrder) {
  // Two ways to enumerate one plan: the nested walk and the index arithmetic.
  Planner planner;
  for (Layout layout : {Layout::kNhd, Layout::kHnd}) {
    auto plan = planner
                    .plan(shard(layout, 2, 0), shard(Layout::kNhd, 4, 1),
                          {{0, 1, 2, 0, 2}, {0, 0, 1, 1, 1}}, kPages, kPages)
                    .value();
    uint64_t i = 0, staging = 0;
    plan.for_each([&](const Fragment& f) {
      EXPECT_EQ(f, plan.fragment(i)) << "fragment " << i;
      EXPECT_EQ(f.staging_offset, staging);
      staging += f.length;
      ++i;
    });
    EXPECT_EQ(i, plan.fragment_count());
    EXPECT_EQ(staging, plan.bytes());
  }
}

TEST(PlannerShape, EmptyPageListIsAnEmptyPlan) {
  Planner planner;
  auto plan = planner
                  .plan(shard(Layout::kNhd, 2, 0), shard(Layout::kNhd, 2, 0),
                        {{0, 0, 0, 0, 4}, kAllLayers}, {}, {})
                  .value();
  EXPECT_EQ(plan.fragment_count(), 0u);
  EXPECT_EQ(plan.bytes(), 0u);
}

TEST(PlannerCache, TemplateBuiltOncePerShape) {
  Planner planner;
  const Route route{{0, 1, 2, 0, 2}, kAllLayers};
  auto a = planner.plan(shard(Layout::kNhd, 2, 0), shard(Layout::kNhd, 4, 1), route, kPages, kPages)
               .value();
  const std::vector<uint64_t> other = {0, 2};
  auto b = planner.plan(shard(Layout::kNhd, 2, 0), shard(Layout::kNhd, 4, 1), route, other, other)
               .value();
  EXPECT_EQ(a.page_template().get(), b.page_template().get());
  EXPECT_EQ(planner.cached_templates(), 1u);
  auto c = planner.plan(shard(Layout::kHnd, 2, 0), shard(Layout::kNhd, 4, 1), route, other, other)
               .value();
  EXPECT_NE(c.page_template().get(), a.page_template().get());
  EXPECT_EQ(planner.cached_templates(), 2u);
}

class PlannerErrors : public ::testing::Test {
 protected:
  Status plan(const RankShard& s, const RankShard& d, const Route& r,
              const std::vector<uint64_t>& sp, const std::vector<uint64_t>& dp) {
    return planner_.plan(s, d, r, sp, dp).status();
  }
  RankShard src_ = shard(Layout::kNhd, 2, 0);
  RankShard dst_ = shard(Layout::kNhd, 4, 1);
  Route route_{{0, 1, 2, 0, 2}, kAllLayers};
  Planner planner_;
};

TEST_F(PlannerErrors, PageListLengthsDiffer) {
  EXPECT_EQ(plan(src_, dst_, route_, {1, 2, 3}, {1, 2}).message(),
            "page lists differ in length: prefill sends 3 pages, decode offers 2");
}

TEST_F(PlannerErrors, PageBeyondPool) {
  const Status st = plan(src_, dst_, route_, {1, 2}, {1, 16});
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(st.message(), "decode page list entry 1 is page 16, but the pool has 16 pages");
}

TEST_F(PlannerErrors, DuplicateDestinationPage) {
  EXPECT_EQ(plan(src_, dst_, route_, {1, 2}, {5, 5}).message(),
            "destination page 5 is listed twice: two tokens would land in one page");
}

TEST_F(PlannerErrors, RouteNamesDifferentGlobalHeads) {
  // The drift bug: source offset 0 (global head 0) into decode 1's slot 0 (global head 2).
  const Status st = plan(src_, dst_, {{0, 1, 0, 0, 2}, kAllLayers}, {1}, {1});
  EXPECT_EQ(st.message(), "route sends global heads 0 into the slot of global heads 2");
}

TEST_F(PlannerErrors, RouteBeyondOwnedHeads) {
  EXPECT_EQ(plan(src_, dst_, {{0, 1, 3, 0, 2}, kAllLayers}, {1}, {1}).message(),
            "route reads source heads [3, 5) but the rank owns 4");
  EXPECT_EQ(plan(src_, dst_, {{0, 1, 2, 1, 2}, kAllLayers}, {1}, {1}).message(),
            "route writes destination heads [1, 3) but the rank owns 2");
}

TEST_F(PlannerErrors, RouteBeyondOwnedLayers) {
  EXPECT_EQ(plan(src_, dst_, {route_.heads, {0, 0, 1, 1, 2}}, {1}, {1}).message(),
            "route reads source layers [1, 3) but the rank owns 2");
}

TEST_F(PlannerErrors, IncompatibleSpecs) {
  dst_.spec.dtype_bytes = 4;
  EXPECT_EQ(plan(src_, dst_, route_, {1}, {1}).message(),
            "KvSpec.dtype_bytes differs: prefill has 2, decode has 4");
  dst_.spec.page_size = 0;
  EXPECT_EQ(plan(src_, dst_, route_, {1}, {1}).message(),
            "decode spec: KvSpec.page_size is 0; it must be at least 1");
}

TEST_F(PlannerErrors, StagingBuffersTooSmall) {
  auto p = planner_.plan(src_, dst_, route_, kPages, kPages).value();
  std::vector<std::vector<std::byte>> pool(4, std::vector<std::byte>(16 * 96));
  std::vector<std::span<const std::byte>> in(pool.begin(), pool.end());
  std::vector<std::byte> staging(p.bytes() - 1);
  EXPECT_EQ(gather(p, in, staging).message(),
            "staging buffer holds 959 bytes but the plan moves 960");
  staging.resize(p.bytes());
  EXPECT_EQ(gather(p, std::span(in).first(3), staging).message(),
            "source has 3 buffers but the plan touches buffer 3");
  in[2] = std::span<const std::byte>(pool[2]).first(96 * 12);
  EXPECT_EQ(gather(p, in, staging).message(),
            "source buffer 2 holds 1152 bytes but the plan reaches byte 1248");
  std::vector<std::vector<std::byte>> small(4, std::vector<std::byte>(48));
  std::vector<std::span<std::byte>> out(small.begin(), small.end());
  EXPECT_EQ(scatter(p, staging, out).message(),
            "destination buffer 0 holds 48 bytes but the plan reaches byte 624");
}

}  // namespace
}  // namespace pdkv

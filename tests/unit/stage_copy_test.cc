// The staging kernel's body (gpu/stage_copy.h) run on the host: every thread
// of a grid, one after another, for warp-wide and block-wide groups and
// grids smaller and larger than the work. The result must equal the host
// gather()/scatter() byte for byte, over whole buffers, so a fragment that
// no thread copies, or a stray write, fails here without a GPU.
#include "gpu/stage_copy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "pdkv/plan.h"
#include "support/route_case.h"

namespace pdkv {
namespace {

using testing::RouteCase;

constexpr unsigned kThreads = 256;

// Runs the grid: blocks x kThreads calls of stage_thread.
void run_grid(const TransferPlan& plan, std::vector<std::vector<std::byte>>& pool,
              std::vector<std::byte>& staging, bool gather, unsigned lanes, uint64_t blocks) {
  std::vector<uint64_t> table;
  for (auto& b : pool) table.push_back(reinterpret_cast<uint64_t>(b.data()));
  const PlanView view = plan.view();
  for (uint64_t block = 0; block < blocks; ++block) {
    for (unsigned t = 0; t < kThreads; ++t) {
      gpu::stage_thread(view, table.data(), reinterpret_cast<unsigned char*>(staging.data()),
                        gather, lanes, kThreads, block, blocks, t);
    }
  }
}

class StageCopy : public ::testing::TestWithParam<RouteCase> {};

TEST_P(StageCopy, EveryGridShapeMatchesTheHostGatherAndScatter) {
  const RouteCase& c = GetParam();
  std::mt19937_64 rng(c.heads * 131 + c.src_tp * 7 + c.dst_tp);
  // 7 elements x 2 B per head (14 B: not a multiple of 16, so byte copies
  // too), or a 576-wide latent; 4 tokens a page, 2 layers, 24 pages.
  const auto r = testing::route_shards(c, c.mla ? 576 : 7, 4, 2, 24);
  std::vector<uint64_t> src_pages(24), dst_pages(24);
  std::iota(src_pages.begin(), src_pages.end(), 0);
  std::iota(dst_pages.begin(), dst_pages.end(), 0);
  std::shuffle(src_pages.begin() + 6, src_pages.end(), rng);  // a run, then scattered pages
  std::shuffle(dst_pages.begin() + 6, dst_pages.end(), rng);
  src_pages.resize(15);
  dst_pages.resize(15);
  Planner planner;
  const TransferPlan plan = planner.plan(r.src, r.dst, r.route, src_pages, dst_pages).value();
  const uint32_t buffers = 2 * r.src.spec.buffers_per_layer();
  auto random_pool = [&](const RankShard& s) {
    std::vector<std::vector<std::byte>> pool(buffers);
    for (auto& b : pool) {
      b.resize(24 * s.spec.page_bytes(s.heads.count));
      for (auto& x : b) x = std::byte(rng() & 0xff);
    }
    return pool;
  };
  auto src = random_pool(r.src);
  const auto dst_before = random_pool(r.dst);

  std::vector<std::byte> want(plan.bytes());
  std::vector<std::span<const std::byte>> src_spans(src.begin(), src.end());
  ASSERT_TRUE(gather(plan, src_spans, want).is_ok());
  std::vector<std::byte> staged(plan.bytes());
  for (auto& b : staged) b = std::byte(rng() & 0xff);
  auto dst_want = dst_before;
  std::vector<std::span<std::byte>> dst_spans(dst_want.begin(), dst_want.end());
  ASSERT_TRUE(scatter(plan, staged, dst_spans).is_ok());

  const unsigned chosen = gpu::lanes_for(plan.view(), kThreads);
  for (unsigned lanes : {32u, kThreads, chosen}) {
    for (uint64_t blocks : {uint64_t{1}, uint64_t{3}, plan.fragment_count()}) {
      SCOPED_TRACE(::testing::Message() << lanes << " lanes, " << blocks << " blocks");
      std::vector<std::byte> got(plan.bytes(), std::byte{0});
      run_grid(plan, src, got, /*gather=*/true, lanes, blocks);
      EXPECT_TRUE(got == want);
      auto dst = dst_before;
      auto staging = staged;
      run_grid(plan, dst, staging, /*gather=*/false, lanes, blocks);
      for (uint32_t b = 0; b < buffers; ++b) EXPECT_TRUE(dst[b] == dst_want[b]) << "buffer " << b;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Plans, StageCopy, ::testing::ValuesIn(testing::kRouteCases),
                         [](const auto& info) { return std::string(info.param.name); });

// Whole pages merged into runs make fragments of several pages: the plan
// asks for a block per fragment, and 16-byte chunks are used.
TEST(StageCopyLanes, WholePageRunsTakeABlock) {
  const RouteCase same{"nhd_equal", Layout::kNhd, Layout::kNhd, 8, 1, 0, 1, 0, false};
  const auto r = testing::route_shards(same, 128, 16, 1, 64);
  std::vector<uint64_t> pages(64);
  std::iota(pages.begin(), pages.end(), 0);
  Planner planner;
  const TransferPlan plan = planner.plan(r.src, r.dst, r.route, pages, pages).value();
  EXPECT_EQ(plan.fragment_count(), 2u);  // K and V, each one run of 64 pages
  EXPECT_EQ(gpu::lanes_for(plan.view(), kThreads), kThreads);
  const TransferPlan small =
      planner.plan(r.src, r.dst, r.route, std::vector<uint64_t>{5}, std::vector<uint64_t>{9})
          .value();
  EXPECT_EQ(gpu::lanes_for(small.view(), kThreads), 32u);  // one 32 KiB page
}

}  // namespace
}  // namespace pdkv

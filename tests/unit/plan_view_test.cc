// PlanView, the arithmetic that the GPU staging kernels run: rebound to
// copies of a plan's runs and pieces (as the stager uploads them), it must
// give every fragment that the planner's own nested loops (for_each) give,
// and staging offsets that tile the staging buffer exactly.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "pdkv/plan.h"
#include "support/route_case.h"

namespace pdkv {
namespace {

using testing::RouteCase;

class PlanViewTest : public ::testing::TestWithParam<RouteCase> {};

TEST_P(PlanViewTest, CopiedViewMatchesTheNestedLoopsAndTilesStaging) {
  const auto r = testing::route_shards(GetParam(), 8, 4, 3, 32);
  // Two consecutive runs and scattered pages on each side.
  const std::vector<uint64_t> src_pages = {4, 5, 6, 20, 1, 9, 10, 31};
  const std::vector<uint64_t> dst_pages = {7, 8, 9, 2, 30, 11, 12, 0};
  Planner planner;
  const TransferPlan plan = planner.plan(r.src, r.dst, r.route, src_pages, dst_pages).value();

  // The upload: pieces, then runs, into one flat buffer; the view rebound.
  PlanView view = plan.view();
  std::vector<unsigned char> flat(view.piece_count * sizeof(TemplatePiece) +
                                  view.run_count * sizeof(PageRun));
  std::memcpy(flat.data(), view.pieces, view.piece_count * sizeof(TemplatePiece));
  std::memcpy(flat.data() + view.piece_count * sizeof(TemplatePiece), view.runs,
              view.run_count * sizeof(PageRun));
  std::vector<TemplatePiece> pieces(view.piece_count);
  std::vector<PageRun> runs(view.run_count);
  std::memcpy(pieces.data(), flat.data(), pieces.size() * sizeof(TemplatePiece));
  std::memcpy(runs.data(), flat.data() + pieces.size() * sizeof(TemplatePiece),
              runs.size() * sizeof(PageRun));
  view.pieces = pieces.data();
  view.runs = runs.data();

  ASSERT_EQ(view.fragment_count(), plan.fragment_count());
  uint64_t i = 0, next_staging = 0;
  plan.for_each([&](const Fragment& f) {
    EXPECT_EQ(fragment_at(view, i), f) << "fragment " << i;
    EXPECT_EQ(f.staging_offset, next_staging) << "fragment " << i;  // no gap, no overlap
    next_staging += f.length;
    ++i;
  });
  EXPECT_EQ(i, plan.fragment_count());
  EXPECT_EQ(next_staging, plan.bytes());
}

INSTANTIATE_TEST_SUITE_P(Plans, PlanViewTest, ::testing::ValuesIn(testing::kRouteCases),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace pdkv

// The worked cases of DESIGN §3, with expected values derived by hand.
#include "pdkv/sharding.h"

#include <gtest/gtest.h>

#include <vector>

namespace pdkv {
namespace {

std::vector<Segment> map_of(uint32_t heads, uint32_t src_tp, uint32_t dst_tp) {
  auto src = AxisSharding::even(heads, src_tp);
  auto dst = AxisSharding::even(heads, dst_tp);
  EXPECT_TRUE(src.is_ok()) << src.status().to_string();
  EXPECT_TRUE(dst.is_ok()) << dst.status().to_string();
  auto map = transfer_map(*src, *dst);
  EXPECT_TRUE(map.is_ok()) << map.status().to_string();
  return *map;
}

TEST(AxisSharding, EvenSplit) {
  auto s = AxisSharding::even(8, 4).value();
  EXPECT_EQ(s.owned(0).value(), (UnitRange{0, 2}));
  EXPECT_EQ(s.owned(3).value(), (UnitRange{6, 2}));
  EXPECT_EQ(s.owners(5), (UnitRange{2, 1}));
}

TEST(AxisSharding, GqaReplication) {
  // 2 heads over TP 4: ranks own heads [0, 0, 1, 1].
  auto s = AxisSharding::even(2, 4).value();
  EXPECT_EQ(s.owned(0).value(), (UnitRange{0, 1}));
  EXPECT_EQ(s.owned(1).value(), (UnitRange{0, 1}));
  EXPECT_EQ(s.owned(2).value(), (UnitRange{1, 1}));
  EXPECT_EQ(s.owned(3).value(), (UnitRange{1, 1}));
  EXPECT_EQ(s.owners(0), (UnitRange{0, 2}));
  EXPECT_EQ(s.owners(1), (UnitRange{2, 2}));
}

TEST(TransferMap, Heads8Tp4To2) {
  // Prefill owns {0,1},{2,3},{4,5},{6,7}; decode 0 owns 0-3, decode 1 owns 4-7.
  EXPECT_EQ(map_of(8, 4, 2), (std::vector<Segment>{
                                 {0, 0, 0, 0, 2},
                                 {1, 0, 0, 2, 2},
                                 {2, 1, 0, 0, 2},
                                 {3, 1, 0, 2, 2},
                             }));
}

TEST(TransferMap, Heads8Tp2To4) {
  // Decode d reads source offsets [0,2,0,2] from prefill [0,0,1,1].
  EXPECT_EQ(map_of(8, 2, 4), (std::vector<Segment>{
                                 {0, 0, 0, 0, 2},
                                 {0, 1, 2, 0, 2},
                                 {1, 2, 0, 0, 2},
                                 {1, 3, 2, 0, 2},
                             }));
}

TEST(TransferMap, Heads2Tp1To4GqaReplication) {
  // Decode ranks own heads [0,0,1,1], so the source offsets are [0,0,1,1];
  // a plain `d % heads` would give the wrong [0,1,0,1].
  EXPECT_EQ(map_of(2, 1, 4), (std::vector<Segment>{
                                 {0, 0, 0, 0, 1},
                                 {0, 1, 0, 0, 1},
                                 {0, 2, 1, 0, 1},
                                 {0, 3, 1, 0, 1},
                             }));
}

TEST(TransferMap, ReplicatedSourceUsesReplicaDModReplicas) {
  // 2 heads over prefill TP 4 (head 0 on ranks 0,1; head 1 on 2,3) to decode
  // TP 8 (head 0 on decode 0-3, head 1 on 4-7): writers alternate replicas.
  EXPECT_EQ(map_of(2, 4, 8), (std::vector<Segment>{
                                 {0, 0, 0, 0, 1},
                                 {0, 2, 0, 0, 1},
                                 {1, 1, 0, 0, 1},
                                 {1, 3, 0, 0, 1},
                                 {2, 4, 0, 0, 1},
                                 {2, 6, 0, 0, 1},
                                 {3, 5, 0, 0, 1},
                                 {3, 7, 0, 0, 1},
                             }));
}

TEST(TransferMap, EqualTpIsRankToRankWholeHeads) {
  EXPECT_EQ(map_of(8, 2, 2), (std::vector<Segment>{{0, 0, 0, 0, 4}, {1, 1, 0, 0, 4}}));
}

TEST(TransferMap, MlaIsOneUnitWholePagesFromDModPrefill) {
  // MLA has no head axis: model it as one unit, replicated everywhere.
  // Decode d is written by prefill d mod prefill_tp.
  EXPECT_EQ(map_of(1, 2, 4), (std::vector<Segment>{
                                 {0, 0, 0, 0, 1},
                                 {0, 2, 0, 0, 1},
                                 {1, 1, 0, 0, 1},
                                 {1, 3, 0, 0, 1},
                             }));
  EXPECT_EQ(map_of(1, 4, 2), (std::vector<Segment>{{0, 0, 0, 0, 1}, {1, 1, 0, 0, 1}}));
}

TEST(TransferMap, LayersPp2ToPp1) {
  auto src = AxisSharding::from_ranges(32, {{0, 16}, {16, 16}}).value();
  auto dst = AxisSharding::even(32, 1).value();
  EXPECT_EQ(transfer_map(src, dst).value(),
            (std::vector<Segment>{{0, 0, 0, 0, 16}, {1, 0, 0, 16, 16}}));
}

TEST(TransferMap, UnevenLayerRanges) {
  // Prefill stages own layers 0-9 and 10-31; decode stages 0-19 and 20-31.
  auto src = AxisSharding::from_ranges(32, {{0, 10}, {10, 22}}).value();
  auto dst = AxisSharding::from_ranges(32, {{0, 20}, {20, 12}}).value();
  EXPECT_EQ(transfer_map(src, dst).value(), (std::vector<Segment>{
                                                {0, 0, 0, 0, 10},
                                                {1, 0, 0, 10, 10},
                                                {1, 1, 10, 0, 12},
                                            }));
}

TEST(TransferMap, SegmentsOfOneRank) {
  auto map = map_of(8, 4, 2);
  EXPECT_EQ(segments_from(map, 1), (std::vector<Segment>{{1, 0, 0, 2, 2}}));
  EXPECT_EQ(segments_to(map, 1), (std::vector<Segment>{{2, 1, 0, 0, 2}, {3, 1, 0, 2, 2}}));
}

// Every refusal names the numbers involved.
void expect_error(const Status& st, StatusCode code, const std::string& text) {
  EXPECT_EQ(st.code(), code) << st.to_string();
  EXPECT_EQ(st.message(), text);
}

TEST(AxisShardingErrors, IndivisibleSplit) {
  expect_error(AxisSharding::even(8, 3, {"KV heads", "prefill TP"}).status(),
               StatusCode::kInvalidArgument,
               "8 KV heads cannot be split over prefill TP 3: 8 % 3 = 2 (the rank count must "
               "divide the KV heads, or be a multiple of them)");
}

TEST(AxisShardingErrors, IndivisibleReplication) {
  expect_error(AxisSharding::even(8, 12, {"KV heads", "decode TP"}).status(),
               StatusCode::kInvalidArgument,
               "decode TP 12 cannot replicate 8 KV heads: 12 % 8 = 4 (a rank count above the KV "
               "heads must be a multiple of them)");
}

TEST(AxisShardingErrors, ZeroSizes) {
  expect_error(AxisSharding::even(0, 4, {"KV heads", "decode TP"}).status(),
               StatusCode::kInvalidArgument,
               "0 KV heads to split over decode TP 4: need at least 1");
  expect_error(AxisSharding::even(8, 0, {"KV heads", "decode TP"}).status(),
               StatusCode::kInvalidArgument,
               "decode TP 0 cannot own 8 KV heads: need at least 1 rank");
}

TEST(AxisShardingErrors, RankBeyondSize) {
  auto s = AxisSharding::even(8, 4, {"KV heads", "prefill TP"}).value();
  expect_error(s.owned(4).status(), StatusCode::kOutOfRange,
               "prefill TP rank 4 does not exist: there are 4 ranks");
}

TEST(AxisShardingErrors, BadExplicitRanges) {
  AxisNames n{"layers", "prefill PP"};
  expect_error(AxisSharding::from_ranges(32, {{0, 16}, {17, 15}}, n).status(),
               StatusCode::kInvalidArgument,
               "prefill PP 1 starts at 17 but prefill PP 0 ends at 16: ranges of layers must be "
               "consecutive");
  expect_error(AxisSharding::from_ranges(32, {{0, 16}, {16, 0}}, n).status(),
               StatusCode::kInvalidArgument, "prefill PP 1 owns no layers (range [16, 16))");
  expect_error(AxisSharding::from_ranges(32, {{0, 16}, {16, 8}}, n).status(),
               StatusCode::kInvalidArgument,
               "prefill PP ranges cover 24 layers but the axis has 32");
  expect_error(AxisSharding::from_ranges(32, {{4, 28}}, n).status(), StatusCode::kInvalidArgument,
               "prefill PP 0 starts at layers 4; it must start at 0");
  expect_error(AxisSharding::from_ranges(32, {}, n).status(), StatusCode::kInvalidArgument,
               "no prefill PP ranges given for 32 layers");
}

TEST(TransferMapErrors, DifferentAxisLengths) {
  auto src = AxisSharding::even(8, 2, {"KV heads", "prefill TP"}).value();
  auto dst = AxisSharding::even(4, 2, {"KV heads", "decode TP"}).value();
  expect_error(transfer_map(src, dst).status(), StatusCode::kInvalidArgument,
               "the source shards 8 KV heads but the destination 4");
}

}  // namespace
}  // namespace pdkv

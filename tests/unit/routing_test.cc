// Links between two engines (engine/routing.h), worked out by hand: who
// writes each decode rank's aux slots (a rank of the last prefill stage,
// which holds the output token), and which idle prefill ranks hear of the
// room's engine from whom.
#include "engine/routing.h"

#include <gtest/gtest.h>

namespace pdkv::engine {
namespace {

proto::RankInfo rank(const std::string& engine, proto::Role role, uint32_t tp, uint32_t tp_size,
                     uint32_t pp, uint32_t pp_size, uint32_t heads, bool aux) {
  proto::RankInfo r;
  r.set_engine_id(engine);
  r.set_role(role);
  r.set_tp_rank(tp);
  r.set_tp_size(tp_size);
  r.set_pp_rank(pp);
  r.set_pp_size(pp_size);
  const uint32_t layers = 4 / pp_size;
  r.set_layer_first(pp * layers);
  r.set_layer_count(layers);
  kv_spec_to_proto(KvSpec{heads, 4, 2, 4, 4, 16, Layout::kNhd, false}, r.mutable_kv_spec());
  r.set_backend("loopback");
  if (aux) r.add_aux_item_bytes(16);
  r.set_aux_slots(aux ? 4 : 0);
  return r;
}

Topology topology(const std::string& engine, proto::Role role, uint32_t tp_size, uint32_t pp_size,
                  uint32_t heads, bool aux = true) {
  Topology t;
  for (uint32_t pp = 0; pp < pp_size; ++pp)
    for (uint32_t tp = 0; tp < tp_size; ++tp)
      t.ranks.push_back(rank(engine, role, tp, tp_size, pp, pp_size, heads, aux));
  return t;
}

// (src tp, src pp) -> (dst tp, dst pp) of every link writing aux, and whether it carries KV.
std::vector<std::tuple<RankKey, RankKey, bool>> aux_writers(const std::vector<Link>& links) {
  std::vector<std::tuple<RankKey, RankKey, bool>> out;
  for (const Link& l : links) {
    if (l.writes_aux) out.emplace_back(l.src, l.dst, l.kv.has_value());
  }
  return out;
}

TEST(Routing, AuxComesFromTheLastPrefillStageEvenWhereItSendsNoKv) {
  // 8 heads, prefill TP 2 x PP 2 -> decode TP 2 x PP 2 (layers 0-1 | 2-3 on
  // both). Decode stage 0 gets its KV from prefill stage 0 only, but its aux
  // from stage 1 (the output token is there): an aux-only link, from prefill
  // TP rank (decode rank index mod 2): decode (0,0) index 0 -> tp 0, (1,0)
  // index 1 -> tp 1. Decode stage 1 gets KV from prefill stage 1: tp 0 -> 0, 1 -> 1.
  auto links = compute_links(topology("p", proto::ROLE_PREFILL, 2, 2, 8),
                             topology("d", proto::ROLE_DECODE, 2, 2, 8));
  ASSERT_TRUE(links.is_ok()) << links.status().to_string();
  const auto writers = aux_writers(*links);
  const std::vector<std::tuple<RankKey, RankKey, bool>> expected = {{{0, 1}, {0, 0}, false},
                                                                    {{0, 1}, {0, 1}, true},
                                                                    {{1, 1}, {1, 0}, false},
                                                                    {{1, 1}, {1, 1}, true}};
  ASSERT_EQ(writers.size(), expected.size());
  for (const auto& w : expected) {
    EXPECT_NE(std::find(writers.begin(), writers.end(), w), writers.end())
        << "prefill (" << std::get<0>(w).tp << "," << std::get<0>(w).pp << ") -> decode ("
        << std::get<1>(w).tp << "," << std::get<1>(w).pp << ")";
  }
}

TEST(Routing, AuxWriterIsTheLowestTpOfTheLastStageThatSendsKv) {
  // 8 heads, prefill TP 4 -> decode TP 2: decode 0 <- prefill 0, 1; decode 1 <- 2, 3.
  auto links = compute_links(topology("p", proto::ROLE_PREFILL, 4, 1, 8),
                             topology("d", proto::ROLE_DECODE, 2, 1, 8));
  ASSERT_TRUE(links.is_ok());
  const auto writers = aux_writers(*links);
  ASSERT_EQ(writers.size(), 2u);
  EXPECT_EQ(std::get<0>(writers[0]), (RankKey{0, 0}));
  EXPECT_EQ(std::get<1>(writers[0]), (RankKey{0, 0}));
  EXPECT_EQ(std::get<0>(writers[1]), (RankKey{2, 0}));
  EXPECT_EQ(std::get<1>(writers[1]), (RankKey{1, 0}));
}

TEST(Routing, IdleSourcesHearOfTheEngineFromDecodeRanksInTurn) {
  // 2 heads, prefill TP 4 -> decode TP 1: head 0 on prefill 0, 1 and head 1
  // on 2, 3; decode 0 reads replica 0 of each group (prefill 0 and 2), so
  // prefill 1 and 3 are idle and decode 0 (the only one) tells both.
  const auto prefill = topology("p", proto::ROLE_PREFILL, 4, 1, 2, false);
  auto decode = topology("d", proto::ROLE_DECODE, 1, 1, 2, false);
  auto links = compute_links(prefill, decode).value();
  auto notices = engine_notices(prefill, decode, links);
  ASSERT_EQ(notices.size(), 2u);
  EXPECT_EQ(notices[0].idle_source, (RankKey{1, 0}));
  EXPECT_EQ(notices[1].idle_source, (RankKey{3, 0}));
  for (const auto& n : notices) EXPECT_EQ(n.teller, (RankKey{0, 0}));
  // Equal TP: nobody is idle.
  const auto p2 = topology("p", proto::ROLE_PREFILL, 2, 1, 8, false);
  const auto d2 = topology("d", proto::ROLE_DECODE, 2, 1, 8, false);
  EXPECT_TRUE(engine_notices(p2, d2, compute_links(p2, d2).value()).empty());
}

}  // namespace
}  // namespace pdkv::engine

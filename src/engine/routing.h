// Who talks to whom for one (prefill engine, decode engine) pair, derived
// from the two topologies with the one sharding helper. Both sides compute
// the same links from the same RankInfos, so a decode rank contacts exactly
// the prefill ranks that expect it.
#pragma once

#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pdkv.pb.h"
#include "pdkv/kv_spec.h"
#include "pdkv/plan.h"
#include "pdkv/sharding.h"
#include "pdkv/status.h"

namespace pdkv::engine {

// A rank inside one engine's dp group.
struct RankKey {
  uint32_t tp = 0;
  uint32_t pp = 0;
  auto operator<=>(const RankKey&) const = default;
};

std::string describe(const proto::RankInfo& rank);   // "decode-a dp 0 tp 1 pp 0"
std::string describe(const proto::RankRef& rank);    // the same, for a message's sender
proto::RankRef ref_of(const proto::RankInfo& rank);  // how messages name a rank

// Everything one prefill rank writes to one decode rank.
struct Link {
  RankKey src, dst;
  std::optional<Route> kv;  // heads x layers (absent when only state flows)
  // State channels x layers; absent without state data.
  std::optional<Segment> state_channels;
  std::optional<Segment> state_layers;
  // Exactly one source per decode rank writes its aux slots: a rank of the
  // last prefill stage (which holds the output token). A link may carry aux
  // alone.
  bool writes_aux = false;
};

// One engine's dp group as the routing sees it, ranks ordered by (pp, tp).
struct Topology {
  std::vector<proto::RankInfo> ranks;
  const proto::RankInfo& at(RankKey key) const;  // key must exist
  uint32_t tp_size() const { return ranks.front().tp_size(); }
  uint32_t pp_size() const { return ranks.front().pp_size(); }
};

KvSpec kv_spec_from_proto(const proto::KvSpec& spec);
void kv_spec_to_proto(const KvSpec& spec, proto::KvSpec* out);
// What a rank owns, for the planner.
RankShard shard_of(const proto::RankInfo& rank);

// Every link between the two engines. Errors: specs that cannot exchange KV
// (naming both values), aux or state shapes that differ, unsplittable axes.
Result<std::vector<Link>> compute_links(const Topology& prefill, const Topology& decode);

// A prefill rank with no link to any decode rank still has a room to
// conclude; when its Sender does not name the decode engine, one decode rank
// (`teller`, spread over the decode ranks) tells it which engine the room is
// bound for. Both sides compute the same list.
struct EngineNotice {
  RankKey idle_source;
  RankKey teller;
};
std::vector<EngineNotice> engine_notices(const Topology& prefill, const Topology& decode,
                                         const std::vector<Link>& links);

}  // namespace pdkv::engine

#include "engine/routing.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <set>

namespace pdkv::engine {
namespace {

Result<AxisSharding> layer_axis(const Topology& t, const char* role) {
  std::vector<UnitRange> stages;
  for (const auto& r : t.ranks) {
    if (r.tp_rank() == 0) stages.push_back({r.layer_first(), r.layer_count()});
  }
  return AxisSharding::from_ranges(t.ranks.front().kv_spec().num_layers(), std::move(stages),
                                   {"layers", fmt::format("{} PP stage", role)});
}

}  // namespace

std::string describe(const proto::RankInfo& r) {
  return fmt::format("{} dp {} tp {} pp {}", r.engine_id(), r.dp_rank(), r.tp_rank(), r.pp_rank());
}

std::string describe(const proto::RankRef& r) {
  return fmt::format("{} dp {} tp {} pp {}", r.engine_id(), r.dp_rank(), r.tp_rank(), r.pp_rank());
}

proto::RankRef ref_of(const proto::RankInfo& r) {
  proto::RankRef ref;
  ref.set_engine_id(r.engine_id());
  ref.set_dp_rank(r.dp_rank());
  ref.set_tp_rank(r.tp_rank());
  ref.set_pp_rank(r.pp_rank());
  ref.set_incarnation(r.incarnation());
  return ref;
}

const proto::RankInfo& Topology::at(RankKey key) const {
  return ranks[size_t{key.pp} * tp_size() + key.tp];
}

KvSpec kv_spec_from_proto(const proto::KvSpec& s) {
  return KvSpec{s.total_heads(),
                s.head_dim(),
                s.dtype_bytes(),
                s.page_size(),
                s.num_layers(),
                s.num_pages(),
                s.layout() == proto::LAYOUT_HND ? Layout::kHnd : Layout::kNhd,
                s.mla()};
}

void kv_spec_to_proto(const KvSpec& s, proto::KvSpec* out) {
  out->set_total_heads(s.total_heads);
  out->set_head_dim(s.head_dim);
  out->set_dtype_bytes(s.dtype_bytes);
  out->set_page_size(s.page_size);
  out->set_num_layers(s.num_layers);
  out->set_num_pages(s.num_pages);
  out->set_layout(s.layout == Layout::kHnd ? proto::LAYOUT_HND : proto::LAYOUT_NHD);
  out->set_mla(s.mla);
}

RankShard shard_of(const proto::RankInfo& r) {
  const KvSpec spec = kv_spec_from_proto(r.kv_spec());
  // Topologies come from the bootstrap service, which validated the sizes.
  const UnitRange heads =
      AxisSharding::even(spec.total_heads, r.tp_size()).value().owned(r.tp_rank()).value();
  return {spec, heads, {r.layer_first(), r.layer_count()}};
}

Result<std::vector<Link>> compute_links(const Topology& prefill, const Topology& decode) {
  const proto::RankInfo& p = prefill.ranks.front();
  const proto::RankInfo& d = decode.ranks.front();
  PDKV_RETURN_IF_ERROR(
      check_compatible(kv_spec_from_proto(p.kv_spec()), kv_spec_from_proto(d.kv_spec())));
  if (p.backend() != d.backend()) {
    return Status::invalid_argument(
        fmt::format("backend differs: prefill uses {}, decode uses {}", p.backend(), d.backend()));
  }
  if (!std::equal(p.aux_item_bytes().begin(), p.aux_item_bytes().end(), d.aux_item_bytes().begin(),
                  d.aux_item_bytes().end())) {
    return Status::invalid_argument(
        fmt::format("aux_item_bytes differ: prefill has [{}], decode has [{}]",
                    fmt::join(p.aux_item_bytes(), ", "), fmt::join(d.aux_item_bytes(), ", ")));
  }
  if (p.state().channels() != d.state().channels() ||
      p.state().channel_bytes() != d.state().channel_bytes()) {
    return Status::invalid_argument(
        fmt::format("state differs: prefill has {} channels x {} B, decode has {} channels x {} B",
                    p.state().channels(), p.state().channel_bytes(), d.state().channels(),
                    d.state().channel_bytes()));
  }
  const uint32_t heads = p.kv_spec().total_heads();
  PDKV_ASSIGN_OR_RETURN(auto p_heads,
                        AxisSharding::even(heads, prefill.tp_size(), {"KV heads", "prefill TP"}));
  PDKV_ASSIGN_OR_RETURN(auto d_heads,
                        AxisSharding::even(heads, decode.tp_size(), {"KV heads", "decode TP"}));
  PDKV_ASSIGN_OR_RETURN(auto p_layers, layer_axis(prefill, "prefill"));
  PDKV_ASSIGN_OR_RETURN(auto d_layers, layer_axis(decode, "decode"));
  PDKV_ASSIGN_OR_RETURN(auto head_map, transfer_map(p_heads, d_heads));
  PDKV_ASSIGN_OR_RETURN(auto layer_map, transfer_map(p_layers, d_layers));

  std::map<std::pair<RankKey, RankKey>, Link> links;
  for (const Segment& ls : layer_map) {
    for (const Segment& hs : head_map) {
      const RankKey src{hs.src_rank, ls.src_rank}, dst{hs.dst_rank, ls.dst_rank};
      Link& link = links[{src, dst}];
      link.src = src;
      link.dst = dst;
      link.kv = Route{hs, ls};
    }
    if (p.state().channels() == 0) continue;
    // State channels are their own axis: their rank pairs need not be the heads'.
    PDKV_ASSIGN_OR_RETURN(auto p_chan, AxisSharding::even(p.state().channels(), prefill.tp_size(),
                                                          {"state channels", "prefill TP"}));
    PDKV_ASSIGN_OR_RETURN(auto d_chan, AxisSharding::even(d.state().channels(), decode.tp_size(),
                                                          {"state channels", "decode TP"}));
    PDKV_ASSIGN_OR_RETURN(auto chan_map, transfer_map(p_chan, d_chan));
    for (const Segment& cs : chan_map) {
      const RankKey src{cs.src_rank, ls.src_rank}, dst{cs.dst_rank, ls.dst_rank};
      Link& link = links[{src, dst}];
      link.src = src;
      link.dst = dst;
      link.state_channels = cs;
      link.state_layers = ls;
    }
  }
  // Every decode rank gets its aux slot once, from the last prefill stage:
  // only that stage holds the output token (and logprobs). The writer is the
  // lowest TP rank of that stage that sends it KV anyway; when none does (a
  // decode stage fed by earlier prefill stages), a link carries aux alone,
  // from TP rank (decode rank index mod prefill TP).
  if (!p.aux_item_bytes().empty()) {
    const uint32_t last_stage = prefill.pp_size() - 1;
    for (size_t i = 0; i < decode.ranks.size(); ++i) {
      const RankKey dst{decode.ranks[i].tp_rank(), decode.ranks[i].pp_rank()};
      Link* writer = nullptr;
      for (auto& [key, link] : links) {
        if (link.dst == dst && link.src.pp == last_stage &&
            (writer == nullptr || link.src.tp < writer->src.tp)) {
          writer = &link;
        }
      }
      if (writer == nullptr) {
        const RankKey src{static_cast<uint32_t>(i % prefill.tp_size()), last_stage};
        writer = &links[{src, dst}];
        writer->src = src;
        writer->dst = dst;
      }
      writer->writes_aux = true;
    }
  }
  std::vector<Link> out;
  out.reserve(links.size());
  for (auto& [key, link] : links) out.push_back(link);
  return out;
}

std::vector<EngineNotice> engine_notices(const Topology& prefill, const Topology& decode,
                                         const std::vector<Link>& links) {
  std::set<RankKey> busy;
  for (const Link& link : links) busy.insert(link.src);
  std::vector<EngineNotice> out;
  size_t idle = 0;
  for (const proto::RankInfo& r : prefill.ranks) {
    const RankKey key{r.tp_rank(), r.pp_rank()};
    if (busy.count(key)) continue;
    const proto::RankInfo& teller = decode.ranks[idle++ % decode.ranks.size()];
    out.push_back({key, RankKey{teller.tp_rank(), teller.pp_rank()}});
  }
  return out;
}

}  // namespace pdkv::engine

#include "bootstrap/registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "pdkv/sharding.h"

namespace pdkv::bootstrap {
namespace {

const char* layout_text(proto::Layout l) { return l == proto::LAYOUT_HND ? "hnd" : "nhd"; }
const char* role_text(proto::Role r) { return r == proto::ROLE_DECODE ? "decode" : "prefill"; }

std::string rank_name(const proto::RankInfo& r) {
  return fmt::format("{} dp {} tp {} pp {}", r.engine_id(), r.dp_rank(), r.tp_rank(), r.pp_rank());
}

}  // namespace

Status check_same_engine(const proto::RankInfo& a, const proto::RankInfo& b) {
  auto differ = [&](const char* field, const auto& mine, const auto& theirs) {
    return Status::invalid_argument(fmt::format("{} registers {} {} but {} registered {}",
                                                rank_name(a), field, mine, rank_name(b), theirs));
  };
  const auto &x = a.kv_spec(), &y = b.kv_spec();
  if (x.page_size() != y.page_size()) return differ("page_size", x.page_size(), y.page_size());
  if (x.dtype_bytes() != y.dtype_bytes())
    return differ("dtype_bytes", x.dtype_bytes(), y.dtype_bytes());
  if (x.head_dim() != y.head_dim()) return differ("head_dim", x.head_dim(), y.head_dim());
  if (x.total_heads() != y.total_heads())
    return differ("total_heads", x.total_heads(), y.total_heads());
  if (x.num_layers() != y.num_layers()) return differ("num_layers", x.num_layers(), y.num_layers());
  if (x.layout() != y.layout())
    return differ("layout", layout_text(x.layout()), layout_text(y.layout()));
  if (x.mla() != y.mla()) return differ("mla", x.mla(), y.mla());
  if (a.backend() != b.backend()) return differ("backend", a.backend(), b.backend());
  if (a.tp_size() != b.tp_size()) return differ("tp_size", a.tp_size(), b.tp_size());
  if (a.pp_size() != b.pp_size()) return differ("pp_size", a.pp_size(), b.pp_size());
  if (a.dp_size() != b.dp_size()) return differ("dp_size", a.dp_size(), b.dp_size());
  if (a.role() != b.role()) return differ("role", role_text(a.role()), role_text(b.role()));
  if (!std::equal(a.aux_item_bytes().begin(), a.aux_item_bytes().end(), b.aux_item_bytes().begin(),
                  b.aux_item_bytes().end())) {
    return differ("aux_item_bytes", fmt::format("[{}]", fmt::join(a.aux_item_bytes(), ", ")),
                  fmt::format("[{}]", fmt::join(b.aux_item_bytes(), ", ")));
  }
  if (a.state().channels() != b.state().channels())
    return differ("state channels", a.state().channels(), b.state().channels());
  if (a.state().channel_bytes() != b.state().channel_bytes())
    return differ("state channel_bytes", a.state().channel_bytes(), b.state().channel_bytes());
  return Status::ok();
}

Result<Registry::Registered> Registry::register_rank(const proto::RankInfo& r, bool renewal) {
  if (r.engine_id().empty()) return Status::invalid_argument("registration without an engine_id");
  auto out_of = [&](const char* what, uint32_t rank, uint32_t size) {
    return Status::invalid_argument(
        fmt::format("{}: {} rank {} is outside {} size {}", rank_name(r), what, rank, what, size));
  };
  if (r.tp_rank() >= r.tp_size()) return out_of("tp", r.tp_rank(), r.tp_size());
  if (r.pp_rank() >= r.pp_size()) return out_of("pp", r.pp_rank(), r.pp_size());
  if (r.dp_rank() >= r.dp_size()) return out_of("dp", r.dp_rank(), r.dp_size());
  if (r.layer_count() == 0 || r.layer_first() + r.layer_count() > r.kv_spec().num_layers()) {
    return Status::invalid_argument(
        fmt::format("{}: layers [{}, {}) outside the model's {}", rank_name(r), r.layer_first(),
                    r.layer_first() + r.layer_count(), r.kv_spec().num_layers()));
  }
  if (r.control_address().empty()) {
    return Status::invalid_argument(fmt::format("{}: no control_address", rank_name(r)));
  }
  const uint64_t ranks = uint64_t{r.tp_size()} * r.pp_size() * r.dp_size();
  if (ranks > limits_.ranks_per_engine) {
    return Status::resource_exhausted(fmt::format(
        "{}: an engine of {} ranks (tp {} x pp {} x dp {}) is more than {} "
        "(Limits::ranks_per_engine)",
        rank_name(r), ranks, r.tp_size(), r.pp_size(), r.dp_size(), limits_.ranks_per_engine));
  }

  std::lock_guard lock(mu_);
  const GroupKey group_key{r.engine_id(), r.dp_rank()};
  if (groups_.count(group_key) == 0 && groups_.size() >= limits_.engines) {
    return Status::resource_exhausted(
        fmt::format("{}: {} engines (and dp ranks) are registered already (Limits::engines)",
                    rank_name(r), groups_.size()));
  }
  auto& group = groups_[group_key];
  const RankKey key{r.pp_rank(), r.tp_rank()};
  for (const auto& [other_key, other] : group) {
    if (other_key == key) continue;  // a restart may change anything of its own
    PDKV_RETURN_IF_ERROR(check_same_engine(r, other));
    if (other.pp_rank() == r.pp_rank() &&
        (other.layer_first() != r.layer_first() || other.layer_count() != r.layer_count())) {
      return Status::invalid_argument(fmt::format(
          "{} registers layers [{}, {}) but {} of the same stage has [{}, {})", rank_name(r),
          r.layer_first(), r.layer_first() + r.layer_count(), rank_name(other), other.layer_first(),
          other.layer_first() + other.layer_count()));
    }
  }
  if (auto held = group.find(key);
      renewal && held != group.end() && held->second.incarnation() != r.incarnation()) {
    return Status::failed_precondition(
        fmt::format("{}: incarnation {} renews, but incarnation {} registered since", rank_name(r),
                    r.incarnation(), held->second.incarnation()));
  }
  Registered result;
  if (auto held = group.find(key); held != group.end()) {
    result.replaced_incarnation = held->second.incarnation();
  }
  auto [it, inserted] = group.insert_or_assign(key, r);
  result.replaced = !inserted;
  return result;
}

Result<std::vector<proto::RankInfo>> Registry::topology(const std::string& engine_id,
                                                        uint32_t dp_rank) const {
  std::lock_guard lock(mu_);
  auto group = groups_.find({engine_id, dp_rank});
  if (group == groups_.end() || group->second.empty()) {
    return Status::not_found(
        fmt::format("no rank of engine '{}' dp {} has registered", engine_id, dp_rank));
  }
  const proto::RankInfo& any = group->second.begin()->second;
  const size_t expected = size_t{any.tp_size()} * any.pp_size();
  if (group->second.size() < expected) {
    return Status::unavailable(fmt::format("engine '{}' dp {}: {} of {} ranks registered",
                                           engine_id, dp_rank, group->second.size(), expected));
  }
  std::vector<proto::RankInfo> ranks;
  std::vector<UnitRange> stages;
  for (const auto& [key, info] : group->second) {
    ranks.push_back(info);
    if (std::get<1>(key) == 0) stages.push_back({info.layer_first(), info.layer_count()});
  }
  // The stages together must cover the model's layers exactly once.
  auto layers =
      AxisSharding::from_ranges(any.kv_spec().num_layers(), stages,
                                {"layers", std::string(role_text(any.role())) + " PP stage"});
  if (!layers.is_ok()) {
    return Status::invalid_argument(
        fmt::format("engine '{}' dp {}: {}", engine_id, dp_rank, layers.status().message()));
  }
  return ranks;
}

}  // namespace pdkv::bootstrap

// `pdkv plan`: which rank sends which heads to whom, and how many fragments
// that costs. Everything printed comes from the same sharding helper and
// planner the runtime uses; this file only formats.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "cli/command.h"
#include "pdkv/plan.h"
#include "pdkv/sharding.h"

namespace pdkv::cli {
namespace {

struct PlanOptions {
  std::optional<uint32_t> kv_heads;
  uint32_t prefill_tp = 1;
  uint32_t decode_tp = 1;
  bool mla = false;
  bool json = false;
  // Fragment statistics, printed only when --pages is given.
  std::optional<uint64_t> pages;
  uint32_t head_dim = 128;
  uint32_t page_size = 16;
  uint32_t layers = 1;
  uint32_t dtype_bytes = 2;
  std::string layout = "nhd";
  std::optional<std::string> decode_layout;
};

struct PairStats {
  Segment segment;
  uint64_t bytes = 0;
  uint64_t fragments_before = 0;
  uint64_t fragments_after = 0;
};

int fail(const Status& status) {
  std::fprintf(stderr, "pdkv plan: %s\n", status.message().c_str());
  return kExitInvalidInput;
}

// Fragment counts for every pair, with both page lists 0..pages-1 (the best
// case for coalescing: a real decode pool hands out scattered pages).
Result<std::vector<PairStats>> fragment_stats(const PlanOptions& o, uint32_t heads,
                                              const AxisSharding& src, const AxisSharding& dst,
                                              const std::vector<Segment>& map) {
  PDKV_ASSIGN_OR_RETURN(Layout src_layout, parse_layout(o.layout));
  PDKV_ASSIGN_OR_RETURN(Layout dst_layout, parse_layout(o.decode_layout.value_or(o.layout)));
  KvSpec spec{heads, o.head_dim, o.dtype_bytes, o.page_size, o.layers, *o.pages, src_layout, o.mla};
  PDKV_RETURN_IF_ERROR(spec.validate());
  KvSpec dst_spec = spec;
  dst_spec.layout = dst_layout;
  std::vector<uint64_t> pages(*o.pages);
  std::iota(pages.begin(), pages.end(), 0);
  const UnitRange all_layers{0, o.layers};
  const Segment layer_segment{0, 0, 0, 0, o.layers};

  Planner planner;
  std::vector<PairStats> out;
  for (const Segment& seg : map) {
    RankShard s{spec, src.owned(seg.src_rank).value(), all_layers};
    RankShard d{dst_spec, dst.owned(seg.dst_rank).value(), all_layers};
    PDKV_ASSIGN_OR_RETURN(TransferPlan plan,
                          planner.plan(s, d, {seg, layer_segment}, pages, pages));
    out.push_back({seg, plan.bytes(), plan.uncoalesced_fragment_count(), plan.fragment_count()});
  }
  return out;
}

void print_table(const PlanOptions& o, uint32_t heads, const AxisSharding& src,
                 const std::vector<Segment>& map, const std::vector<PairStats>* stats) {
  if (o.mla) {
    fmt::print("MLA (no head axis): prefill TP {} -> decode TP {}, whole pages\n", o.prefill_tp,
               o.decode_tp);
    fmt::print("{:>8} {:>8}\n", "src_rank", "dst_rank");
    for (const Segment& s : map) fmt::print("{:>8} {:>8}\n", s.src_rank, s.dst_rank);
  } else {
    fmt::print("{} KV heads: prefill TP {} -> decode TP {}\n", heads, o.prefill_tp, o.decode_tp);
    fmt::print("{:>8} {:>8} {:>8} {:>8} {:>9}  {}\n", "src_rank", "dst_rank", "src_head",
               "dst_head", "num_heads", "global heads");
    for (const Segment& s : map) {
      const uint32_t global = src.owned(s.src_rank).value().first + s.src_offset;
      fmt::print("{:>8} {:>8} {:>8} {:>8} {:>9}  [{}, {})\n", s.src_rank, s.dst_rank, s.src_offset,
                 s.dst_offset, s.count, global, global + s.count);
    }
  }
  if (stats == nullptr) return;
  fmt::print(
      "\nfragments for {} pages x {} tokens, {} layers x {}, {} -> {}, {} B per head vector\n",
      *o.pages, o.page_size, o.layers, o.mla ? "latent" : "K+V", o.layout,
      o.decode_layout.value_or(o.layout), uint64_t{o.head_dim} * o.dtype_bytes);
  fmt::print("{:>8} {:>8} {:>14} {:>12} {:>12} {:>16}\n", "src_rank", "dst_rank", "bytes",
             "frags before", "frags after", "avg bytes after");
  for (const PairStats& p : *stats) {
    fmt::print("{:>8} {:>8} {:>14} {:>12} {:>12} {:>16}\n", p.segment.src_rank, p.segment.dst_rank,
               p.bytes, p.fragments_before, p.fragments_after,
               p.fragments_after ? p.bytes / p.fragments_after : 0);
  }
}

void print_json(const PlanOptions& o, const std::vector<Segment>& map,
                const std::vector<PairStats>* stats) {
  // ordered_json keeps the documented key order.
  nlohmann::ordered_json doc;
  doc["segments"] = nlohmann::ordered_json::array();
  for (const Segment& s : map) {
    nlohmann::ordered_json seg;
    seg["src_rank"] = s.src_rank;
    seg["dst_rank"] = s.dst_rank;
    seg["src_head"] = o.mla ? 0 : s.src_offset;
    seg["dst_head"] = o.mla ? 0 : s.dst_offset;
    seg["num_heads"] = o.mla ? 0 : s.count;
    if (o.mla) seg["whole_page"] = true;
    doc["segments"].push_back(seg);
  }
  if (stats != nullptr) {
    doc["fragments"] = nlohmann::ordered_json::array();
    for (const PairStats& p : *stats) {
      nlohmann::ordered_json f;
      f["src_rank"] = p.segment.src_rank;
      f["dst_rank"] = p.segment.dst_rank;
      f["bytes"] = p.bytes;
      f["fragments_before"] = p.fragments_before;
      f["fragments_after"] = p.fragments_after;
      doc["fragments"].push_back(f);
    }
  }
  std::printf("%s\n", doc.dump().c_str());
}

int run_plan(const PlanOptions& o) {
  if (o.mla && o.kv_heads.value_or(1) != 1) {
    return fail(Status::invalid_argument(fmt::format(
        "--kv-heads {} with --mla: MLA has no head axis; give --kv-heads 1 or leave it out",
        *o.kv_heads)));
  }
  if (!o.mla && !o.kv_heads) {
    return fail(Status::invalid_argument("--kv-heads is required (or --mla)"));
  }
  const uint32_t heads = o.mla ? 1 : *o.kv_heads;
  auto src = AxisSharding::even(heads, o.prefill_tp, {"KV heads", "prefill TP"});
  if (!src.is_ok()) return fail(src.status());
  auto dst = AxisSharding::even(heads, o.decode_tp, {"KV heads", "decode TP"});
  if (!dst.is_ok()) return fail(dst.status());
  auto map = transfer_map(*src, *dst);
  if (!map.is_ok()) return fail(map.status());

  std::optional<std::vector<PairStats>> stats;
  if (o.pages) {
    auto computed = fragment_stats(o, heads, *src, *dst, *map);
    if (!computed.is_ok()) return fail(computed.status());
    stats = std::move(computed).value();
  }
  const std::vector<PairStats>* stats_ptr = stats ? &*stats : nullptr;
  if (o.json) {
    print_json(o, *map, stats_ptr);
  } else {
    print_table(o, heads, *src, *map, stats_ptr);
  }
  return kExitOk;
}

}  // namespace

Command add_plan_command(CLI::App& app) {
  auto o = std::make_shared<PlanOptions>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Print the transfer map (which prefill rank sends which heads to which decode rank)");
  cmd->add_option("--kv-heads", o->kv_heads, "Total KV heads of the model")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--prefill-tp", o->prefill_tp, "Prefill tensor-parallel size")
      ->required()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--decode-tp", o->decode_tp, "Decode tensor-parallel size")
      ->required()
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--mla", o->mla, "MLA cache: one latent vector per token, never sliced");
  cmd->add_flag("--json", o->json, "Machine-readable output");
  cmd->add_option("--pages", o->pages, "Also plan fragments for a request of this many pages")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--head-dim", o->head_dim, "Elements per head vector")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--page-size", o->page_size, "Tokens per page")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--layers", o->layers, "Model layers")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--dtype-bytes", o->dtype_bytes, "Bytes per element")->capture_default_str();
  cmd->add_option("--layout", o->layout, "Pool layout: nhd or hnd (both sides)")
      ->capture_default_str()
      ->check(CLI::IsMember({"nhd", "hnd"}));
  cmd->add_option("--decode-layout", o->decode_layout, "Decode pool layout, if unlike --layout")
      ->check(CLI::IsMember({"nhd", "hnd"}));
  return {cmd, [o] { return run_plan(*o); }};
}

}  // namespace pdkv::cli

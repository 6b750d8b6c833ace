// The planner over random shapes and page lists, checked byte for byte
// against the oracle (worker/kv_pattern.h, written from the layouts, never
// from the planner): every decode byte is the element the request's page
// holds, or untouched. A wrong byte, a crash or UB ends the run.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <span>
#include <vector>

#include "pdkv/plan.h"
#include "pdkv/sharding.h"
#include "support/kv_oracle.h"
#include "support/plan_copy.h"

namespace {

using namespace pdkv;

struct Rank {
  RankShard shard;
  std::vector<std::vector<std::byte>> buffers;
};

// Stages over `layers`: cut points drawn from the input.
std::vector<UnitRange> stages(FuzzedDataProvider& in, uint32_t layers) {
  const uint32_t n = in.ConsumeIntegralInRange<uint32_t>(1, std::min(layers, 3u));
  std::vector<uint32_t> cuts;
  for (uint32_t i = 1; i < n; ++i)
    cuts.push_back(in.ConsumeIntegralInRange<uint32_t>(1, layers - 1));
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<UnitRange> out;
  uint32_t first = 0;
  for (uint32_t c : cuts) {
    out.push_back({first, c - first});
    first = c;
  }
  out.push_back({first, layers - first});
  return out;
}

std::vector<Rank> ranks(const KvSpec& spec, const AxisSharding& heads, uint32_t tp,
                        const std::vector<UnitRange>& pp, bool decode) {
  std::vector<Rank> out;
  for (const UnitRange& layers : pp) {
    for (uint32_t t = 0; t < tp; ++t) {
      Rank r;
      r.shard.spec = spec;
      r.shard.heads = heads.owned(t).value();
      r.shard.layers = layers;
      const uint64_t bytes = spec.num_pages * spec.page_bytes(r.shard.heads.count);
      const uint32_t id = static_cast<uint32_t>(out.size());
      for (uint32_t b = 0; b < layers.count * spec.buffers_per_layer(); ++b) {
        std::vector<std::byte> buf(bytes);
        for (uint64_t o = 0; decode && o < bytes; ++o) {
          buf[o] = std::byte{worker::untouched_byte(id, b, o)};
        }
        r.buffers.push_back(std::move(buf));
      }
      out.push_back(std::move(r));
    }
  }
  return out;
}

std::vector<uint64_t> pages(FuzzedDataProvider& in, uint64_t pool, uint64_t n) {
  std::vector<uint64_t> all(pool);
  std::iota(all.begin(), all.end(), 0);
  for (uint64_t i = 0; i + 1 < pool; ++i) {
    std::swap(all[i], all[in.ConsumeIntegralInRange<uint64_t>(i, pool - 1)]);
  }
  all.resize(n);
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const bool mla = in.ConsumeBool();
  const uint32_t heads = mla ? 1 : in.ConsumeIntegralInRange<uint32_t>(1, 8);
  const uint32_t layers = in.ConsumeIntegralInRange<uint32_t>(1, 4);
  const uint64_t pool = in.ConsumeIntegralInRange<uint64_t>(1, 8);
  KvSpec src_spec{heads,
                  in.ConsumeIntegralInRange<uint32_t>(1, 3),
                  in.ConsumeIntegralInRange<uint32_t>(1, 2),
                  in.ConsumeIntegralInRange<uint32_t>(1, 4),
                  layers,
                  pool,
                  in.ConsumeBool() ? Layout::kHnd : Layout::kNhd,
                  mla};
  KvSpec dst_spec = src_spec;
  dst_spec.layout = in.ConsumeBool() ? Layout::kHnd : Layout::kNhd;
  const uint32_t p_tp = in.ConsumeIntegralInRange<uint32_t>(1, 8);
  const uint32_t d_tp = in.ConsumeIntegralInRange<uint32_t>(1, 8);
  auto p_heads = AxisSharding::even(heads, p_tp);
  auto d_heads = AxisSharding::even(heads, d_tp);
  if (!p_heads.is_ok() || !d_heads.is_ok()) return 0;  // a shape that can never work
  const auto p_pp = stages(in, layers), d_pp = stages(in, layers);
  const bool staging = in.ConsumeBool();
  const uint64_t n = in.ConsumeIntegralInRange<uint64_t>(1, pool);
  const auto src_pages = pages(in, pool, n), dst_pages = pages(in, pool, n);

  auto prefill = ranks(src_spec, *p_heads, p_tp, p_pp, false);
  auto decode = ranks(dst_spec, *d_heads, d_tp, d_pp, true);
  for (Rank& r : prefill) {
    worker::for_each_element(
        r.shard.spec, r.shard.heads, r.shard.layers, src_pages, 0,
        [&](uint32_t b, uint64_t o, uint8_t v) { r.buffers[b][o] = std::byte{v}; });
  }
  const auto head_map = transfer_map(*p_heads, *d_heads).value();
  const auto layer_map = transfer_map(AxisSharding::from_ranges(layers, p_pp).value(),
                                      AxisSharding::from_ranges(layers, d_pp).value())
                             .value();
  Planner planner;
  for (const Segment& hs : head_map) {
    for (const Segment& ls : layer_map) {
      Rank& src = prefill[ls.src_rank * p_tp + hs.src_rank];
      Rank& dst = decode[ls.dst_rank * d_tp + hs.dst_rank];
      auto plan = planner.plan(src.shard, dst.shard, {hs, ls}, src_pages, dst_pages);
      if (!plan.is_ok()) __builtin_trap();  // every route of a valid map must plan
      if (!testing::copy_plan(*plan, src.buffers, dst.buffers, staging).is_ok()) __builtin_trap();
    }
  }
  for (uint32_t id = 0; id < decode.size(); ++id) {
    const Rank& r = decode[id];
    std::vector<size_t> sizes;
    for (const auto& b : r.buffers) sizes.push_back(b.size());
    const auto expected = testing::expected_image(id, r.shard, sizes, dst_pages);
    for (uint32_t b = 0; b < r.buffers.size(); ++b) {
      if (std::memcmp(expected[b].data(), r.buffers[b].data(), expected[b].size()) != 0) {
        __builtin_trap();  // a decode byte the oracle does not expect
      }
    }
  }
  return 0;
}

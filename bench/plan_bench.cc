// Plan construction for one 32k-token request of a 64-layer model, nhd,
// prefill TP 1 -> decode TP 4 (8 KV heads, head_dim 128, bf16): the case
// where every decode rank takes a quarter of every token row, so nothing
// merges across tokens. Page lists are shuffled, as a busy pool hands them out.
//   build/bin/pdkv_plan_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "pdkv/plan.h"

namespace {

constexpr uint32_t kTokens = 32768, kLayers = 64, kHeads = 8, kHeadDim = 128;

struct Setup {
  pdkv::RankShard src, dst;
  pdkv::Route route;
  std::vector<uint64_t> src_pages, dst_pages;
};

Setup make_setup(uint32_t page_size) {
  const uint64_t pages = kTokens / page_size;
  const pdkv::KvSpec spec{kHeads,    kHeadDim,           2,    page_size, kLayers,
                          2 * pages, pdkv::Layout::kNhd, false};
  auto src_axis = pdkv::AxisSharding::even(kHeads, 1).value();
  auto dst_axis = pdkv::AxisSharding::even(kHeads, 4).value();
  const auto map = pdkv::transfer_map(src_axis, dst_axis).value();
  Setup s;
  s.route = {map[1], {0, 0, 0, 0, kLayers}};  // prefill 0 -> decode 1: heads 2-3
  s.src = {spec, src_axis.owned(0).value(), {0, kLayers}};
  s.dst = {spec, dst_axis.owned(1).value(), {0, kLayers}};
  std::vector<uint64_t> all(2 * pages);
  std::iota(all.begin(), all.end(), 0);
  std::mt19937 rng(7);
  std::shuffle(all.begin(), all.end(), rng);
  s.src_pages.assign(all.begin(), all.begin() + pages);
  std::shuffle(all.begin(), all.end(), rng);
  s.dst_pages.assign(all.begin(), all.begin() + pages);
  return s;
}

void report(benchmark::State& state, const pdkv::TransferPlan& plan) {
  state.counters["fragments"] = static_cast<double>(plan.fragment_count());
  state.counters["MB"] = static_cast<double>(plan.bytes()) / 1e6;
}

// A fresh planner every time: builds the page template, then the page runs.
void BM_PlanCold(benchmark::State& state) {
  const Setup s = make_setup(static_cast<uint32_t>(state.range(0)));
  for (auto _ : state) {
    pdkv::Planner planner;
    auto plan = planner.plan(s.src, s.dst, s.route, s.src_pages, s.dst_pages);
    benchmark::DoNotOptimize(plan);
    if (state.iterations() == 1) report(state, plan.value());
  }
}

// The steady state of a server: the template is cached, only pages change.
void BM_PlanCached(benchmark::State& state) {
  const Setup s = make_setup(static_cast<uint32_t>(state.range(0)));
  pdkv::Planner planner;
  (void)planner.plan(s.src, s.dst, s.route, s.src_pages, s.dst_pages);
  for (auto _ : state) {
    auto plan = planner.plan(s.src, s.dst, s.route, s.src_pages, s.dst_pages);
    benchmark::DoNotOptimize(plan);
  }
}

// Plan, then produce every fragment once (what a backend that posts one
// write per fragment pays), without storing them.
void BM_PlanAndWalkFragments(benchmark::State& state) {
  const Setup s = make_setup(static_cast<uint32_t>(state.range(0)));
  pdkv::Planner planner;
  for (auto _ : state) {
    auto plan = planner.plan(s.src, s.dst, s.route, s.src_pages, s.dst_pages).value();
    uint64_t bytes = 0;
    plan.for_each([&bytes](const pdkv::Fragment& f) { bytes += f.length; });
    benchmark::DoNotOptimize(bytes);
    state.counters["fragments"] = static_cast<double>(plan.fragment_count());
  }
}

// Plan and materialise the whole fragment list as a vector.
void BM_PlanAndMaterialise(benchmark::State& state) {
  const Setup s = make_setup(static_cast<uint32_t>(state.range(0)));
  pdkv::Planner planner;
  for (auto _ : state) {
    auto plan = planner.plan(s.src, s.dst, s.route, s.src_pages, s.dst_pages).value();
    auto fragments = plan.fragments();
    benchmark::DoNotOptimize(fragments.data());
    state.counters["fragments"] = static_cast<double>(fragments.size());
  }
}

BENCHMARK(BM_PlanCold)->Arg(1)->Arg(16)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PlanCached)->Arg(1)->Arg(16)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PlanAndWalkFragments)->Arg(1)->Arg(16)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PlanAndMaterialise)->Arg(1)->Arg(16)->Unit(benchmark::kMillisecond);

}  // namespace

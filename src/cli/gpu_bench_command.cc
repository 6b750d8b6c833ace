// `pdkv gpu-bench`: the staging path on a GPU, against the device's own
// copy engine. For a Llama-3-8B-like pool (32 layers, 8 KV heads x 128,
// 2 bytes) it builds the plan of one request per TP pair, then times
//   gather:  the staging kernel, device pages -> pinned host staging;
//   scatter: the kernel back, pinned host staging -> device pages;
//   peak:    one cudaMemcpy/hipMemcpy of the same bytes, contiguous,
//            device -> pinned host (what DMA alone reaches).
// Each figure is the best of --repeats runs; the ratio is gather / peak.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cli/command.h"
#include "gpu/gpu.h"
#include "pdkv/plan.h"

namespace pdkv::cli {
namespace {

struct Options {
  std::string device = "cuda";
  uint64_t tokens = 8192;
  uint32_t repeats = 5;
  std::vector<std::string> pairs = {"1->1", "2->4", "4->2", "1->8"};
};

struct Row {
  std::string pair;
  uint64_t bytes = 0, fragments = 0;
  double gather = 0, scatter = 0, peak = 0;
};

template <typename F>
double best_gbps(uint64_t bytes, uint32_t repeats, F&& once) {
  double best = 0;
  for (uint32_t i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!once()) return 0;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, bytes / s / 1e9);
  }
  return best;
}

int run(const Options& o) {
  const MemoryKind kind = o.device == "hip" ? MemoryKind::kHip : MemoryKind::kCuda;
  auto rt = gpu::runtime(kind);
  if (!rt.is_ok()) {
    std::fprintf(stderr, "pdkv gpu-bench: %s\n", rt.status().message().c_str());
    return kExitInvalidInput;
  }
  gpu::Runtime& runtime = **rt;
  if (runtime.device_count() == 0) {
    std::fprintf(stderr, "pdkv gpu-bench: no %s device found\n", o.device.c_str());
    return kExitInvalidInput;
  }
  auto stager = runtime.stager(0);
  if (!stager.is_ok()) {
    std::fprintf(stderr, "pdkv gpu-bench: %s\n", stager.status().to_string().c_str());
    return kExitFailure;
  }
  constexpr uint32_t kHeads = 8, kLayers = 32, kPageSize = 16;
  const uint64_t pages = (o.tokens + kPageSize - 1) / kPageSize;
  std::vector<Row> rows;
  Planner planner;
  for (const std::string& pair : o.pairs) {
    uint32_t p = 0, d = 0;
    if (std::sscanf(pair.c_str(), "%u->%u", &p, &d) != 2 || p == 0 || d == 0) {
      std::fprintf(stderr, "pdkv gpu-bench: --pairs '%s' is not P->D\n", pair.c_str());
      return kExitInvalidInput;
    }
    const KvSpec spec{kHeads, 128, 2, kPageSize, kLayers, pages, Layout::kNhd, false};
    auto src_axis = AxisSharding::even(kHeads, p);
    auto dst_axis = AxisSharding::even(kHeads, d);
    if (!src_axis.is_ok() || !dst_axis.is_ok()) {
      std::fprintf(stderr, "pdkv gpu-bench: %s\n",
                   (src_axis.is_ok() ? dst_axis.status() : src_axis.status()).message().c_str());
      return kExitInvalidInput;
    }
    // Prefill rank 0's route to the first decode rank it feeds.
    const auto map = transfer_map(*src_axis, *dst_axis).value();
    const Segment seg = segments_from(map, 0).front();
    const RankShard src{spec, src_axis->owned(0).value(), {0, kLayers}};
    const RankShard dst{spec, dst_axis->owned(seg.dst_rank).value(), {0, kLayers}};
    std::vector<uint64_t> order(pages);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937_64(7));  // pages as a cache leaves them
    auto plan = planner.plan(src, dst, {seg, {0, 0, 0, 0, kLayers}}, order, order);
    if (!plan.is_ok()) {
      std::fprintf(stderr, "pdkv gpu-bench: %s\n", plan.status().to_string().c_str());
      return kExitFailure;
    }
    std::vector<MemoryRegion> pool;
    const uint64_t buffer_bytes = pages * spec.page_bytes(src.heads.count);
    bool ok = true;
    for (uint32_t b = 0; b < kLayers * 2 && ok; ++b) {
      auto memory = runtime.allocate(0, buffer_bytes);
      ok = memory.is_ok();
      if (ok) pool.push_back({*memory, buffer_bytes, kind, 0});
    }
    // Pinned staging, page-aligned as the engine's.
    const uint64_t host_bytes = (plan->bytes() + 4095) / 4096 * 4096;
    std::unique_ptr<std::byte, decltype(&std::free)> host(
        static_cast<std::byte*>(std::aligned_alloc(4096, host_bytes)), &std::free);
    ok = ok && host != nullptr;
    auto alias = ok ? runtime.pin(host.get(), host_bytes) : Result<void*>(Status::internal(""));
    auto contiguous = ok ? runtime.allocate(0, plan->bytes()) : Result<void*>(Status::internal(""));
    Row row{pair, plan->bytes(), plan->fragment_count()};
    if (ok && alias.is_ok() && contiguous.is_ok()) {
      auto& s = **stager;
      row.gather = best_gbps(plan->bytes(), o.repeats, [&] {
        auto t = s.gather(*plan, pool, *alias, plan->bytes());
        return t.is_ok() && s.wait(*t).is_ok();
      });
      row.scatter = best_gbps(plan->bytes(), o.repeats, [&] {
        auto t = s.scatter(*plan, *alias, plan->bytes(), pool);
        return t.is_ok() && s.wait(*t).is_ok();
      });
      row.peak = best_gbps(plan->bytes(), o.repeats, [&] {
        return runtime.copy(host.get(), *contiguous, plan->bytes()).is_ok();
      });
    } else {
      std::fprintf(stderr, "pdkv gpu-bench: %s: cannot allocate the pools (%s)\n", pair.c_str(),
                   (alias.is_ok() ? contiguous.status() : alias.status()).message().c_str());
    }
    if (alias.is_ok()) runtime.unpin(host.get());
    if (contiguous.is_ok()) runtime.release(0, *contiguous);
    for (const MemoryRegion& r : pool) runtime.release(0, r.base);
    std::fprintf(stderr, "pdkv gpu-bench: %s done\n", pair.c_str());
    rows.push_back(row);
  }
  std::printf("%-6s %12s %10s %12s %12s %12s %9s\n", "pair", "MiB", "fragments", "gather GB/s",
              "scatter GB/s", "D2H GB/s", "x_peak");
  bool all = true;
  for (const Row& r : rows) {
    std::printf("%-6s %12.1f %10llu %12.2f %12.2f %12.2f %9.2f\n", r.pair.c_str(),
                r.bytes / 1048576.0, static_cast<unsigned long long>(r.fragments), r.gather,
                r.scatter, r.peak, r.peak > 0 ? r.gather / r.peak : 0.0);
    all &= r.gather > 0 && r.scatter > 0 && r.peak > 0;
  }
  return all ? kExitOk : kExitFailure;
}

}  // namespace

Command add_gpu_bench_command(CLI::App& app) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "gpu-bench", "Time the GPU staging kernels against the device-to-host copy peak");
  cmd->add_option("--device", o->device, "cuda or hip")
      ->capture_default_str()
      ->check(CLI::IsMember({"cuda", "hip"}));
  cmd->add_option("--tokens", o->tokens, "Tokens per request (16 per page)")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{16}, uint64_t{1} << 20));
  cmd->add_option("--repeats", o->repeats, "Runs per figure; the best counts")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1000u));
  cmd->add_option("--pairs", o->pairs, "TP pairs P->D of an 8-KV-head model")->delimiter(',');
  return {cmd, [o] { return run(*o); }};
}

}  // namespace pdkv::cli

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
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cli/command.h"
#include "engine/pool_memory.h"
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

// Device memory, released with its owner.
struct DeviceBuffer {
  gpu::Runtime* runtime;
  void* base;
  ~DeviceBuffer() { runtime->release(0, base); }
};

// Host memory pinned for the kernels, page-aligned as the engine's.
struct PinnedHost {
  gpu::Runtime* runtime;
  engine::HostMapping memory;
  void* alias;
  ~PinnedHost() { runtime->unpin(memory.region().base); }
};

// The figures of one TP pair: prefill rank 0's route to the first decode
// rank it feeds, one request with its pages shuffled as a cache leaves them.
Result<Row> measure(gpu::Runtime& runtime, gpu::Stager& stager, Planner& planner,
                    const std::string& pair, const Options& o) {
  constexpr uint32_t kHeads = 8, kLayers = 32, kPageSize = 16;
  uint32_t p = 0, d = 0;
  if (std::sscanf(pair.c_str(), "%u->%u", &p, &d) != 2 || p == 0 || d == 0) {
    return Status::invalid_argument(fmt::format("--pairs '{}' is not P->D", pair));
  }
  const uint64_t pages = (o.tokens + kPageSize - 1) / kPageSize;
  const KvSpec spec{kHeads, 128, 2, kPageSize, kLayers, pages, Layout::kNhd, false};
  PDKV_ASSIGN_OR_RETURN(auto src_axis, AxisSharding::even(kHeads, p));
  PDKV_ASSIGN_OR_RETURN(auto dst_axis, AxisSharding::even(kHeads, d));
  PDKV_ASSIGN_OR_RETURN(auto map, transfer_map(src_axis, dst_axis));
  const Segment seg = segments_from(map, 0).front();
  const RankShard src{spec, src_axis.owned(0).value(), {0, kLayers}};
  const RankShard dst{spec, dst_axis.owned(seg.dst_rank).value(), {0, kLayers}};
  std::vector<uint64_t> order(pages);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(7));
  PDKV_ASSIGN_OR_RETURN(TransferPlan plan,
                        planner.plan(src, dst, {seg, {0, 0, 0, 0, kLayers}}, order, order));

  std::vector<std::unique_ptr<DeviceBuffer>> owned;
  auto device_buffer = [&](uint64_t bytes) -> Result<void*> {
    PDKV_ASSIGN_OR_RETURN(void* base, runtime.allocate(0, bytes));
    owned.push_back(std::make_unique<DeviceBuffer>(DeviceBuffer{&runtime, base}));
    return base;
  };
  std::vector<MemoryRegion> pool;
  const uint64_t buffer_bytes = pages * spec.page_bytes(src.heads.count);
  for (uint32_t b = 0; b < kLayers * 2; ++b) {
    PDKV_ASSIGN_OR_RETURN(void* base, device_buffer(buffer_bytes));
    pool.push_back({base, buffer_bytes, runtime.kind(), 0});
  }
  PDKV_ASSIGN_OR_RETURN(void* contiguous, device_buffer(plan.bytes()));
  PDKV_ASSIGN_OR_RETURN(engine::HostMapping host, engine::HostMapping::map(plan.bytes()));
  void* host_base = host.region().base;
  PDKV_ASSIGN_OR_RETURN(void* alias, runtime.pin(host_base, plan.bytes()));
  const PinnedHost pinned{&runtime, std::move(host), alias};

  Row row{pair, plan.bytes(), plan.fragment_count()};
  row.gather = best_gbps(plan.bytes(), o.repeats, [&] {
    auto t = stager.gather(plan, pool, alias, plan.bytes());
    return t.is_ok() && stager.wait(*t).is_ok();
  });
  row.scatter = best_gbps(plan.bytes(), o.repeats, [&] {
    auto t = stager.scatter(plan, alias, plan.bytes(), pool);
    return t.is_ok() && stager.wait(*t).is_ok();
  });
  row.peak = best_gbps(plan.bytes(), o.repeats,
                       [&] { return runtime.copy(host_base, contiguous, plan.bytes()).is_ok(); });
  return row;
}

int run(const Options& o) {
  const auto kind = parse_memory_kind(o.device);
  auto rt = kind.is_ok() ? gpu::runtime_with_device(*kind) : Result<gpu::Runtime*>(kind.status());
  if (!rt.is_ok()) {
    std::fprintf(stderr, "pdkv gpu-bench: %s\n", rt.status().message().c_str());
    return kExitInvalidInput;
  }
  gpu::Runtime& runtime = **rt;
  auto stager = runtime.stager(0);
  if (!stager.is_ok()) {
    std::fprintf(stderr, "pdkv gpu-bench: %s\n", stager.status().to_string().c_str());
    return kExitFailure;
  }
  std::vector<Row> rows;
  Planner planner;
  for (const std::string& pair : o.pairs) {
    auto row = measure(runtime, **stager, planner, pair, o);
    if (!row.is_ok()) {
      std::fprintf(stderr, "pdkv gpu-bench: %s: %s\n", pair.c_str(),
                   row.status().to_string().c_str());
      if (row.status().code() == StatusCode::kInvalidArgument) return kExitInvalidInput;
      rows.push_back(Row{pair});  // zeros: the run fails at the end
      continue;
    }
    std::fprintf(stderr, "pdkv gpu-bench: %s done\n", pair.c_str());
    rows.push_back(*row);
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

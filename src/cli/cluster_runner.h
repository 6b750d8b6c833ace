// One local cluster (bootstrap + prefill and decode ranks as processes on
// loopback), run to the end: the engine room of `pdkv run` and `pdkv bench`.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "cli/security_flags.h"
#include "worker/worker.h"

namespace pdkv::cli {

// A worker that a signal ended before it reported (with --keep-going: the
// user stopped it, as fault runs do), and the rooms it finished well first.
struct LostWorker {
  std::string name;  // "decode rank 1 (pid 42)"
  bool decode = false;
  uint32_t decode_engine = 0;  // decode ranks: the index of their engine
  std::string how;             // "killed by signal 9 (Killed)"
  std::set<uint64_t> ok_rooms;
};

struct ClusterOutcome {
  std::vector<nlohmann::json> summaries;  // every worker's that reported
  std::vector<LostWorker> lost;           // --keep-going: the ones a signal ended
  std::string failure;  // why the run broke ("decode rank 1 (pid 42) died: ..."), or ""
};

// `progress(done)` is called when the requests finished on every decode rank
// grow. `shape` must be valid (Shape::validate). Every process gets
// `security`'s flags; without a secret file, a fresh secret for this run.
ClusterOutcome run_cluster(const worker::Shape& shape, double timeout_s,
                           const std::function<void(uint64_t done)>& progress,
                           SecurityFlags security);

// The run's figures from the workers' summaries (and the workers lost):
//   verified (every succeeded request verified; without --keep-going, every
//     request succeeded), requests, warmup, failed, bytes (received by decode
//     ranks, all requests), measured_bytes (the requests after the warmup),
//   seconds: from the first measured request's last send() to the last
//     request's success (requests after the shape's warmup are measured),
//   gbps: the measured requests' bytes / seconds, requests_per_s,
//   p50_ms, p99_ms: per request, from its last send() (latest prefill rank) to its
//     success (latest decode rank),
//   staged_routes, direct_routes, backend, prefill_tp, decode_tp, errors,
//   decode_engines,
//   outcomes: [{"room": R, "decode_engine": "decode-1", "ok": bool, "reason": "..."}]
//     in issue order,
//   lost_workers: [{"name", "how"}].
nlohmann::ordered_json summarize(const worker::Shape& shape,
                                 const std::vector<nlohmann::json>& summaries,
                                 const std::vector<LostWorker>& lost = {});

double percentile(std::vector<double> values, double p);

}  // namespace pdkv::cli

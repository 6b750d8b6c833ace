// One local cluster (bootstrap + prefill and decode ranks as processes on
// loopback), run to the end: the engine room of `pdkv run` and `pdkv bench`.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "worker/worker.h"

namespace pdkv::cli {

struct ClusterOutcome {
  std::vector<nlohmann::json> summaries;  // every worker's, when all reported
  std::string failure;                    // why not ("decode rank 1 (pid 42) died: ..."), or ""
};

// `progress(done)` is called when the requests finished on every decode rank
// grow. `shape` must be valid (Shape::validate).
ClusterOutcome run_cluster(const worker::Shape& shape, double timeout_s,
                           const std::function<void(uint64_t done)>& progress);

// The run's figures from the workers' summaries:
//   verified, requests, warmup, failed, bytes (received by decode ranks, all
//     requests), measured_bytes (the requests after the warmup),
//   seconds: from the first measured request's last send() to the last
//     request's success (requests after the shape's warmup are measured),
//   gbps: the measured requests' bytes / seconds, requests_per_s,
//   p50_ms, p99_ms: per request, from its last send() (latest prefill rank) to its
//     success (latest decode rank),
//   staged_routes, direct_routes, backend, prefill_tp, decode_tp, errors.
nlohmann::ordered_json summarize(const worker::Shape& shape,
                                 const std::vector<nlohmann::json>& summaries);

double percentile(std::vector<double> values, double p);

}  // namespace pdkv::cli

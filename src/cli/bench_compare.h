// `pdkv bench --compare OLD.json`: each ratio of this run against the same
// scenario of a stored run (the JSON of `pdkv bench --json`). Ratios, not
// GB/s, because a ratio's baseline was measured in its own run: what is
// compared is how close each backend came to its ceiling then and now.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "pdkv/status.h"

namespace pdkv::cli {

// A drop below this fraction of the stored ratio is flagged (a fall of more
// than 20 %; figures on a shared 2-core machine vary by about that much).
constexpr double kFellBelow = 0.8;

struct RatioChange {
  std::string scenario;  // "mooncake-tcp llama3-8b 1->1 nhd auto 1024"
  std::string ratio;     // "x_iperf3"
  double old_value = 0;
  std::optional<double> new_value;  // none: the scenario failed, or lost this figure
  // Why a scenario's figures are not whole (scenario_incomplete), in each run.
  std::string new_incomplete, old_incomplete;
  // A figure of a run that lost requests counts as fallen: what it divides
  // is not what the scenario asked for.
  bool fell() const {
    return !new_value || !new_incomplete.empty() || *new_value < kFellBelow * old_value;
  }
};

// Why a scenario row of `pdkv bench --json` is not a whole measurement: its
// "error" (the scenario failed, or some of its requests did), or, in runs
// stored before rows said so, its count of failed requests; "" when whole.
std::string scenario_incomplete(const nlohmann::ordered_json& row);

struct RunComparison {
  std::vector<RatioChange> changes;    // in the order of the new run's scenarios
  std::vector<std::string> unmatched;  // new scenarios the stored run lacks
};

// A stored run read from `path` (given as `flag`), or kInvalidArgument
// naming both and what is wrong (unreadable, not JSON, no "scenarios" array).
Result<nlohmann::ordered_json> load_run(const std::string& flag, const std::string& path);

// Every ratio (x_*) the stored run has for a scenario both ran, matched by
// backend, model, pair, layout, staging and tokens; one the new run lacks
// (the scenario failed, or a baseline did) counts as fallen.
RunComparison compare_runs(const nlohmann::ordered_json& old_run,
                           const nlohmann::ordered_json& new_run);

// One line per ratio, "FELL" on those that fell, and a closing count.
std::string format_comparison(const RunComparison& c, const std::string& old_path);

}  // namespace pdkv::cli

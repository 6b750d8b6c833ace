#include "cli/bench_compare.h"

#include <fmt/format.h>

#include <fstream>
#include <map>
#include <sstream>

namespace pdkv::cli {
namespace {

constexpr const char* kKeys[] = {"backend", "model", "pair", "layout", "staging", "tokens"};

std::string scenario_name(const nlohmann::ordered_json& row) {
  std::string name;
  for (const char* key : kKeys) {
    if (!name.empty()) name += ' ';
    const auto& v = row.contains(key) ? row[key] : nlohmann::ordered_json();
    name += v.is_string() ? v.get<std::string>() : v.dump();
  }
  return name;
}

}  // namespace

std::string scenario_incomplete(const nlohmann::ordered_json& row) {
  if (row.contains("error") && row["error"].is_string()) return row["error"].get<std::string>();
  if (row.contains("failed") && row["failed"].is_number_unsigned() &&
      row["failed"].get<uint64_t>() > 0) {
    return fmt::format("{} requests failed", row["failed"].get<uint64_t>());
  }
  return "";
}

Result<nlohmann::ordered_json> load_run(const std::string& flag, const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::invalid_argument(fmt::format("{} {}: cannot read it", flag, path));
  std::stringstream text;
  text << in.rdbuf();
  auto run = nlohmann::ordered_json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (run.is_discarded()) {
    return Status::invalid_argument(
        fmt::format("{} {}: not JSON (expected the output of pdkv bench --json)", flag, path));
  }
  if (!run.is_object() || !run.contains("scenarios") || !run["scenarios"].is_array()) {
    return Status::invalid_argument(fmt::format(
        "{} {}: no \"scenarios\" array (expected the output of pdkv bench --json)", flag, path));
  }
  return run;
}

RunComparison compare_runs(const nlohmann::ordered_json& old_run,
                           const nlohmann::ordered_json& new_run) {
  std::map<std::string, const nlohmann::ordered_json*> stored;
  for (const auto& row : old_run["scenarios"]) stored[scenario_name(row)] = &row;
  RunComparison c;
  for (const auto& row : new_run["scenarios"]) {
    const std::string name = scenario_name(row);
    auto it = stored.find(name);
    if (it == stored.end()) {
      c.unmatched.push_back(name);
      continue;
    }
    for (const auto& [key, stored_value] : it->second->items()) {
      if (key.rfind("x_", 0) != 0 || !stored_value.is_number()) continue;
      RatioChange change{name,
                         key,
                         stored_value.get<double>(),
                         std::nullopt,
                         scenario_incomplete(row),
                         scenario_incomplete(*it->second)};
      if (row.contains(key) && row[key].is_number()) change.new_value = row[key].get<double>();
      c.changes.push_back(std::move(change));
    }
  }
  return c;
}

std::string format_comparison(const RunComparison& c, const std::string& old_path) {
  std::string out = fmt::format("against {}:\n", old_path);
  size_t fell = 0;
  for (const RatioChange& r : c.changes) {
    fell += r.fell();
    if (!r.new_value) {
      out +=
          fmt::format("{:<44} {:<11} {:8.3f} ->     none  FELL", r.scenario, r.ratio, r.old_value);
    } else {
      out +=
          fmt::format("{:<44} {:<11} {:8.3f} -> {:8.3f}  x{:.2f}{}", r.scenario, r.ratio,
                      r.old_value, *r.new_value, r.old_value > 0 ? *r.new_value / r.old_value : 0.0,
                      r.fell() ? "  FELL" : "");
    }
    if (!r.new_incomplete.empty()) out += fmt::format(" (now: {})", r.new_incomplete);
    if (!r.old_incomplete.empty()) out += fmt::format(" (stored: {})", r.old_incomplete);
    out += '\n';
  }
  for (const auto& name : c.unmatched) out += fmt::format("{}: not in the stored run\n", name);
  out += fmt::format("{} of {} ratios fell by more than {:.0f} %\n", fell, c.changes.size(),
                     (1 - kFellBelow) * 100);
  return out;
}

}  // namespace pdkv::cli

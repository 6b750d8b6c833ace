// `pdkv bench`: real worker processes (as `pdkv run`, without writing or
// checking the pattern) over a grid of backends x TP pairs x layouts x
// staging x model presets x prompt lengths, each result also given as a
// ratio to a baseline measured in the same run (bench/baselines.h): one
// core's memcpy, ucx_perftest's put bandwidth, iperf3 over loopback, and our
// own "naive" mode (one write per token, no coalescing, no staging).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/baselines.h"
#include "cli/bench_compare.h"
#include "cli/cluster_runner.h"
#include "cli/command.h"
#include "cli/security_flags.h"
#include "pdkv/transport.h"

namespace pdkv::cli {
namespace {

struct Model {
  std::string name;
  uint32_t layers, kv_heads, head_dim;
  bool mla;
};
// The presets of the issue: a Llama-3-8B-like GQA model, a 2-KV-head GQA
// model, and an MLA model with a 576-wide latent; 2-byte dtype throughout.
const std::vector<Model> kModels = {{"llama3-8b", 32, 8, 128, false},
                                    {"gqa-2kv", 32, 2, 128, false},
                                    {"mla-576", 32, 1, 576, true}};

// A backend and the options that choose its path.
struct Variant {
  std::string label, backend;
  std::vector<std::string> options;
  bool tcp;  // bytes go through the kernel's TCP stack: iperf3 is its ceiling
};
const std::vector<Variant> kVariants = {
    {"nixl", "nixl", {}, false},
    {"mooncake", "mooncake", {}, false},
    {"mooncake-tcp", "mooncake", {"same_host=off", "rails=2"}, true},
    {"mori", "mori", {}, false},
    {"mori-tcp", "mori", {"provider=tcp;ofi_rxm"}, true}};

struct Scenario {
  const Variant* variant;
  const Model* model;
  uint32_t prefill_tp, decode_tp;
  std::string layout, staging;
  uint64_t tokens;
};

struct BenchOptions {
  bool quick = false, json = false;
  std::string csv, plot, backends;
  std::string compare;  // a stored run (--json) to compare this one's ratios with
  std::string results;  // a stored run to compare instead of running the grid
  // Narrow the full grid (comma-separated; empty = all).
  std::string models, pairs, layouts, tokens;
  double timeout_s = 600;
  unsigned repeat = 1;  // runs of each scenario; the median one stands for it
  SecurityFlags security;
};

// One scenario, run `--repeat` times in turn. On a shared machine one run's
// GB/s moves by up to 40 %, so the run of median GB/s (the lower middle one
// of an even count) stands for the scenario, with every run's GB/s beside
// it. A run that lost requests stands for it instead, so that its row says
// so; a run that did not complete ends the scenario.
struct Measurement {
  std::string failure;             // why a run did not complete
  nlohmann::ordered_json summary;  // summarize() of the run that stands
  std::vector<double> gbps_runs;   // each run's GB/s, in the order run
};

Measurement measure(const worker::Shape& shape, const BenchOptions& o) {
  Measurement m;
  std::vector<nlohmann::ordered_json> runs;
  for (unsigned r = 0; r < o.repeat; ++r) {
    const ClusterOutcome outcome = run_cluster(shape, o.timeout_s, nullptr, o.security);
    if (!outcome.failure.empty()) {
      m.failure = outcome.failure;
      return m;
    }
    runs.push_back(summarize(shape, outcome.summaries));
    m.gbps_runs.push_back(runs.back()["gbps"].get<double>());
  }
  const auto lossy = std::find_if(runs.begin(), runs.end(), [](const nlohmann::ordered_json& run) {
    return run["failed"].get<uint64_t>() > 0;
  });
  if (lossy != runs.end()) {
    m.summary = *lossy;
    return m;
  }
  std::sort(runs.begin(), runs.end(),
            [](const nlohmann::ordered_json& a, const nlohmann::ordered_json& b) {
              return a["gbps"].get<double>() < b["gbps"].get<double>();
            });
  m.summary = runs[(runs.size() - 1) / 2];
  return m;
}

// The reason the first failed request of a cluster summary gave.
std::string first_failure(const nlohmann::ordered_json& summary) {
  for (const auto& o : summary["outcomes"]) {
    if (!o["ok"].get<bool>()) {
      return fmt::format("request {}: {}", o["room"].get<uint64_t>(),
                         o["reason"].get<std::string>());
    }
  }
  return "(no reason given)";
}

// Whether `value` is in the comma-separated `list` (an empty list holds all).
bool listed(const std::string& list, const std::string& value) {
  return list.empty() || ("," + list + ",").find("," + value + ",") != std::string::npos;
}

std::string pair_name(const Scenario& s) {
  return fmt::format("{}->{}", s.prefill_tp, s.decode_tp);
}

std::vector<Scenario> grid(const BenchOptions& o, const std::vector<const Variant*>& variants) {
  std::vector<Scenario> out;
  const std::vector<std::pair<uint32_t, uint32_t>> pairs = {{1, 1}, {1, 2}, {1, 4}, {2, 1},
                                                            {2, 4}, {4, 2}, {4, 1}};
  for (const Variant* v : variants) {
    if (o.quick) {  // a smoke run: about a minute on two cores, every variant
      const Model* m = &kModels[0];
      out.push_back({v, m, 1, 1, "nhd", "auto", 256});
      out.push_back({v, m, 2, 4, "nhd", "on", 256});
      out.push_back({v, m, 2, 4, "nhd", "naive", 256});
      out.push_back({v, m, 1, 1, "nhd", "auto", 16});  // one page: control overhead
      continue;
    }
    for (const Model& m : kModels) {
      if (!listed(o.models, m.name)) continue;
      auto model_pairs = pairs;
      if (m.kv_heads == 2) model_pairs.insert(model_pairs.end(), {{1, 8}, {2, 8}});
      for (const auto& [p, d] : model_pairs) {
        if (!listed(o.pairs, fmt::format("{}->{}", p, d))) continue;
        for (const std::string layout : {"nhd", "hnd"}) {
          if ((m.mla && layout == "hnd") || !listed(o.layouts, layout)) continue;
          for (uint64_t tokens : {1024u, 8192u, 32768u}) {
            if (!listed(o.tokens, std::to_string(tokens))) continue;
            for (const std::string staging : {"on", "off", "auto"}) {
              out.push_back({v, &m, p, d, layout, staging, tokens});
            }
            // Naive per-token writes at 1k only: at 32k they take minutes.
            if (tokens == 1024) out.push_back({v, &m, p, d, layout, "naive", tokens});
          }
        }
        if (listed(o.tokens, "16")) out.push_back({v, &m, p, d, "nhd", "auto", 16});  // one page
      }
    }
  }
  return out;
}

worker::Shape shape_of(const Scenario& s, bool quick) {
  worker::Shape shape;
  shape.backend = s.variant->backend;
  shape.backend_options = s.variant->options;
  shape.kv_heads = s.model->kv_heads;
  shape.head_dim = s.model->head_dim;
  shape.layers = s.model->layers;
  shape.mla = s.model->mla;
  shape.dtype_bytes = 2;
  shape.page_size = 16;
  shape.layout = s.layout;
  shape.staging = s.staging;
  shape.prefill_tp = s.prefill_tp;
  shape.decode_tp = s.decode_tp;
  shape.tokens = s.tokens;
  shape.verify = false;  // bytes move; nobody writes or checks the pattern
  if (s.tokens <= shape.page_size) {
    // One page per request, one request at a time: the control path's own
    // latency, with no queueing behind other requests.
    shape.warmup = 10;
    shape.requests = shape.warmup + (quick ? 30 : 200);
    shape.window = 1;
  } else {
    // Enough requests for a steady figure; pools bounded to about 1 GiB a rank.
    const uint64_t per_request_mib = uint64_t{s.model->layers} * (s.model->mla ? 1 : 2) *
                                         s.model->kv_heads * s.model->head_dim * 2 * s.tokens >>
                                     20;
    shape.window = static_cast<uint32_t>(
        std::clamp<uint64_t>(1024 / std::max<uint64_t>(1, per_request_mib), 1, 4));
    // One window warms every slot of the pools first. Its requests also pay
    // for the first touch of every page, which on these VMs takes a 4 GiB
    // request past the default 30 s transfer timeout: allow 30 ms a MiB.
    shape.warmup = shape.window;
    shape.engine_timeouts = {
        fmt::format("transfer={}", std::max<uint64_t>(30'000, 30 * per_request_mib))};
    shape.requests = shape.warmup + (quick ? 2 * shape.window : 4 * shape.window);
    if (s.staging == "naive") {
      shape.requests = shape.warmup + shape.window;  // per-token writes are slow by design
    }
  }
  shape.aux_bytes = 16;
  return shape;
}

// The baselines, measured once per size.
struct Baselines {
  std::map<uint64_t, double> memcpy, ucx;
  std::optional<double> iperf3;
  std::string ucx_missing, iperf3_missing;

  // Sizes are measured once per power of two near them.
  static uint64_t near_power_of_two(uint64_t bytes, uint64_t lo, uint64_t hi) {
    return uint64_t{1} << std::lround(std::log2(std::clamp(bytes, lo, hi)));
  }
  // The size UCX's put is measured at for a request of `bytes`: a buffer of
  // the request's size, so that, as the request's pages do, it streams
  // through memory instead of sitting in cache (up to 1 GiB).
  static uint64_t ucx_size_of(uint64_t request_bytes) {
    return near_power_of_two(request_bytes, 4096, uint64_t{1} << 30);
  }
  double memcpy_at(uint64_t bytes) {
    const uint64_t key = near_power_of_two(bytes, 1 << 20, uint64_t{1} << 40);
    if (!memcpy.count(key)) memcpy[key] = memcpy_gbps(key);
    return memcpy[key];
  }
  std::optional<double> ucx_at(uint64_t bytes) {
    const uint64_t key = ucx_size_of(bytes);
    if (!ucx_missing.empty()) return std::nullopt;
    if (!ucx.count(key)) {
      auto v = ucx_put_gbps(key, ucx_missing);
      if (!v) return std::nullopt;
      ucx[key] = *v;
    }
    return ucx[key];
  }
};

std::optional<double> ratio(double value, std::optional<double> base) {
  if (!base || *base <= 0) return std::nullopt;
  return value / *base;
}

std::string fmt_ratio(const nlohmann::json& v) {
  return v.is_null() ? "-" : fmt::format("{:.2f}", v.get<double>());
}

// Draws GB/s across TP pairs, one line per backend: the first model, layout
// and length of the grid, the best staging mode but naive. False when
// gnuplot failed.
bool write_plot(const nlohmann::ordered_json& rows, const std::string& png) {
  const auto& first = rows[0];
  std::vector<std::string> pairs, labels;                      // in grid order
  std::map<std::pair<std::string, std::string>, double> best;  // (pair, backend) -> GB/s
  for (const auto& r : rows) {
    if (r["staging"] == "naive" || !r.contains("gbps") || r["model"] != first["model"] ||
        r["layout"] != first["layout"] || r["tokens"] != first["tokens"]) {
      continue;
    }
    const std::string p = r["pair"], b = r["backend"];
    if (std::find(pairs.begin(), pairs.end(), p) == pairs.end()) pairs.push_back(p);
    if (std::find(labels.begin(), labels.end(), b) == labels.end()) labels.push_back(b);
    double& g = best[{p, b}];
    g = std::max(g, r["gbps"].get<double>());
  }
  const std::string data = png + ".dat";
  std::ofstream dat(data);
  dat << "pair";
  for (const auto& b : labels) dat << " " << b;
  dat << "\n";
  for (const auto& p : pairs) {
    dat << "\"" << p << "\"";
    for (const auto& b : labels) {
      auto it = best.find({p, b});
      dat << " " << (it != best.end() ? fmt::format("{:.4f}", it->second) : std::string("?"));
    }
    dat << "\n";
  }
  dat.close();
  std::string script = fmt::format(
      "set terminal pngcairo size 900,500; set output '{}'; set title 'pdkv bench: {} {} {} "
      "tokens, best staging mode (KV GB/s)'; set yrange [0:*]; set ylabel 'GB/s'; set xlabel "
      "'prefill TP -> decode TP'; set key outside; set grid; set datafile missing '?'; plot ",
      png, first["model"].get<std::string>(), first["layout"].get<std::string>(),
      first["tokens"].get<uint64_t>());
  for (size_t i = 0; i < labels.size(); ++i) {
    script += fmt::format("{}'{}' using {}:xtic(1) with linespoints title '{}'", i ? ", " : "",
                          data, i + 2, labels[i]);
  }
  FILE* g = popen("gnuplot", "w");
  const int rc = g ? (std::fputs(script.c_str(), g), pclose(g)) : -1;
  std::remove(data.c_str());
  return rc == 0;
}

// The runs --compare and --results name, loaded before the grid starts (a
// wrong path is said at once, not after an hour of scenarios).
struct StoredRuns {
  std::optional<nlohmann::ordered_json> compare, results;
  // Prints `run`'s ratios against the --compare run's, if there is one.
  void print_against(const nlohmann::ordered_json& run, const std::string& path, FILE* to) const {
    if (compare) std::fputs(format_comparison(compare_runs(*compare, run), path).c_str(), to);
  }
};

Result<StoredRuns> load_stored_runs(const BenchOptions& o) {
  if (!o.results.empty() && o.compare.empty()) {
    return Status::invalid_argument(
        fmt::format("--results {} needs --compare OLD.json to compare it with", o.results));
  }
  StoredRuns runs;
  if (!o.compare.empty()) {
    PDKV_ASSIGN_OR_RETURN(runs.compare, load_run("--compare", o.compare));
  }
  if (!o.results.empty()) {
    PDKV_ASSIGN_OR_RETURN(runs.results, load_run("--results", o.results));
  }
  return runs;
}

int run_bench(const BenchOptions& o) {
  const auto stored = load_stored_runs(o);
  if (!stored.is_ok()) {
    std::fprintf(stderr, "pdkv bench: %s\n", stored.status().message().c_str());
    return kExitInvalidInput;
  }
  if (stored->results) {
    stored->print_against(*stored->results, o.compare, stdout);
    return kExitOk;
  }
  const auto built = transport_names();
  std::vector<const Variant*> variants;
  for (const Variant& v : kVariants) {
    if (listed(o.backends, v.label) &&
        std::find(built.begin(), built.end(), v.backend) != built.end()) {
      variants.push_back(&v);
    }
  }
  if (variants.empty()) {
    std::fprintf(stderr, "pdkv bench: --backends '%s' names no variant built here\n",
                 o.backends.c_str());
    return kExitInvalidInput;
  }
  const std::vector<Scenario> scenarios = grid(o, variants);
  if (scenarios.empty()) {
    std::fprintf(stderr, "pdkv bench: --models/--pairs/--layouts/--tokens leave no scenario\n");
    return kExitInvalidInput;
  }
  Baselines base;
  base.iperf3 = iperf3_gbps(o.quick ? 1 : 3, base.iperf3_missing);
  const auto ucx_4m = base.ucx_at(4 << 20);

  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  int failures = 0;
  for (size_t i = 0; i < scenarios.size(); ++i) {
    const Scenario& s = scenarios[i];
    const worker::Shape shape = shape_of(s, o.quick);
    std::fprintf(stderr, "pdkv bench: [%zu/%zu] %s %s %s %s staging %s %llu tokens\n", i + 1,
                 scenarios.size(), s.variant->label.c_str(), s.model->name.c_str(),
                 pair_name(s).c_str(), s.layout.c_str(), s.staging.c_str(),
                 static_cast<unsigned long long>(s.tokens));
    nlohmann::ordered_json row;
    row["backend"] = s.variant->label;
    row["model"] = s.model->name;
    row["pair"] = pair_name(s);
    row["layout"] = s.layout;
    row["staging"] = s.staging;
    row["tokens"] = s.tokens;
    if (Status valid = shape.validate(); !valid.is_ok()) {
      row["error"] = valid.message();
      rows.push_back(row);
      ++failures;
      continue;
    }
    const Measurement measured = measure(shape, o);
    if (!measured.failure.empty()) {
      std::fprintf(stderr, "pdkv bench:   failed: %s\n", measured.failure.c_str());
      row["error"] = measured.failure;
      rows.push_back(row);
      ++failures;
      continue;
    }
    const auto& sum = measured.summary;
    const double gbps = sum["gbps"].get<double>();
    const uint64_t routes = std::max<uint64_t>(
        1, sum["staged_routes"].get<uint64_t>() + sum["direct_routes"].get<uint64_t>());
    const uint64_t per_request =
        sum["bytes"].get<uint64_t>() / std::max<uint64_t>(1, shape.requests);
    row["gbps"] = gbps;
    row["p50_ms"] = sum["p50_ms"];
    row["p99_ms"] = sum["p99_ms"];
    row["requests_per_s"] = sum["requests_per_s"];
    row["bytes"] = sum["measured_bytes"];  // what GB/s divides
    row["warmup_requests"] = shape.warmup;
    row["gbps_runs"] = measured.gbps_runs;
    row["message_bytes"] = sum["bytes"].get<uint64_t>() / routes;
    // Routes of every request, warm-up included: what `auto` decided.
    row["staged_routes"] = sum["staged_routes"];
    row["direct_routes"] = sum["direct_routes"];
    row["failed"] = sum["failed"];
    // Some requests failed: the figures count the ones that arrived, and the
    // row says that it is not a whole measurement (and the run fails).
    if (const uint64_t lost = sum["failed"].get<uint64_t>(); lost > 0) {
      row["error"] = fmt::format("{} of {} requests failed; the first: {}", lost, shape.requests,
                                 first_failure(sum));
      std::fprintf(stderr, "pdkv bench:   %s\n", row["error"].get<std::string>().c_str());
      ++failures;
    }
    const auto null_or = [](std::optional<double> v) {
      return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
    };
    row["x_memcpy"] = gbps / base.memcpy_at(per_request);
    row["request_bytes"] = per_request;
    if (s.variant->backend == "nixl") {
      row["x_ucx_put"] = null_or(ratio(gbps, base.ucx_at(per_request)));
      row["ucx_put_bytes"] = Baselines::ucx_size_of(per_request);  // which baseline it divides
    } else {
      row["x_ucx_put"] = nullptr;
    }
    row["x_iperf3"] = s.variant->tcp ? null_or(ratio(gbps, base.iperf3)) : nlohmann::json(nullptr);
    rows.push_back(row);
  }
  // Ratios between scenarios, once all have run. Against naive mode: the
  // same route written one token at a time. Against equal TP: the best 1->1
  // figure (any staging but naive) of the same backend, model, layout, length.
  const auto same_case = [](const auto& a, const auto& b) {
    return a["backend"] == b["backend"] && a["model"] == b["model"] && a["layout"] == b["layout"] &&
           a["tokens"] == b["tokens"];
  };
  for (auto& row : rows) {
    row["x_equal_tp"] = nullptr;
    row["x_naive"] = nullptr;
    if (!row.contains("gbps") || row["staging"] == "naive") continue;
    double naive = 0, equal = 0;
    for (const auto& other : rows) {
      const bool whole = other.contains("gbps") && scenario_incomplete(other).empty();
      if (!whole || !same_case(row, other)) continue;
      if (other["staging"] == "naive" && other["pair"] == row["pair"]) {
        naive = other["gbps"].get<double>();
      } else if (other["staging"] != "naive" && other["pair"] == "1->1") {
        equal = std::max(equal, other["gbps"].get<double>());
      }
    }
    if (naive > 0) row["x_naive"] = row["gbps"].get<double>() / naive;
    if (equal > 0 && row["pair"] != "1->1") row["x_equal_tp"] = row["gbps"].get<double>() / equal;
  }

  nlohmann::ordered_json baselines;
  for (const auto& [bytes, g] : base.memcpy) baselines["memcpy_gbps"][std::to_string(bytes)] = g;
  for (const auto& [bytes, g] : base.ucx) baselines["ucx_put_gbps"][std::to_string(bytes)] = g;
  baselines["ucx_put_4mib_gbps"] = ucx_4m ? nlohmann::json(*ucx_4m) : nlohmann::json(nullptr);
  baselines["iperf3_gbps"] = base.iperf3 ? nlohmann::json(*base.iperf3) : nlohmann::json(nullptr);
  if (!base.ucx_missing.empty()) baselines["ucx_missing"] = base.ucx_missing;
  if (!base.iperf3_missing.empty()) baselines["iperf3_missing"] = base.iperf3_missing;

  if (!o.csv.empty()) {
    std::ofstream csv(o.csv);
    csv << "backend,model,pair,layout,staging,tokens,gbps,p50_ms,p99_ms,requests_per_s,"
           "x_memcpy,x_ucx_put,x_iperf3,x_equal_tp,x_naive,error\n";
    for (const auto& r : rows) {
      const auto num = [&](const char* k) {
        return r.contains(k) && !r[k].is_null() ? fmt::format("{:.4f}", r[k].get<double>())
                                                : std::string();
      };
      csv << fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},\"{}\"\n",
                         r["backend"].get<std::string>(), r["model"].get<std::string>(),
                         r["pair"].get<std::string>(), r["layout"].get<std::string>(),
                         r["staging"].get<std::string>(), r["tokens"].get<uint64_t>(), num("gbps"),
                         num("p50_ms"), num("p99_ms"), num("requests_per_s"), num("x_memcpy"),
                         num("x_ucx_put"), num("x_iperf3"), num("x_equal_tp"), num("x_naive"),
                         r.value("error", ""));
    }
  }
  if (!o.plot.empty() && !write_plot(rows, o.plot)) {
    std::fprintf(stderr, "pdkv bench: gnuplot failed (Debian package gnuplot-nox)\n");
    ++failures;
  }

  nlohmann::ordered_json out;
  out["baselines"] = baselines;
  out["scenarios"] = rows;
  if (o.json) {
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf(
        "baselines: memcpy (1 core) %s GB/s; ucx_perftest put 4 MiB %s GB/s; iperf3 %s GB/s\n",
        base.memcpy.empty() ? "-" : fmt::format("{:.2f}", base.memcpy.rbegin()->second).c_str(),
        ucx_4m ? fmt::format("{:.2f}", *ucx_4m).c_str() : base.ucx_missing.c_str(),
        base.iperf3 ? fmt::format("{:.2f}", *base.iperf3).c_str() : base.iperf3_missing.c_str());
    std::printf("%-13s %-10s %-5s %-4s %-6s %6s %8s %8s %8s %9s %7s %7s %7s %7s %7s\n", "backend",
                "model", "pair", "lay", "stage", "tokens", "GB/s", "p50 ms", "p99 ms", "req/s",
                "xmemcpy", "xucx", "xiperf3", "xequal", "xnaive");
    for (const auto& r : rows) {
      if (!r.contains("gbps")) {
        std::printf("%-13s %-10s %-5s %-4s %-6s %6llu  failed: %s\n",
                    r["backend"].get<std::string>().c_str(), r["model"].get<std::string>().c_str(),
                    r["pair"].get<std::string>().c_str(), r["layout"].get<std::string>().c_str(),
                    r["staging"].get<std::string>().c_str(),
                    static_cast<unsigned long long>(r["tokens"].get<uint64_t>()),
                    r["error"].get<std::string>().c_str());
        continue;
      }
      std::printf("%-13s %-10s %-5s %-4s %-6s %6llu %8.3f %8.2f %8.2f %9.1f %7s %7s %7s %7s %7s\n",
                  r["backend"].get<std::string>().c_str(), r["model"].get<std::string>().c_str(),
                  r["pair"].get<std::string>().c_str(), r["layout"].get<std::string>().c_str(),
                  r["staging"].get<std::string>().c_str(),
                  static_cast<unsigned long long>(r["tokens"].get<uint64_t>()),
                  r["gbps"].get<double>(), r["p50_ms"].get<double>(), r["p99_ms"].get<double>(),
                  r["requests_per_s"].get<double>(), fmt_ratio(r["x_memcpy"]).c_str(),
                  fmt_ratio(r["x_ucx_put"]).c_str(), fmt_ratio(r["x_iperf3"]).c_str(),
                  fmt_ratio(r["x_equal_tp"]).c_str(), fmt_ratio(r["x_naive"]).c_str());
      if (r.contains("error")) {
        std::printf("%13s ^ not whole: %s\n", "", r["error"].get<std::string>().c_str());
      }
    }
  }
  // With --json, stdout holds the run alone.
  stored->print_against(out, o.compare, o.json ? stderr : stdout);
  return failures == 0 ? kExitOk : kExitFailure;
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Benchmark the backends over heterogeneous TP against baselines from this run");
  cmd->add_flag("--quick", o->quick, "A smoke run: one model, TP 1->1 and 2->4, 256 tokens");
  cmd->add_option("--backends", o->backends,
                  "Comma-separated variants (nixl, mooncake, mooncake-tcp, mori, mori-tcp); "
                  "default: every one built");
  cmd->add_option("--models", o->models, "Only these presets (llama3-8b, gqa-2kv, mla-576)");
  cmd->add_option("--pairs", o->pairs, "Only these TP pairs, e.g. 1->1,2->4");
  cmd->add_option("--layouts", o->layouts, "Only these layouts (nhd, hnd)");
  cmd->add_option("--tokens", o->tokens,
                  "Only these prompt lengths (1024, 8192, 32768; 16 = one page)");
  cmd->add_flag("--json", o->json, "One JSON object on stdout instead of the table");
  cmd->add_option("--csv", o->csv, "Also write every scenario to this CSV file");
  cmd->add_option("--plot", o->plot, "Also draw GB/s across TP pairs per backend (PNG, gnuplot)");
  cmd->add_option("--timeout", o->timeout_s, "Give up on one scenario after this many seconds")
      ->capture_default_str();
  cmd->add_option("--repeat", o->repeat,
                  "Run each scenario this many times; the run of median GB/s is its row")
      ->check(CLI::Range(1u, 100u))
      ->capture_default_str();
  cmd->add_option("--compare", o->compare,
                  "A stored run (--json output): print each ratio against it, flagging any that "
                  "fell by more than 20 %");
  cmd->add_option("--results", o->results,
                  "With --compare: compare this stored run instead of running the grid");
  add_security_flags(*cmd, o->security);
  return {cmd, [o] { return run_bench(*o); }};
}

}  // namespace pdkv::cli

// `pdkv bench` as a user runs it. The smoke run (--quick) over every backend
// variant of this build; the byte counts it reports, derived here by hand;
// its CSV and plot; and refusal of bad input. No timing is asserted: ratios
// only have to exist and be positive.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "support/run_command.h"

namespace {

using pdkv::testing::run_command;

// llama3-8b: 32 layers x (K, V) x 8 heads x 128 x 2 bytes per token, summed
// over the decode ranks (each holds its heads once).
constexpr uint64_t kBytesPerToken = 32 * 2 * 8 * 128 * 2;

TEST(BenchCli, QuickRunReportsEveryScenarioWithRatios) {
  const std::string csv = ::testing::TempDir() + "bench_quick.csv";
  const auto r = run_command(std::string(PDKV_BIN) + " bench --quick --json --csv " + csv);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const auto& base = j["baselines"];
  // A figure that is missing fails here, naming itself, rather than throwing.
  const auto positive = [](const nlohmann::json& v) {
    return v.is_number() && v.get<double>() > 0;
  };
  ASSERT_FALSE(base["memcpy_gbps"].empty());
  for (const auto& [bytes, gbps] : base["memcpy_gbps"].items())
    EXPECT_TRUE(positive(gbps)) << bytes;
  // Debian's ucx-utils and iperf3 are installed by install-deps.sh: both ran.
  EXPECT_TRUE(positive(base["ucx_put_4mib_gbps"])) << base.dump() << "\n" << r.err;
  EXPECT_TRUE(positive(base["iperf3_gbps"])) << base.dump() << "\n" << r.err;

  const auto& rows = j["scenarios"];
  ASSERT_EQ(rows.size() % 4, 0u);  // four scenarios per backend variant
  std::set<std::string> variants;
  for (const auto& row : rows) {
    SCOPED_TRACE(row.dump());
    ASSERT_FALSE(row.contains("error"));
    variants.insert(row["backend"]);
    EXPECT_EQ(row["failed"], 0);
    EXPECT_TRUE(positive(row["gbps"]));
    EXPECT_TRUE(positive(row["x_memcpy"]));
    const uint64_t tokens = row["tokens"];
    // Measured requests per scenario, as the bench sizes them for --quick:
    // one page x 30 after 10 to warm up; 256 tokens: window 4 (32 MiB a
    // request) x 2, naive x 1, after one window to warm up.
    const uint64_t requests = tokens == 16 ? 30 : row["staging"] == "naive" ? 4 : 8;
    EXPECT_EQ(row["bytes"].get<uint64_t>(), requests * tokens * kBytesPerToken);
    EXPECT_EQ(row["warmup_requests"].get<uint64_t>(), tokens == 16 ? 10u : 4u);
    if (row["pair"] == "2->4" && row["staging"] == "on") {
      EXPECT_TRUE(positive(row["x_naive"]));
      EXPECT_TRUE(positive(row["x_equal_tp"]));
    }
    if (row["pair"] == "2->4") {
      // Four routes a request (each decode rank has one source), over the
      // warm-up's requests and the measured ones: all staged with staging
      // on, none with naive.
      const uint64_t routes = 4 * (4 + requests);
      const bool on = row["staging"] == "on";
      EXPECT_EQ(row["staged_routes"].get<uint64_t>(), on ? routes : 0u);
      EXPECT_EQ(row["direct_routes"].get<uint64_t>(), on ? 0u : routes);
    }
    const bool tcp = row["backend"].get<std::string>().ends_with("-tcp");
    EXPECT_EQ(row["x_iperf3"].is_null(), !tcp);
    EXPECT_EQ(row["x_ucx_put"].is_null(), row["backend"] != "nixl");
    const uint64_t request_bytes = tokens * kBytesPerToken;
    EXPECT_EQ(row["request_bytes"].get<uint64_t>(), request_bytes);
    if (row["backend"] == "nixl") {
      // UCX's put is measured at the request's own size, out of cache like
      // the request (here a power of two already: 2 MiB or 32 MiB).
      EXPECT_EQ(row["ucx_put_bytes"].get<uint64_t>(), request_bytes);
      const auto& put = base["ucx_put_gbps"][std::to_string(request_bytes)];
      ASSERT_TRUE(positive(put)) << base.dump();
      EXPECT_NEAR(row["x_ucx_put"].get<double>(), row["gbps"].get<double>() / put.get<double>(),
                  1e-9);
    }
  }
  EXPECT_TRUE(variants.count("mooncake") && variants.count("mooncake-tcp"));
  std::ifstream in(csv);
  std::string line;
  size_t lines = 0;
  while (std::getline(in, line)) ++lines;
  EXPECT_EQ(lines, rows.size() + 1);  // a header, then a line per scenario
}

TEST(BenchCli, PlotIsAPng) {
  const std::string png = ::testing::TempDir() + "bench_quick.png";
  std::remove(png.c_str());
  const auto r =
      run_command(std::string(PDKV_BIN) + " bench --quick --backends mooncake --plot " + png);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("mooncake"), std::string::npos) << r.out;  // the table
  std::ifstream in(png, std::ios::binary);
  char magic[8] = {};
  in.read(magic, sizeof magic);
  EXPECT_EQ(std::string(magic + 1, 3), "PNG");
}

// --repeat: each scenario runs that many times; the run of median GB/s is
// its row, and every run's GB/s is listed.
TEST(BenchCli, RepeatReportsTheRunOfMedianThroughput) {
  const auto r = run_command(std::string(PDKV_BIN) +
                             " bench --backends mooncake --models gqa-2kv --pairs '1->1' "
                             "--tokens 16 --repeat 3 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = nlohmann::json::parse(r.out)["scenarios"];
  ASSERT_EQ(rows.size(), 1u) << rows.dump();
  const auto& row = rows[0];
  auto runs = row["gbps_runs"].get<std::vector<double>>();
  ASSERT_EQ(runs.size(), 3u) << row.dump();
  std::sort(runs.begin(), runs.end());
  EXPECT_EQ(row["gbps"].get<double>(), runs[1]) << row.dump();
  EXPECT_EQ(row["failed"], 0) << row.dump();
}

TEST(BenchCli, RefusesARepeatOfZeroNamingIt) {
  const auto r = run_command(std::string(PDKV_BIN) + " bench --quick --repeat 0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--repeat"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("0"), std::string::npos) << r.err;
}

TEST(BenchCli, RefusesUnknownBackendsWithExitTwo) {
  const auto r = run_command(std::string(PDKV_BIN) + " bench --quick --backends carrier-pigeon");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("carrier-pigeon"), std::string::npos) << r.err;
}

// A scenario row of `pdkv bench --json`, written by hand.
nlohmann::json row(const std::string& pair, double iperf3, double naive, double memcpy) {
  return nlohmann::json{{"backend", "mooncake-tcp"},
                        {"model", "llama3-8b"},
                        {"pair", pair},
                        {"layout", "nhd"},
                        {"staging", "auto"},
                        {"tokens", 1024},
                        {"gbps", 1.0},
                        {"x_iperf3", iperf3},
                        {"x_naive", naive},
                        {"x_memcpy", memcpy},
                        {"x_ucx_put", nullptr}};
}

// The line of `ratio` under scenario `pair` in a comparison's output.
std::string line_of(const std::string& out, const std::string& ratio, const std::string& pair) {
  const size_t at = out.find(pair + " nhd auto 1024");
  const size_t start = at == std::string::npos ? at : out.find(ratio, at);
  return start == std::string::npos ? std::string()
                                    : out.substr(start, out.find('\n', start) - start);
}

// Two stored runs written by hand: x_iperf3 0.50 -> 0.39 fell (below 0.8 x
// 0.50 = 0.40), x_naive 10 -> 8.5 did not, x_memcpy 0.2 -> 0.25 rose; a
// scenario that fails now lost its figures (fell); the scenario only the
// new run has is listed as such.
TEST(BenchCli, CompareFlagsEveryRatioThatFellByMoreThanTwentyPercent) {
  const std::string dir = ::testing::TempDir();
  const std::string old_path = dir + "bench_old.json", new_path = dir + "bench_new.json";
  nlohmann::json failed = row("4->1", 0, 0, 0);  // ran before, fails now: no figures
  for (const char* key : {"gbps", "x_iperf3", "x_naive", "x_memcpy", "x_ucx_put"}) {
    failed.erase(key);
  }
  failed["error"] = "worker exited with status 1";
  std::ofstream(old_path) << nlohmann::json{
      {"baselines", {}}, {"scenarios", {row("1->1", 0.5, 10, 0.2), row("4->1", 0.6, 5, 0.1)}}};
  std::ofstream(new_path) << nlohmann::json{
      {"baselines", {}},
      {"scenarios", {row("1->1", 0.39, 8.5, 0.25), row("2->4", 1, 1, 1), failed}}};
  const auto r = run_command(std::string(PDKV_BIN) + " bench --compare " + old_path +
                             " --results " + new_path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto line = [&](const std::string& ratio, const std::string& pair = "1->1") {
    return line_of(r.out, ratio, pair);
  };
  for (const char* ratio : {"x_iperf3", "x_naive", "x_memcpy"}) {
    ASSERT_NE(line(ratio), "") << ratio << " missing: " << r.out;
  }
  EXPECT_NE(line("x_iperf3").find("FELL"), std::string::npos) << r.out;
  EXPECT_NE(line("x_iperf3").find("0.500 ->    0.390"), std::string::npos) << r.out;
  EXPECT_EQ(line("x_naive").find("FELL"), std::string::npos) << r.out;
  EXPECT_EQ(line("x_memcpy").find("FELL"), std::string::npos) << r.out;
  EXPECT_EQ(line("x_ucx_put"), "") << "a null ratio is no figure: " << r.out;
  EXPECT_NE(r.out.find("2->4 nhd auto 1024: not in the stored run"), std::string::npos) << r.out;
  // The failed scenario's three figures are gone: each counts as fallen.
  EXPECT_NE(line("x_naive", "4->1").find("5.000 ->     none  FELL"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("4 of 6 ratios fell by more than 20 %"), std::string::npos) << r.out;
}

// A scenario some of whose requests failed is no whole measurement: the new
// run's row (its "error" says how many) counts each of its ratios as fallen,
// unchanged as they are; a stored row of a run from before rows said so
// (only "failed") is named as such beside ratios that hold.
TEST(BenchCli, CompareFlagsTheRatiosOfAScenarioThatLostRequests) {
  const std::string dir = ::testing::TempDir();
  const std::string old_path = dir + "bench_old_lost.json", new_path = dir + "bench_new_lost.json";
  nlohmann::json stored_lost = row("2->4", 0.4, 4, 0.1);
  stored_lost["failed"] = 3;
  nlohmann::json lost_now = row("1->1", 0.5, 10, 0.2);
  lost_now["failed"] = 2;
  lost_now["error"] = "2 of 40 requests failed; the first: request 7: timed out";
  std::ofstream(old_path) << nlohmann::json{
      {"baselines", {}}, {"scenarios", {row("1->1", 0.5, 10, 0.2), stored_lost}}};
  std::ofstream(new_path) << nlohmann::json{{"baselines", {}},
                                            {"scenarios", {lost_now, row("2->4", 0.4, 4, 0.1)}}};
  const auto r = run_command(std::string(PDKV_BIN) + " bench --compare " + old_path +
                             " --results " + new_path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* ratio : {"x_iperf3", "x_naive", "x_memcpy"}) {
    const std::string now = line_of(r.out, ratio, "1->1"), then = line_of(r.out, ratio, "2->4");
    EXPECT_NE(now.find("x1.00  FELL (now: 2 of 40 requests failed; the first: request 7"),
              std::string::npos)
        << r.out;
    EXPECT_EQ(then.find("FELL"), std::string::npos) << r.out;
    EXPECT_NE(then.find("x1.00 (stored: 3 requests failed)"), std::string::npos) << r.out;
  }
  EXPECT_NE(r.out.find("3 of 6 ratios fell by more than 20 %"), std::string::npos) << r.out;
}

TEST(BenchCli, CompareNamesAStoredRunItCannotUse) {
  const std::string bad = ::testing::TempDir() + "bench_not_json.json";
  std::ofstream(bad) << "{ not json";
  auto r = run_command(std::string(PDKV_BIN) + " bench --quick --compare " + bad);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--compare " + bad + ": not JSON"), std::string::npos) << r.err;
  r = run_command(std::string(PDKV_BIN) + " bench --quick --compare /nonexistent/old.json");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--compare /nonexistent/old.json: cannot read it"), std::string::npos)
      << r.err;
}

}  // namespace

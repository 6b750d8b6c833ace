// End to end through real processes: `pdkv run` starts bootstrap, prefill
// and decode ranks; decode ranks check every byte. Expected byte counts are
// derived here by hand from the shape, not taken from the code under test.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "support/run_command.h"

extern char** environ;

namespace pdkv {
namespace {

using namespace std::chrono_literals;

struct Case {
  std::string name;
  uint32_t heads = 8, prefill_tp = 1, decode_tp = 1;
  bool mla = false;
  std::string layout = "nhd";
  uint32_t chunks = 1;
  std::string staging = "auto";
  std::string backend = "nixl";
  std::string backend_flags = "";  // e.g. "--backend-opt same_host=off --rails 3"
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

constexpr uint32_t kRequests = 6, kTokens = 40, kPageSize = 8, kHeadDim = 16, kLayers = 3,
                   kDtype = 2;

class RunMatrix : public ::testing::TestWithParam<Case> {};

TEST_P(RunMatrix, EveryRequestVerified) {
  const Case& c = GetParam();
  const std::string cmd =
      std::string(PDKV_BIN) + " run --json --backend " + c.backend + " " + c.backend_flags +
      " --kv-heads " + std::to_string(c.heads) + " --prefill-tp " + std::to_string(c.prefill_tp) +
      " --decode-tp " + std::to_string(c.decode_tp) + " --layout " + c.layout + " --chunks " +
      std::to_string(c.chunks) + " --staging " + c.staging + (c.mla ? " --mla" : "") +
      " --requests " + std::to_string(kRequests) + " --tokens " + std::to_string(kTokens) +
      " --page-size " + std::to_string(kPageSize) + " --head-dim " + std::to_string(kHeadDim) +
      " --layers " + std::to_string(kLayers) + " --dtype-bytes " + std::to_string(kDtype) +
      " --window 2 --timeout 120";
  const auto r = testing::run_command(cmd);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["verified"].get<bool>());
  EXPECT_EQ(j["requests"], kRequests);
  EXPECT_EQ(j["failed"], 0);
  // Each decode rank holds max(H, D) / D heads (one under GQA replication),
  // so the ranks together receive max(H, D) head vectors per token; MLA: D.
  const uint64_t heads_received = c.mla ? c.decode_tp : std::max(c.heads, c.decode_tp);
  const uint64_t pages = (kTokens + kPageSize - 1) / kPageSize;
  const uint64_t buffers = kLayers * (c.mla ? 1 : 2);
  EXPECT_EQ(j["bytes"].get<uint64_t>(),
            uint64_t{kRequests} * buffers * pages * kPageSize * heads_received * kHeadDim * kDtype);
  for (const char* key : {"gbps", "p50_ms", "p99_ms"}) EXPECT_TRUE(j.contains(key)) << key;
  if (c.staging == "on") {
    EXPECT_GT(j["staged_routes"].get<uint64_t>(), 0u);
    EXPECT_EQ(j["direct_routes"].get<uint64_t>(), 0u);
  } else if (c.staging == "off") {
    EXPECT_EQ(j["staged_routes"].get<uint64_t>(), 0u);
  }
}

// The matrix every backend runs.
std::vector<Case> matrix(const std::string& backend, const std::string& backend_flags = "") {
  std::vector<Case> cases = {Case{"h8_tp4_to_2", 8, 4, 2},
                             Case{"h8_tp2_to_4", 8, 2, 4},
                             Case{"h2_tp1_to_4_gqa", 2, 1, 4},
                             Case{"h8_tp2_to_2_equal", 8, 2, 2},
                             Case{"mla_tp4_to_2", 1, 4, 2, true},
                             Case{"mla_tp2_to_4", 1, 2, 4, true},
                             Case{"hnd_h8_tp2_to_4", 8, 2, 4, false, "hnd"},
                             Case{"hnd_h2_tp1_to_4", 2, 1, 4, false, "hnd"},
                             Case{"chunked_h8_tp4_to_2", 8, 4, 2, false, "nhd", 3},
                             Case{"staging_off_h8_tp2_to_4", 8, 2, 4, false, "nhd", 1, "off"},
                             Case{"staging_on_h8_tp4_to_2", 8, 4, 2, false, "nhd", 1, "on"},
                             Case{"staging_on_h2_tp1_to_4", 2, 1, 4, false, "nhd", 1, "on"},
                             Case{"staging_on_mla_tp2_to_4", 1, 2, 4, true, "nhd", 1, "on"},
                             Case{"staging_on_chunked_hnd", 8, 2, 4, false, "hnd", 3, "on"}};
  for (Case& c : cases) {
    c.backend = backend;
    c.backend_flags = backend_flags;
  }
  return cases;
}

#ifdef PDKV_WITH_NIXL
INSTANTIATE_TEST_SUITE_P(Nixl, RunMatrix, ::testing::ValuesIn(matrix("nixl")));
// UCX's network path: every byte over TCP, with UCX's peer error handling.
INSTANTIATE_TEST_SUITE_P(NixlTcp, RunMatrix,
                         ::testing::ValuesIn(matrix("nixl", "--backend-opt tls=tcp")));
#endif
// Same host: process_vm_writev. TCP: three rails striped over loopback.
INSTANTIATE_TEST_SUITE_P(Mooncake, RunMatrix, ::testing::ValuesIn(matrix("mooncake")));
INSTANTIATE_TEST_SUITE_P(MooncakeTcp, RunMatrix,
                         ::testing::ValuesIn(matrix("mooncake",
                                                    "--backend-opt same_host=off --rails 3")));
#ifdef PDKV_WITH_MORI
// The default (auto) picks shm between ranks on this host; tcp;ofi_rxm by name.
INSTANTIATE_TEST_SUITE_P(Mori, RunMatrix, ::testing::ValuesIn(matrix("mori")));
INSTANTIATE_TEST_SUITE_P(MoriTcp, RunMatrix,
                         ::testing::ValuesIn(matrix("mori", "--provider 'tcp;ofi_rxm'")));
#endif

TEST(Run, RefusesBadInputWithExitTwo) {
  auto r = testing::run_command(std::string(PDKV_BIN) + " run --kv-heads 8 --prefill-tp 3");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("8 KV heads cannot be split over prefill TP 3"), std::string::npos) << r.err;
  r = testing::run_command(std::string(PDKV_BIN) + " run --backend carrier-pigeon --requests 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("no transport backend named 'carrier-pigeon'"), std::string::npos) << r.err;
}

// --warmup: the first requests move and are verified, but only the rest
// count in the figures. 4 layers x K+V x 8 heads x 128 x 2 B = 16 KiB a
// token; 6 requests of 32 tokens, 2 of them warm-up.
TEST(Run, WarmupRequestsMoveButAreNotMeasured) {
  auto r = testing::run_command(
      std::string(PDKV_BIN) + " run --backend mooncake --requests 6 --warmup 2 --tokens 32 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["verified"], true);
  EXPECT_EQ(j["bytes"].get<uint64_t>(), 6u * 32 * 16384);
  EXPECT_EQ(j["measured_bytes"].get<uint64_t>(), 4u * 32 * 16384);
  EXPECT_EQ(j["warmup"].get<uint64_t>(), 2u);
  r = testing::run_command(std::string(PDKV_BIN) + " run --requests 3 --warmup 3");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--warmup 3 leaves none of the 3 requests to measure"), std::string::npos)
      << r.err;
}

// --decode-engines 3: one prefill engine feeds three decode engines of TP 2,
// room r going to decode-((r - 1) mod 3). Every room is received by exactly
// one engine: 30 requests x 32 tokens x 16 KiB a token (4 layers x K+V x 8
// heads x 128 x 2 B) in all, each byte checked by the engine's ranks. With
// a window of 2, each engine's ranks reuse their slots several times.
TEST(Run, DecodeEnginesTakeTheRequestsRoundRobin) {
  const auto r = testing::run_command(std::string(PDKV_BIN) +
                                      " run --backend mooncake --decode-engines 3 --decode-tp 2 "
                                      "--requests 30 --window 2 --tokens 32 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["verified"], true);
  EXPECT_EQ(j["decode_engines"], 3);
  EXPECT_EQ(j["bytes"].get<uint64_t>(), 30u * 32 * 16384);
  const char* engines[] = {"decode-0", "decode-1", "decode-2"};
  ASSERT_EQ(j["outcomes"].size(), 30u);
  for (size_t i = 0; i < 30; ++i) {
    EXPECT_EQ(j["outcomes"][i]["room"], i + 1);
    EXPECT_EQ(j["outcomes"][i]["decode_engine"], engines[i % 3]) << j["outcomes"][i];
    EXPECT_EQ(j["outcomes"][i]["ok"], true);
  }
}

// A decode rank started by hand names one of the run's decode engines.
TEST(Run, AWorkerRefusesAnEngineIdThatIsNotTheRuns) {
  const auto r = testing::run_command(std::string(PDKV_BIN) +
                                      " decode --decode-engines 2 --engine-id decode-2 --tp-rank 0 "
                                      "--bootstrap 127.0.0.1:1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--engine-id 'decode-2' is no decode engine of this run (--decode-engines "
                       "2: decode-0 ... decode-1)"),
            std::string::npos)
      << r.err;
}

// The pids of `parent`'s children whose command line contains `needle`.
std::vector<pid_t> children_of(pid_t parent, const std::string& needle) {
  std::vector<pid_t> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string pid, comm, state;
    pid_t ppid = 0;
    stat >> pid >> comm >> state >> ppid;
    if (ppid != parent) continue;
    std::ifstream cmdline(entry.path() / "cmdline");
    std::string args((std::istreambuf_iterator<char>(cmdline)), {});
    std::replace(args.begin(), args.end(), '\0', ' ');
    if (args.find(needle) != std::string::npos) out.push_back(std::stoi(name));
  }
  return out;
}

// A backend and its options ("--backend-opt k=v" pairs, or none).
struct Victim {
  std::string backend;
  std::vector<std::string> options;
};
void PrintTo(const Victim& v, std::ostream* os) {
  *os << v.backend;
  for (const auto& o : v.options) *os << " " << o;
}

class KilledWorker : public ::testing::TestWithParam<Victim> {};

// A long `pdkv run` (100,000 requests) of `backend`, P 2 -> D 2, whose
// stderr (its progress) comes through `err`; -1 when it cannot start.
pid_t start_long_run(const std::string& backend, const std::vector<std::string>& options,
                     int& err) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return -1;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  std::vector<std::string> args = {
      PDKV_BIN,      "run", "--backend",  backend,  "--prefill-tp", "2",
      "--decode-tp", "2",   "--requests", "100000", "--tokens",     "64",
      "--head-dim",  "16",  "--layers",   "2",      "--timeout",    "120"};
  for (const auto& option : options) {
    args.push_back("--backend-opt");
    args.push_back(option);
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t run = -1;
  if (posix_spawn(&run, PDKV_BIN, &actions, nullptr, argv.data(), environ) != 0) run = -1;
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  err = fds[0];
  return run;
}

// Reads `err` into `log` until the run reports finished requests; false if
// it ended first.
bool wait_for_requests(int err, std::string& log) {
  char buf[4096];
  while (log.find("requests done") == std::string::npos) {
    const ssize_t n = read(err, buf, sizeof buf);
    if (n <= 0) return false;
    log.append(buf, n);
  }
  return true;
}

TEST_P(KilledWorker, FailsTheRunNamingTheRank) {
  int err = -1;
  const pid_t run = start_long_run(GetParam().backend, GetParam().options, err);
  ASSERT_GT(run, 0);
  // Wait until requests flow, then kill decode rank 1.
  std::string log;
  ASSERT_TRUE(wait_for_requests(err, log)) << "pdkv run ended early: " << log;
  const auto victims = children_of(run, "decode --engine-id decode ");
  std::vector<pid_t> rank1;
  for (pid_t p : victims) {
    std::ifstream cmdline("/proc/" + std::to_string(p) + "/cmdline");
    std::string a((std::istreambuf_iterator<char>(cmdline)), {});
    std::replace(a.begin(), a.end(), '\0', ' ');
    if (a.find("--tp-rank 1 ") != std::string::npos) rank1.push_back(p);
  }
  ASSERT_EQ(rank1.size(), 1u) << log;
  kill(rank1[0], SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  int status = 0;
  while (waitpid(run, &status, WNOHANG) == 0) {
    ASSERT_LT(std::chrono::steady_clock::now() - killed, 10s) << "pdkv run did not notice";
    std::this_thread::sleep_for(10ms);
  }
  char buf[4096];
  ssize_t n;
  while ((n = read(err, buf, sizeof buf)) > 0) log.append(buf, n);
  close(err);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
  EXPECT_NE(log.find("pdkv run: decode rank 1 (pid " + std::to_string(rank1[0]) +
                     ") died: killed by signal 9"),
            std::string::npos)
      << log;
}

// The router killed outright (it can clean nothing up): the bootstrap
// service and every rank it started end too, within seconds, rather than
// hold their ports and pools. This process adopts them (a subreaper), so it
// can reap them, and end any left over by pid.
TEST(Run, ItsProcessesEndWhenTheRouterIsKilled) {
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  int err = -1;
  const pid_t run = start_long_run("mooncake", {}, err);
  ASSERT_GT(run, 0);
  std::string log;
  ASSERT_TRUE(wait_for_requests(err, log)) << "pdkv run ended early: " << log;
  std::vector<pid_t> started = children_of(run, PDKV_BIN);
  ASSERT_EQ(started.size(), 5u) << "bootstrap + 2 prefill + 2 decode ranks; " << log;
  kill(run, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(run, &status, 0), run);
  close(err);

  const auto killed = std::chrono::steady_clock::now();
  std::vector<pid_t> left = started;
  while (!left.empty() && std::chrono::steady_clock::now() - killed < 10s) {
    std::erase_if(left, [&](pid_t p) { return waitpid(p, &status, WNOHANG) == p; });
    std::this_thread::sleep_for(10ms);
  }
  for (pid_t p : left) {  // still running: ended here, and the test fails
    kill(p, SIGKILL);
    waitpid(p, &status, 0);
  }
  EXPECT_TRUE(left.empty()) << left.size() << " of " << started.size()
                            << " processes outlived the router by 10 s";
}

#ifdef PDKV_WITH_NIXL
// Over UCX's TCP transport a killed rank once aborted the prefill process
// (UCX re-entered from its own error callback): both error-handling modes.
INSTANTIATE_TEST_SUITE_P(Nixl, KilledWorker,
                         ::testing::Values(Victim{"nixl", {}}, Victim{"nixl", {"tls=tcp"}},
                                           Victim{"nixl", {"tls=tcp", "error_handling=none"}}));
#endif
INSTANTIATE_TEST_SUITE_P(Mooncake, KilledWorker, ::testing::Values(Victim{"mooncake", {}}));
#ifdef PDKV_WITH_MORI
INSTANTIATE_TEST_SUITE_P(Mori, KilledWorker, ::testing::Values(Victim{"mori", {}}));
#endif

}  // namespace
}  // namespace pdkv

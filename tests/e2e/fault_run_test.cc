// `pdkv run` with injected faults (--fault) through real processes: with
// --keep-going a failed request is counted with its reason and the run goes
// on; it succeeds as long as every request that succeeded was verified (and
// nothing landed in a failed request's pages) and no worker crashed.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "support/child_process.h"
#include "support/run_command.h"

namespace pdkv {
namespace {

std::string run_line(const std::string& backend, const std::string& extra) {
  return std::string(PDKV_BIN) + " run --json --backend " + backend +
         " --prefill-tp 2 --decode-tp 2 --kv-heads 4 --requests 30 --tokens 32 --page-size 8 "
         "--head-dim 16 --layers 2 --window 4 --engine-timeout transfer=1000 --timeout 120 " +
         extra;
}

class FaultRun : public ::testing::TestWithParam<std::string> {};

TEST_P(FaultRun, KeepGoingCountsEveryFailedRequestWithItsReason) {
  const auto r =
      testing::run_command(run_line(GetParam(),
                                    "--fault fail_batch=0.15 --fault delay_us=500 --fault seed=5 "
                                    "--keep-going"));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["verified"].get<bool>()) << r.out;
  const auto& outcomes = j["outcomes"];
  ASSERT_EQ(outcomes.size(), 30u);
  uint64_t failed = 0;
  for (size_t i = 0; i < outcomes.size(); ++i) {
    EXPECT_EQ(outcomes[i]["room"].get<uint64_t>(), i + 1);  // in issue order
    if (outcomes[i]["ok"].get<bool>()) {
      EXPECT_EQ(outcomes[i]["reason"], "");
    } else {
      ++failed;
      EXPECT_NE(outcomes[i]["reason"].get<std::string>().find("injected fault (fail_batch)"),
                std::string::npos)
          << outcomes[i];
    }
  }
  EXPECT_EQ(j["failed"].get<uint64_t>(), failed);
  EXPECT_GT(failed, 0u);
  EXPECT_LT(failed, 30u);
}

TEST_P(FaultRun, WithoutKeepGoingAFailedRequestFailsTheRun) {
  const auto r =
      testing::run_command(run_line(GetParam(), "--fault fail_batch=0.3 --fault seed=5"));
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_FALSE(j["verified"].get<bool>());
  EXPECT_GT(j["failed"].get<uint64_t>(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Mooncake, FaultRun, ::testing::Values("mooncake"));
#ifdef PDKV_WITH_NIXL
INSTANTIATE_TEST_SUITE_P(Nixl, FaultRun, ::testing::Values("nixl"));
#endif
#ifdef PDKV_WITH_MORI
INSTANTIATE_TEST_SUITE_P(Mori, FaultRun, ::testing::Values("mori"));
#endif

TEST(FaultRun, BadFaultsAreRefusedNamingThePair) {
  auto r = testing::run_command(std::string(PDKV_BIN) + " run --fault fail_batch=2");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("fault fail_batch=2: expected a probability in [0, 1]"), std::string::npos)
      << r.err;
  r = testing::run_command(std::string(PDKV_BIN) + " run --engine-timeout transfer=soon");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--engine-timeout option transfer=soon"), std::string::npos) << r.err;
}

// A decode rank the user kills in a run that keeps going: the run goes on,
// names the worker, and counts the requests that rank did not finish.
TEST(FaultRun, KeepGoingOutlivesAWorkerTheUserKills) {
  testing::ChildProcess run(
      {PDKV_BIN, "run", "--backend", "mooncake", "--prefill-tp", "1", "--decode-tp", "2",
       "--requests", "16", "--tokens", "32", "--head-dim", "16", "--layers", "2", "--keep-going",
       "--engine-timeout", "data=3000", "--engine-timeout", "keepalive=500", "--engine-timeout",
       "transfer=1000",
       // 100 ms a batch: the run lasts long enough to be cut.
       "--fault", "delay_us=100000", "--window", "2", "--json", "--timeout", "120"});
  ASSERT_GT(run.pid(), 0);
  // The decode rank 1 process, once the router started it.
  pid_t victim = -1;
  for (int tries = 0; tries < 2000 && victim < 0; ++tries) {
    const auto r = testing::run_command("pgrep -P " + std::to_string(run.pid()) +
                                        " -f 'decode .*--tp-rank 1 '");
    if (r.exit_code == 0) victim = std::stoi(r.out);
    usleep(5000);  // the router's start-up, not a synchronisation: pgrep is the test
  }
  ASSERT_GT(victim, 0);
  usleep(500000);  // the workers' start-up; then any moment mid-run will do
  kill(victim, SIGKILL);
  const std::string summary = run.read_line(std::chrono::seconds(120));
  const int status = run.wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  const auto j = nlohmann::json::parse(summary, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << summary;
  ASSERT_EQ(j["lost_workers"].size(), 1u) << j;
  EXPECT_EQ(j["lost_workers"][0]["name"].get<std::string>(),
            "decode rank 1 (pid " + std::to_string(victim) + ")");
  EXPECT_EQ(j["lost_workers"][0]["how"], "killed by signal 9 (Killed)");
  uint64_t failed = 0;
  for (const auto& o : j["outcomes"]) failed += o["ok"].get<bool>() ? 0 : 1;
  EXPECT_GT(failed, 0u);
  EXPECT_EQ(j["failed"].get<uint64_t>(), failed);
}

}  // namespace
}  // namespace pdkv

// `pdkv topology` as an operator runs it against a live bootstrap service
// (in this process): a JSON line per engine, exit 1 naming what is missing,
// and --wait, which asks again until every rank has registered.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "bootstrap/client.h"
#include "pdkv/bootstrap.h"
#include "support/child_process.h"
#include "support/rank_info.h"
#include "support/run_command.h"

namespace pdkv {
namespace {

using namespace std::chrono_literals;
using testing::registered_rank;

class TopologyCli : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::move(BootstrapServer::start("127.0.0.1:0")).value();
    address_ = "127.0.0.1:" + std::to_string(server_->port());
  }
  void register_rank(const std::string& engine, uint32_t tp, uint32_t tp_size) {
    auto r = registered_rank(tp, tp_size);
    r.set_engine_id(engine);
    ASSERT_TRUE(bootstrap::Client(address_, Security{}).register_rank(r, 5s).is_ok());
  }
  std::string command(const std::string& args) const {
    return std::string(PDKV_BIN) + " topology --bootstrap " + address_ + " " + args;
  }
  // The tp_rank of each rank on one JSON line of its output, in order.
  static std::string tp_ranks(const std::string& line) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("ranks")) return "not a topology: " + line;
    std::string out = j["engine"].get<std::string>() + ":";
    for (const auto& r : j["ranks"]) out += " " + std::to_string(r["tp_rank"].get<uint32_t>());
    return out;
  }

  std::unique_ptr<BootstrapServer> server_;
  std::string address_;
};

TEST_F(TopologyCli, OneLinePerEngineAndExitOneNamingWhatIsMissing) {
  register_rank("prefill-a", 1, 2);
  register_rank("prefill-a", 0, 2);
  register_rank("decode-b", 0, 2);
  const auto r = testing::run_command(
      command("--engine prefill-a --engine decode-b --engine decode-c --timeout 5"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(tp_ranks(r.out.substr(0, r.out.find('\n'))), "prefill-a: 0 1");
  EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << r.out;  // the incomplete ones print nothing
  EXPECT_EQ(r.err, "pdkv topology: bootstrap " + address_ +
                       " GetTopology: engine 'decode-b' dp 0: 1 of 2 ranks registered\n"
                       "pdkv topology: bootstrap " +
                       address_ +
                       " GetTopology: no rank of engine 'decode-c' dp 0 has registered\n");
}

TEST_F(TopologyCli, WaitAsksAgainUntilEveryRankOfEveryEngineHasRegistered) {
  register_rank("prefill-a", 0, 2);
  // stderr into the same pipe: each reason to wait is one line, said once.
  testing::ChildProcess topology(
      {"/bin/sh", "-c",
       command("--engine prefill-a --engine decode-b --wait --timeout 60") + " 2>&1"});
  const std::string prefix = "pdkv topology: bootstrap " + address_ + " GetTopology: ";
  EXPECT_EQ(topology.read_line(30s),
            prefix + "engine 'prefill-a' dp 0: 1 of 2 ranks registered; asking again");
  register_rank("prefill-a", 1, 2);
  EXPECT_EQ(tp_ranks(topology.read_line(30s)), "prefill-a: 0 1");
  EXPECT_EQ(topology.read_line(30s),
            prefix + "no rank of engine 'decode-b' dp 0 has registered; asking again");
  register_rank("decode-b", 0, 1);
  EXPECT_EQ(tp_ranks(topology.read_line(30s)), "decode-b: 0");
  const auto status = topology.wait_for(30s);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << *status;
}

TEST_F(TopologyCli, WaitEndsAtTheTimeoutNamingWhatIsStillMissing) {
  register_rank("prefill-a", 0, 2);
  const auto r = testing::run_command(command("--engine prefill-a --wait --timeout 0.5"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  const std::string missing = "engine 'prefill-a' dp 0: 1 of 2 ranks registered";
  EXPECT_EQ(r.err, "pdkv topology: bootstrap " + address_ + " GetTopology: " + missing +
                       "; asking again\npdkv topology: bootstrap " + address_ +
                       " GetTopology: " + missing + "\n");
}

TEST_F(TopologyCli, ANonPositiveTimeoutIsRefusedNamingIt) {
  const auto r = testing::run_command(command("--engine prefill-a --timeout 0"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "pdkv topology: --timeout 0: must be more than 0 seconds\n");
}

}  // namespace
}  // namespace pdkv

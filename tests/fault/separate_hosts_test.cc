// Ranks on separate hosts, as the README's run-book starts them: bootstrap
// and prefill ranks on host A, decode ranks on host B (network namespaces
// joined by a veth pair), each rank on its own address (--host), every
// backend on its network path: nixl with UCX_TLS=tcp, mooncake without its
// same-host shortcut, mori on tcp;ofi_rxm. Decode ranks check every byte,
// and the kernel's counters show the bytes crossed the link.
#include <gtest/gtest.h>

#include "fault/hosts.h"

namespace pdkv {
namespace {

using namespace std::chrono_literals;
using testing::Hosts;

struct Path {
  std::string name, backend;
  std::vector<std::string> flags;
  std::map<std::string, std::string> env;
  uint32_t prefill_tp, decode_tp;
};
void PrintTo(const Path& p, std::ostream* os) { *os << p.name; }

std::vector<Path> paths() {
  std::vector<Path> out;
  for (auto [p, d] : {std::pair{2u, 4u}, {4u, 2u}}) {
    const std::string tp = "_tp" + std::to_string(p) + "_to_" + std::to_string(d);
#ifdef PDKV_WITH_NIXL
    out.push_back({"nixl_ucx_tcp" + tp, "nixl", {}, {{"UCX_TLS", "tcp"}}, p, d});
#endif
    out.push_back({"mooncake_tcp" + tp, "mooncake", {"--backend-opt", "same_host=off"}, {}, p, d});
#ifdef PDKV_WITH_MORI
    out.push_back({"mori_tcp_rxm" + tp, "mori", {"--provider", "tcp;ofi_rxm"}, {}, p, d});
#endif
  }
  return out;
}

class SeparateHosts : public ::testing::TestWithParam<Path> {};

TEST_P(SeparateHosts, EveryByteCrossesTheLinkAndArrives) {
  const Path& path = GetParam();
  Hosts hosts;
  if (!hosts.why_not().empty()) GTEST_SKIP() << hosts.why_not();
  ASSERT_TRUE(hosts.ok());
  const std::string bootstrap = hosts.start_bootstrap();
  ASSERT_FALSE(bootstrap.empty());

  constexpr uint32_t kRequests = 12;
  std::vector<std::string> shape = {"--backend",    path.backend,
                                    "--prefill-tp", std::to_string(path.prefill_tp),
                                    "--decode-tp",  std::to_string(path.decode_tp),
                                    "--kv-heads",   "8",
                                    "--requests",   std::to_string(kRequests),
                                    "--tokens",     "100",
                                    "--page-size",  "16",
                                    "--head-dim",   "32",
                                    "--layers",     "2",
                                    "--window",     "4"};
  shape.insert(shape.end(), path.flags.begin(), path.flags.end());
  auto worker = [&](char host, const char* role, uint32_t rank) -> testing::ChildProcess& {
    std::vector<std::string> argv = {PDKV_BIN, role};
    argv.insert(argv.end(), shape.begin(), shape.end());
    for (const std::string& s :
         {std::string("--tp-rank"), std::to_string(rank), std::string("--bootstrap"), bootstrap,
          std::string("--host"), Hosts::address(host)}) {
      argv.push_back(s);
    }
    return hosts.start(host, argv, path.env);
  };
  std::vector<testing::ChildProcess*> prefill, decode;
  for (uint32_t r = 0; r < path.prefill_tp; ++r) prefill.push_back(&worker('a', "prefill", r));
  for (uint32_t r = 0; r < path.decode_tp; ++r) decode.push_back(&worker('b', "decode", r));

  uint64_t bytes = 0;
  for (size_t r = 0; r < decode.size(); ++r) {
    const auto j = testing::summary_of(*decode[r]);
    ASSERT_FALSE(j.is_discarded()) << "decode rank " << r << " printed no summary";
    EXPECT_TRUE(j["verified"].get<bool>()) << "decode rank " << r << ": " << j;
    EXPECT_EQ(j["succeeded"].get<uint64_t>(), kRequests) << j;
    bytes += j["bytes"].get<uint64_t>();
  }
  for (size_t r = 0; r < prefill.size(); ++r) {
    const auto j = testing::summary_of(*prefill[r]);
    ASSERT_FALSE(j.is_discarded()) << "prefill rank " << r << " printed no summary";
    EXPECT_EQ(j["failed"].get<uint64_t>(), 0u) << "prefill rank " << r << ": " << j;
  }
  // 12 requests x 2 layers x K/V x 112 tokens x 8 heads x 32 x 2 B.
  EXPECT_EQ(bytes, uint64_t{kRequests} * 2 * 2 * 112 * 8 * 32 * 2);
  // The KV bytes crossed the link: host B's end received at least as many
  // (the kernel's counter, not ours).
  const auto rx = testing::run_command("ip netns exec " + hosts.ns('b') +
                                       " cat /sys/class/net/fb0/statistics/rx_bytes");
  ASSERT_EQ(rx.exit_code, 0) << rx.err;
  EXPECT_GE(std::stoull(rx.out), bytes);
}

INSTANTIATE_TEST_SUITE_P(Backends, SeparateHosts, ::testing::ValuesIn(paths()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace pdkv

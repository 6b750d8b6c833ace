// A failure decided while the peer is cut off reaches the peer once the link
// is back (docs/reliability.md, item 3), even when the first notice of it,
// sent over a fresh link during the cut, was lost too. Host A runs the
// bootstrap service and a prefill peer, host B a decode peer
// (pdkv_test_peer, mooncake over TCP); link 0 carries everything.
//
// The case the fault campaign met (a prefill room then waited its whole data
// timeout, holding its window, and every later room queued behind it): the
// decode rank fails a room when its control link to the source dies, tells
// the source over a fresh link, and that link is given up after a keepalive
// period of refusals while the cut lasts.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "fault/hosts.h"
#include "support/peer_process.h"

namespace pdkv {
namespace {

using namespace std::chrono_literals;
using testing::Hosts;
using testing::PeerProcess;

constexpr int kKeepaliveMs = 1000;

std::unique_ptr<PeerProcess> peer(const Hosts& hosts, char host, const std::string& role,
                                  const std::string& bootstrap) {
  const std::string address = Hosts::address(host);
  return std::make_unique<PeerProcess>(
      role, bootstrap, 0, "mooncake", kKeepaliveMs,
      std::vector<std::string>{address, "host=" + address, "same_host=off"}, hosts.exec_in(host));
}

TEST(CutOff, AFailureDecidedDuringTheCutReachesThePeerAfterItsFirstNoticeWasLost) {
  Hosts hosts;
  if (!hosts.why_not().empty()) GTEST_SKIP() << hosts.why_not();
  ASSERT_TRUE(hosts.ok());
  const std::string bootstrap = hosts.start_bootstrap();
  ASSERT_FALSE(bootstrap.empty());
  // Declared after `hosts`, so ended (by pid) before its namespaces go.
  auto prefill = peer(hosts, 'a', "prefill", bootstrap);
  auto decode = peer(hosts, 'b', "decode", bootstrap);
  ASSERT_TRUE(prefill->ready());
  ASSERT_TRUE(decode->ready());

  // Room 1 while the link is up: each side knows the other.
  ASSERT_EQ(decode->open(1), "");
  ASSERT_EQ(prefill->serve(1), "ok");
  ASSERT_EQ(decode->wait(1, 10s), "ok");

  ASSERT_TRUE(hosts.link(0, false));
  // Room 2's metadata goes out as the link is cut: the decode rank fails the
  // room once its control link to the source is declared lost.
  ASSERT_EQ(decode->open(2), "");
  const std::string decoded = decode->wait(2, 15s);
  EXPECT_NE(decoded.find("control connection to prefill"), std::string::npos) << decoded;
  // The fault's duration, not a wait for anything: the cut outlasts the
  // fresh link of the first notice (a keepalive period of refusals).
  std::this_thread::sleep_for(std::chrono::milliseconds(kKeepaliveMs * 9 / 5));
  ASSERT_TRUE(hosts.link(0, true));

  // The source opens room 2 now: it hears of the failure, and does not wait
  // its data timeout (120 s) for metadata that will never come.
  ASSERT_EQ(prefill->open(2), "");
  const std::string source = prefill->wait(2, 10s);
  EXPECT_NE(source.find("decode dp 0 tp 0 pp 0 aborted room 2"), std::string::npos) << source;
}

}  // namespace
}  // namespace pdkv

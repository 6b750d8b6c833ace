// Same-host (shm) peers of the mori engine are watched by their process
// (peer_process.h): a peer whose process exits is named at once, and a post
// that waits on a gone peer's lock is recognised as stuck for good. The
// pids come from child processes started here.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <string>

#include "fabric_endpoint.h"
#include "io_engine.h"
#include "peer_process.h"
#include "support/child_process.h"
#include "support/poll.h"

namespace pdkv::backends::mori {
namespace {

using namespace std::chrono_literals;

TEST(ShmAddressPid, IsReadFromTheRegionName) {
  EXPECT_EQ(shm_address_pid("fi_shm://1234:1000:0"), 1234);
  EXPECT_EQ(shm_address_pid("1234:1000:7"), 1234);
  EXPECT_EQ(shm_address_pid(std::string("98:0:0\0\0", 8)), 98);
  EXPECT_EQ(shm_address_pid("1234"), -1);  // no uid: not a region name
  EXPECT_EQ(shm_address_pid(":1000:0"), -1);
  EXPECT_EQ(shm_address_pid("12a4:1000:0"), -1);
  EXPECT_EQ(shm_address_pid("0:1000:0"), -1);
  EXPECT_EQ(shm_address_pid(""), -1);
}

TEST(PeerProcess, ExitIsSeenOnceItHappenedAndNotBefore) {
  testing::ChildProcess child({"/bin/sleep", "60"});
  ASSERT_GT(child.pid(), 0);
  const pid_t pid = child.pid();
  PeerProcess watched(pid);
  ASSERT_TRUE(watched.watched());
  EXPECT_EQ(watched.pid(), pid);
  EXPECT_FALSE(watched.exited());
  child.kill_now();  // killed and reaped
  EXPECT_TRUE(watched.exited());
  EXPECT_TRUE(PeerProcess(pid).exited());  // no such process any more
}

TEST(PostWatch, APostIsStuckOnceItsPeerHasBeenGoneForTheLimit) {
  testing::ChildProcess child({"/bin/sleep", "60"});
  ASSERT_GT(child.pid(), 0);
  const pid_t pid = child.pid();
  auto peer = std::make_shared<const PeerProcess>(pid);
  PostWatch watch;
  EXPECT_EQ(watch.stuck(0s), std::nullopt);  // no post
  watch.begin(peer);
  EXPECT_EQ(watch.stuck(0s), std::nullopt);  // its peer lives
  child.kill_now();
  EXPECT_EQ(watch.stuck(1h), std::nullopt);  // gone, but just now
  EXPECT_EQ(watch.stuck(0s), pid);
  watch.end();
  EXPECT_EQ(watch.stuck(0s), std::nullopt);  // the post returned
  watch.begin(peer);                         // a new post: gone from now
  EXPECT_EQ(watch.stuck(1h), std::nullopt);
}

// No traffic, no liveness signal from above: the killed shm peer is failed
// by the engine itself, named by its process, and a write to it is refused
// with that reason.
TEST(MoriEngineShm, APeerWhoseProcessExitsIsNamedWithoutTraffic) {
  testing::ChildProcess child({PDKV_BACKEND_PEER, "mori", std::to_string(1 << 20), "provider=shm"});
  const std::string blob = testing::from_hex(child.read_line());
  ASSERT_FALSE(blob.empty());
  EngineDesc remote;
  std::vector<MemoryDesc> memory;
  ASSERT_TRUE(decode(blob, remote, memory).is_ok());
  IoEngineConfig config;
  config.key = "watcher";
  config.provider = "shm";
  auto engine = IoEngine::create(config).value();
  std::mutex mu;
  std::vector<std::string> failed;
  engine->set_peer_failure_callback([&](const std::string& key, const Status& why) {
    std::lock_guard lock(mu);
    failed.push_back(key + ": " + why.message());
  });
  std::vector<char> src(1 << 20, 1);
  const MemoryDesc mine = engine->register_memory(src.data(), src.size()).value();
  ASSERT_TRUE(engine->register_remote_engine(remote).is_ok());
  auto session = engine->create_session(mine, memory.at(0)).value();
  const std::string named = "its process " + std::to_string(child.pid()) + " has exited";
  child.kill_now();
  ASSERT_TRUE(testing::poll_until(
      [&] {
        std::lock_guard lock(mu);
        return !failed.empty();
      },
      2s));
  {
    std::lock_guard lock(mu);
    ASSERT_EQ(failed.size(), 1u);
    EXPECT_NE(failed[0].find(remote.key + ": "), std::string::npos) << failed[0];
    EXPECT_NE(failed[0].find(named), std::string::npos) << failed[0];
  }
  const std::vector<uint64_t> zero = {0}, size = {1 << 20};
  const Status refused = session.batch_write(zero, zero, size, engine->allocate_transfer_id());
  EXPECT_NE(refused.message().find(named), std::string::npos) << refused.to_string();
}

}  // namespace
}  // namespace pdkv::backends::mori

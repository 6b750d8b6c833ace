// pdkv_test_peer: one engine in its own process, for tests that kill, pause
// or count the threads of a peer.
//   pdkv_test_peer prefill|decode BOOTSTRAP ROOM [BACKEND [KEEPALIVE_MS]]
// Starts a TP-1 engine of the default test shape (support/cluster.h) over
// BACKEND (default loopback), opens ROOM (prefill: Sender + init; decode:
// Receiver + init + send_metadata), prints "ready", then, as a prefill,
// serves rooms on command: a line "room R" on stdin opens R (the decode
// engine comes with its metadata), writes the oracle's pattern for R into
// pages 4..7, sends them and prints "room R ok" or "room R failed: why".
// A line "threads" prints "threads N", the process's thread count. It runs
// until killed.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <numeric>
#include <string>

#include "support/cluster.h"
#include "support/kv_oracle.h"
#include "support/threads.h"

namespace {

using namespace pdkv;

bool ended(PollState s) { return s == PollState::kSuccess || s == PollState::kFailed; }

// Serves one room as SGLang's prefill would, and says how it went.
std::string serve(Engine& engine, testing::RankMemory& memory, RoomId room) {
  const KvSpec& kv = engine.config().kv;
  const std::vector<uint64_t> pages = testing::first_pages(4, 4);
  testing::for_each_element(
      kv, {0, kv.total_heads}, {0, kv.num_layers}, pages, room,
      [&](uint32_t buf, uint64_t off, uint8_t v) { memory.kv[buf][off] = std::byte{v}; });
  auto sender = engine.sender(room);
  if (!sender.is_ok()) return "failed: " + sender.status().message();
  Sender& s = **sender;
  while (s.poll() == PollState::kBootstrapping)
    (void)engine.wait_for_changes(std::chrono::milliseconds(100));
  if (s.poll() == PollState::kFailed) return "failed: " + s.failure().message();
  Status st = s.init(pages.size());
  if (st.is_ok()) st = s.send(pages, true);
  if (!st.is_ok()) return "failed: " + st.message();
  while (!ended(s.poll())) (void)engine.wait_for_changes(std::chrono::milliseconds(100));
  return s.poll() == PollState::kSuccess ? "ok" : "failed: " + s.failure().message();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s prefill|decode BOOTSTRAP ROOM [BACKEND [KEEPALIVE_MS]]\n",
                 argv[0]);
    return 2;
  }
  const bool prefill = std::string(argv[1]) == "prefill";
  const RoomId room = std::stoull(argv[3]);
  testing::ClusterSpec spec;
  EngineConfig cfg;
  cfg.role = prefill ? Role::kPrefill : Role::kDecode;
  cfg.engine_id = prefill ? spec.prefill_id : spec.decode_id;
  cfg.kv = spec.kv;
  cfg.backend = argc > 4 ? argv[4] : "loopback";
  cfg.bootstrap_address = argv[2];
  if (argc > 5) cfg.timeouts.keepalive = std::chrono::milliseconds(std::stoul(argv[5]));
  testing::RankMemory memory;
  memory.kv.assign(
      cfg.kv.num_layers * cfg.kv.buffers_per_layer(),
      std::vector<std::byte>(cfg.kv.num_pages * cfg.kv.page_bytes(cfg.kv.total_heads)));
  memory.state.resize(1);
  auto engine = Engine::create(cfg, memory.pools());
  if (!engine.is_ok()) {
    std::fprintf(stderr, "%s\n", engine.status().to_string().c_str());
    return 1;
  }
  std::vector<uint64_t> pages(4);
  std::iota(pages.begin(), pages.end(), 0);
  std::unique_ptr<Sender> sender;
  std::unique_ptr<Receiver> receiver;
  Status st;
  if (prefill) {
    sender = std::move((*engine)->sender(room, spec.decode_id)).value();
    st = sender->init(pages.size());
  } else {
    receiver = std::move((*engine)->receiver(room, spec.prefill_id)).value();
    st = receiver->init();
    if (st.is_ok()) st = receiver->send_metadata(pages);
  }
  if (!st.is_ok()) {
    std::fprintf(stderr, "%s\n", st.to_string().c_str());
    return 1;
  }
  std::printf("ready\n");
  std::fflush(stdout);
  for (std::string line; std::getline(std::cin, line);) {
    if (line == "threads") {
      std::printf("threads %zu\n", testing::thread_count());
    } else if (prefill && line.rfind("room ", 0) == 0) {
      const RoomId r = std::stoull(line.substr(5));
      std::printf("room %llu %s\n", static_cast<unsigned long long>(r),
                  serve(**engine, memory, r).c_str());
    }
    std::fflush(stdout);
  }
  while (true) pause();  // stdin closed: wait to be killed
}

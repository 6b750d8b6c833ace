// pdkv_test_peer: one engine in its own process, for tests that kill a peer.
//   pdkv_test_peer prefill|decode BOOTSTRAP ROOM
// Starts a TP-1 engine of the default test shape (support/cluster.h), opens
// ROOM (prefill: Sender + init; decode: Receiver + init + send_metadata),
// prints "ready" and waits to be killed.
#include <unistd.h>

#include <cstdio>
#include <numeric>
#include <string>

#include "support/cluster.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s prefill|decode BOOTSTRAP ROOM\n", argv[0]);
    return 2;
  }
  const bool prefill = std::string(argv[1]) == "prefill";
  const pdkv::RoomId room = std::stoull(argv[3]);
  pdkv::testing::ClusterSpec spec;
  pdkv::EngineConfig cfg;
  cfg.role = prefill ? pdkv::Role::kPrefill : pdkv::Role::kDecode;
  cfg.engine_id = prefill ? spec.prefill_id : spec.decode_id;
  cfg.kv = spec.kv;
  cfg.backend = "loopback";
  cfg.bootstrap_address = argv[2];
  pdkv::testing::RankMemory memory;
  memory.kv.assign(
      cfg.kv.num_layers * cfg.kv.buffers_per_layer(),
      std::vector<std::byte>(cfg.kv.num_pages * cfg.kv.page_bytes(cfg.kv.total_heads)));
  memory.state.resize(1);
  auto engine = pdkv::Engine::create(cfg, memory.pools());
  if (!engine.is_ok()) {
    std::fprintf(stderr, "%s\n", engine.status().to_string().c_str());
    return 1;
  }
  std::vector<uint64_t> pages(4);
  std::iota(pages.begin(), pages.end(), 0);
  std::unique_ptr<pdkv::Sender> sender;
  std::unique_ptr<pdkv::Receiver> receiver;
  pdkv::Status st;
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
  while (true) pause();
}

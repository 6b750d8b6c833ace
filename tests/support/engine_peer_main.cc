// pdkv_test_peer: one engine in its own process, for tests that kill, pause
// or count the threads of a peer, or cut it off (tests/fault).
//   pdkv_test_peer prefill|decode BOOTSTRAP ROOM [BACKEND [KEEPALIVE_MS [HOST
//                  [OPTION=VALUE ...]]]]
// Starts a TP-1 engine of the default test shape (support/cluster.h) over
// BACKEND (default loopback), reached at HOST (default 127.0.0.1), with the
// backend's options given; opens ROOM as "open" does (0: none), prints
// "ready", then runs the commands it reads from stdin:
//   open R     opens R, prints "opened R" (or "room R failed: why"). A
//              prefill: Sender and init, no pages (the room ends when its
//              decode side fails it, or at its data timeout). A decode:
//              Receiver, init and metadata for pages 0..3.
//   wait R     waits for an opened R to end: "room R ok" or "room R failed:
//              why".
//   room R     (prefill) opens R (the decode engine comes with its
//              metadata), writes the oracle's pattern for R into pages 4..7,
//              sends them and prints "room R ok" or "room R failed: why".
//   threads    prints "threads N", the process's thread count.
// It runs until killed.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <map>
#include <numeric>
#include <string>

#include "support/cluster.h"
#include "support/kv_oracle.h"
#include "support/threads.h"

namespace {

using namespace pdkv;

bool ended(PollState s) { return s == PollState::kSuccess || s == PollState::kFailed; }

// How a room ended, once it has: "ok" or "failed: why".
template <typename Room>
std::string outcome(Engine& engine, Room& room) {
  while (!ended(room.poll())) (void)engine.wait_for_changes(std::chrono::milliseconds(100));
  return room.poll() == PollState::kSuccess ? "ok" : "failed: " + room.failure().message();
}

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
  return outcome(engine, s);
}

// The rooms opened by "open": a Sender or a Receiver each, by role.
struct OpenRooms {
  Engine& engine;
  const testing::ClusterSpec& spec;
  std::map<RoomId, std::unique_ptr<Sender>> senders;
  std::map<RoomId, std::unique_ptr<Receiver>> receivers;

  // "" once opened, else why not.
  std::string open(RoomId room) {
    std::vector<uint64_t> pages(4);
    std::iota(pages.begin(), pages.end(), 0);
    if (engine.config().role == Role::kPrefill) {
      auto sender = engine.sender(room, spec.decode_id);
      if (!sender.is_ok()) return sender.status().message();
      if (Status st = (*sender)->init(pages.size()); !st.is_ok()) return st.message();
      senders[room] = std::move(sender).value();
      return "";
    }
    auto receiver = engine.receiver(room, spec.prefill_id);
    if (!receiver.is_ok()) return receiver.status().message();
    Status st = (*receiver)->init();
    if (st.is_ok()) st = (*receiver)->send_metadata(pages);
    if (!st.is_ok()) return st.message();
    receivers[room] = std::move(receiver).value();
    return "";
  }
  std::string wait(RoomId room) {
    if (auto s = senders.find(room); s != senders.end()) return outcome(engine, *s->second);
    if (auto r = receivers.find(room); r != receivers.end()) return outcome(engine, *r->second);
    return "failed: not opened";
  }
};

// Prints one command's answer about `room`.
void say(RoomId room, const std::string& what) {
  std::printf("room %llu %s\n", static_cast<unsigned long long>(room), what.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr,
                 "usage: %s prefill|decode BOOTSTRAP ROOM [BACKEND [KEEPALIVE_MS [HOST "
                 "[OPTION=VALUE ...]]]]\n",
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
  if (argc > 6) cfg.control_host = argv[6];
  for (int i = 7; i < argc; ++i) {
    const std::string option = argv[i];
    const size_t eq = option.find('=');
    if (eq == std::string::npos) {
      std::fprintf(stderr, "backend option '%s' is not OPTION=VALUE\n", option.c_str());
      return 2;
    }
    cfg.transport_options[option.substr(0, eq)] = option.substr(eq + 1);
  }
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
  OpenRooms rooms{**engine, spec, {}, {}};
  if (room != 0) {
    if (const std::string why = rooms.open(room); !why.empty()) {
      std::fprintf(stderr, "%s\n", why.c_str());
      return 1;
    }
  }
  std::printf("ready\n");
  std::fflush(stdout);
  for (std::string line; std::getline(std::cin, line);) {
    const auto id = [&] { return RoomId{std::stoull(line.substr(line.find(' ') + 1))}; };
    if (line == "threads") {
      std::printf("threads %zu\n", testing::thread_count());
    } else if (line.rfind("open ", 0) == 0) {
      const std::string why = rooms.open(id());
      if (why.empty()) {
        std::printf("opened %llu\n", static_cast<unsigned long long>(id()));
      } else {
        say(id(), "failed: " + why);
      }
    } else if (line.rfind("wait ", 0) == 0) {
      say(id(), rooms.wait(id()));
    } else if (prefill && line.rfind("room ", 0) == 0) {
      say(id(), serve(**engine, memory, id()));
    }
    std::fflush(stdout);
  }
  while (true) pause();  // stdin closed: wait to be killed
}

// An engine's counters and gauges: written by its loop, read by
// Engine::stats() on any thread (EngineStats says what each means).
#pragma once

#include <atomic>
#include <cstdint>

namespace pdkv::engine {

struct Counters {
  std::atomic<uint64_t> staged_routes{0};
  std::atomic<uint64_t> direct_routes{0};
  std::atomic<uint64_t> batches_in_flight{0};
  std::atomic<uint64_t> rooms{0};
  std::atomic<uint64_t> peers{0};
  std::atomic<uint64_t> room_steps{0};
  std::atomic<uint64_t> notified_reports{0};
};

}  // namespace pdkv::engine

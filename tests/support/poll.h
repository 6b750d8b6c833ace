// Waiting on a poll-based API in tests, bounded in time.
#pragma once

#include <chrono>
#include <thread>

namespace pdkv::testing {

// Polls `done` until it holds or `limit` passes; the API's own poll() model,
// not a sleep standing in for synchronisation. Returns whether it held.
template <typename Pred>
bool poll_until(Pred done, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

}  // namespace pdkv::testing

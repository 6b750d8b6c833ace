// What the mori engine's tests share: an engine's configuration, and
// waiting for a transfer to end.
#pragma once

#include <chrono>
#include <string>

#include "io_engine.h"
#include "support/poll.h"

namespace pdkv::backends::mori {

inline IoEngineConfig config(const std::string& key, const std::string& provider,
                             std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  IoEngineConfig c;
  c.key = key;
  c.provider = provider;
  c.transfer_timeout = timeout;
  return c;
}

// The transfer's status once it is no longer in progress (or after 20 s).
inline TransferStatus wait(IoEngine& e, TransferId id) {
  TransferStatus st;
  testing::poll_until(
      [&] { return (st = e.transfer_status(id)).state != TransferState::kInProgress; },
      std::chrono::seconds(20));
  return st;
}

}  // namespace pdkv::backends::mori

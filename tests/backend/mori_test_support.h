// What the mori engine's tests share: an engine's configuration, and
// waiting for a transfer to end or to land.
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

// Target side: whether transfer `id` of engine `from` landed within 20 s;
// its bytes are then visible to this thread.
inline bool landed(IoEngine& target, TransferId id, const std::string& from = "initiator") {
  const bool arrived = testing::poll_until(
      [&] { return target.pop_inbound_transfer_status(from, id); }, std::chrono::seconds(20));
  target.acquire_inbound_writes();
  return arrived;
}

}  // namespace pdkv::backends::mori

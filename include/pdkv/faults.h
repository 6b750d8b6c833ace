// Fault injection: a decorator over any transport, so that an operator can
// watch the failure handling of a real deployment work (docs/backends.md,
// "Fault injection"). It is a feature of the runtime, not a test double: the
// bytes that move are moved by the real backend underneath.
//
//   fail_batch=P    a batch ends failed after part of its bytes moved (the
//                   first half of its writes, or the first half of a single
//                   write), while the peer stays healthy
//   stall_batch=P   a batch never completes on its own: its bytes move, but
//                   it stays in progress until the peer is failed (fail_peer)
//   delay_us=N      every batch is handed to the backend N µs late (its
//                   bytes land late, and it completes after them)
//   drain_us=N      a batch that fail_batch fails says so (in progress,
//                   with its error) N µs before it ends, as a backend does
//                   whose library still holds its operations
//   fail_connect=P  connect() is refused
//   seed=N          the generator's seed (default: drawn at random, logged)
//
// P is a probability in [0, 1], drawn per batch (or per connect).
// With delay_us, a write outside a registered region fails its batch when it
// is handed over, instead of being refused by write() itself.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pdkv/status.h"
#include "pdkv/transport.h"

namespace pdkv {

struct FaultSpec {
  double fail_batch = 0;
  double stall_batch = 0;
  uint64_t delay_us = 0;
  uint64_t drain_us = 0;
  double fail_connect = 0;
  std::optional<uint64_t> seed;

  bool any() const { return fail_batch > 0 || stall_batch > 0 || delay_us > 0 || fail_connect > 0; }
  // "fail_batch=0.1 delay_us=500 seed=7", or "none".
  std::string to_string() const;
};

// From KEY=VALUE strings (the --fault flags); an error names the pair that
// is not understood or out of range.
Result<FaultSpec> parse_faults(const std::vector<std::string>& key_values);

// `real`, wrapped so that it misbehaves as `spec` says; `real` itself when
// spec.any() is false.
std::unique_ptr<Transport> inject_faults(std::unique_ptr<Transport> real, const FaultSpec& spec);

}  // namespace pdkv

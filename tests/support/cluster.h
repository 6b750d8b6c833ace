// Several engines in one process over the test-only loopback transport, with
// their pools, for protocol tests: a bootstrap service, P prefill ranks and D
// decode ranks, filled and checked through the independent oracle.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "pdkv/bootstrap.h"
#include "pdkv/engine.h"
#include "support/poll.h"

namespace pdkv::testing {

struct ClusterSpec {
  KvSpec kv{8, 4, 2, 4, 4, 16, Layout::kNhd, false};  // small: 8 heads x 8 B, 4 tokens/page
  Layout decode_layout = Layout::kNhd;
  uint32_t prefill_tp = 1, prefill_pp = 1;
  uint32_t decode_tp = 1, decode_pp = 1;
  std::vector<uint32_t> aux_items;  // aux buffers, by item bytes (empty: none)
  uint32_t aux_slots = 4;
  StateSpec state;
  Timeouts timeouts;
  std::optional<Timeouts> decode_timeouts;  // when the decode side needs others
  std::string backend = "loopback";         // any transport of the build
  TransportOptions prefill_transport;       // backend options of the prefill ranks
  TransportOptions decode_transport;        // ... and of the decode ranks
  FaultSpec prefill_faults;                 // injected into the prefill ranks' transports
  Staging staging = Staging::kOff;          // with kOn/kAuto every rank gets a staging pool
  // Staging pool sizes; default: 8 whole KV pools' worth, enough for any test.
  std::optional<uint64_t> prefill_staging_bytes, decode_staging_bytes;
  std::string prefill_id = "prefill", decode_id = "decode";
  Security security;  // of the bootstrap service and every rank
  Limits limits;
};

struct RankMemory {
  std::vector<std::vector<std::byte>> kv;
  std::vector<std::vector<std::byte>> aux;  // one per aux buffer
  std::vector<std::byte> state, staging;
  EnginePools pools();
};

class Cluster {
 public:
  // Starts everything; fails the calling test on any error.
  static std::unique_ptr<Cluster> start(const ClusterSpec& spec);
  ~Cluster();

  const ClusterSpec& spec() const { return spec_; }
  std::string bootstrap_address() const;
  // Ranks ordered by (pp, tp).
  std::vector<std::unique_ptr<Engine>> prefill, decode;
  std::vector<RankMemory> prefill_memory, decode_memory;

  // Writes the room's element values into every prefill rank's `pages` (and
  // aux slot / state slots), and the untouched pattern into every decode pool.
  void fill(uint64_t room, const std::vector<uint64_t>& prefill_pages, uint32_t aux_slot,
            const std::vector<uint32_t>& state_slots);
  // Checks every byte of every decode pool: element values in `pages`, aux
  // and state slots where the room put them, untouched elsewhere. Returns
  // the first difference, or "" when all is right.
  std::string verify(uint64_t room, const std::vector<uint64_t>& decode_pages, uint32_t aux_slot,
                     const std::vector<uint32_t>& state_slots) const;
  // Checks that no decode byte changed since fill(); "" when none did.
  std::string verify_untouched() const;
  // For rooms that run side by side: only `pages` and the aux slot of every
  // decode rank are checked (the room's values); "" when right.
  std::string verify_pages(uint64_t room, const std::vector<uint64_t>& decode_pages,
                           uint32_t aux_slot) const;
  // A failed room's pages on decode rank `rank` get a poison pattern of
  // their own; check_poison says whether any byte of it changed since.
  void poison(size_t rank, const std::vector<uint64_t>& pages, uint64_t room);
  std::string check_poison(size_t rank, const std::vector<uint64_t>& pages, uint64_t room) const;

  // Byte i of aux buffer `buffer` for a room, as the last prefill stage holds
  // it (earlier stages hold other bytes: they do not have the output token).
  static uint8_t aux_byte(uint64_t room, uint32_t buffer, uint64_t i);
  static uint8_t state_byte(uint32_t layer, uint32_t channel, uint64_t byte, uint64_t room);

 private:
  ClusterSpec spec_;
  std::unique_ptr<BootstrapServer> bootstrap_;
};

// A cluster of `heads` KV heads, prefill TP `p_tp`, decode TP `d_tp`, else defaults.
inline ClusterSpec shape(uint32_t heads, uint32_t p_tp, uint32_t d_tp) {
  ClusterSpec s;
  s.kv.total_heads = heads;
  s.prefill_tp = p_tp;
  s.decode_tp = d_tp;
  return s;
}

// Pages from, from + 1, ..., from + n - 1.
inline std::vector<uint64_t> first_pages(uint64_t n, uint64_t from = 0) {
  std::vector<uint64_t> p(n);
  for (uint64_t i = 0; i < n; ++i) p[i] = from + i;
  return p;
}

}  // namespace pdkv::testing

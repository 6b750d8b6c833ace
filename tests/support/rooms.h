// One room across every rank of a Cluster, for protocol tests: receivers
// with their metadata, senders with init (and, when asked, every page sent).
#pragma once

#include <memory>
#include <vector>

#include "support/cluster.h"

namespace pdkv::testing {

struct ClusterRoom {
  std::vector<std::unique_ptr<Sender>> senders;
  std::vector<std::unique_ptr<Receiver>> receivers;

  // Every side reached Success or Failed.
  bool ended() const {
    for (const auto& r : receivers)
      if (!terminal(r->poll())) return false;
    for (const auto& s : senders)
      if (!terminal(s->poll())) return false;
    return true;
  }
  static bool terminal(PollState s) { return s == PollState::kSuccess || s == PollState::kFailed; }
};

// Receivers send metadata for `pages` pages at decode pages dst_from...;
// senders init them and, with `send`, send pages 0... as one last chunk.
inline ClusterRoom open_room(Cluster& c, RoomId room, uint64_t pages, bool send = false,
                             uint64_t dst_from = 8) {
  ClusterRoom r;
  for (auto& e : c.decode) {
    r.receivers.push_back(std::move(e->receiver(room, c.spec().prefill_id)).value());
    EXPECT_TRUE(r.receivers.back()->init().is_ok());
    EXPECT_TRUE(r.receivers.back()->send_metadata(first_pages(pages, dst_from)).is_ok());
  }
  for (auto& e : c.prefill) {
    r.senders.push_back(std::move(e->sender(room, c.spec().decode_id)).value());
    EXPECT_TRUE(r.senders.back()->init(pages).is_ok());
    if (send) {
      EXPECT_TRUE(r.senders.back()->send(first_pages(pages), true).is_ok());
    }
  }
  return r;
}

}  // namespace pdkv::testing

// What the prefill and the decode side of an engine share: the rank's
// configuration and identity, its transport and pools, and the loop's
// services. Owned by EngineCore, which builds it once everything in it
// exists; used on the loop thread only, except Counters (atomics).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/blocking_pool.h"
#include "engine/change_feed.h"
#include "engine/counters.h"
#include "engine/event_loop.h"
#include "engine/peer_registry.h"
#include "engine/pool_staging.h"
#include "engine/room_directory.h"
#include "engine/room_handle.h"
#include "engine/staging_pool.h"
#include "engine/topology_lookups.h"
#include "pdkv.pb.h"
#include "pdkv/engine.h"
#include "pdkv/plan.h"

namespace pdkv::engine {

// Deadline of one control call to a peer. A lost or silent peer cancels it
// much sooner (its link's keepalive and Watch stream), so this only bounds a
// call that a live peer is slow to answer: a burst of thousands of reports
// at once, on a loaded machine, may need more than 5 s (Scale tests under a
// sanitizer did), and none of them should fail for it.
inline constexpr auto kControlCallTimeout = std::chrono::milliseconds(20000);

// A failure told to a peer that was lost (RoomStatus from a prefill rank,
// AbortRoom from a decode rank) goes over a fresh link, which may be lost in
// turn while the cut lasts, or just after the path returns (docs/
// reliability.md, item 3): it is sent this many times in all. Each try lasts
// at least a keepalive period of refusals, so the tries outlast a cut of
// about that many periods after the loss was found.
inline constexpr uint32_t kFailureNoticeTries = 3;

// A staging copy (gather or scatter) smaller than this runs on the loop: it
// takes about as long as handing it to a copy thread and back (two thread
// switches, tens of microseconds here), and a one-page request's routes stay
// off the copy threads. Larger ones would hold up every other room.
inline constexpr uint64_t kCopyOnLoopBytes = 1 << 20;

// This rank's transport keys for its pools.
struct RegionKeys {
  std::vector<RegionKey> kv;  // by buffer index; empty when KV is never written in place
  RegionKey aux_first = 0;    // aux buffer i is aux_first + i
  RegionKey state = 0;
  RegionKey staging = 0;
};

struct EngineContext {
  const EngineConfig& config;
  const proto::RankInfo& self;
  const RankShard& shard;
  uint32_t local_channels = 0;  // state channels this rank owns
  Transport& transport;
  PoolStaging& pool_staging;
  const RegionKeys& keys;
  EventLoop& loop;
  BlockingPool& copier;  // staging copies off the loop (copy_then)
  PeerRegistry& peers;
  TopologyLookups& lookups;
  RoomDirectory& directory;
  ChangeFeed& feed;
  Counters& counters;
  StagingPool staging;  // slots of the staging pool (the loop's)
  Planner planner;

  proto::RankRef self_ref() const;
  // Every KV route of this rank is staged (device pools the transport
  // cannot register).
  bool staged_only() const { return pool_staging.mode() == PoolStaging::Mode::kDeviceStaged; }
  // Publishes a room's state to its caller (and to the change feed); a null
  // handle (no caller any more) is fine.
  void advance(RoomHandle* room, PollState state);
  void fail(RoomHandle* room, const Status& reason);
  // A route of the room is staged: counted, and told in its metrics.
  void note_staged(RoomHandle* room);
  // Gathers `plan`'s bytes into staging slot `slot`, or scatters them from
  // it, and then runs `done` with the outcome on the loop, always later than
  // this call. Large host copies run on a copy thread meanwhile
  // (kCopyOnLoopBytes, PoolStaging::copies_off_loop), the rest on the loop.
  // The caller keeps what the copy touches (the slot, the pages it fills)
  // until `done` runs; at shutdown a copy not yet started is dropped, and
  // its `done` never runs.
  enum class Copy { kGather, kScatter };
  void copy_then(Copy copy, TransferPlan plan, uint64_t slot,
                 std::function<void(const Status&)> done);
};

}  // namespace pdkv::engine

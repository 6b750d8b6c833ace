// The decode side of an engine: one state machine per room, run by the
// engine's loop when an event concerns that room, never by a scan.
//
// A room (DecodeRoom) is fed by its sources (the prefill ranks the transfer
// map names for this rank). For each source:
//   metadata sent (with a staging slot when the route is staged) ->
//   accepted -> success: bytes visible (a staged block is scattered first,
//   on a copy thread when it is large).
// A source reports success by a RoomStatus call, or first by a notice that
// its last batch carries over the data plane (decode_reports.cc); the call
// then follows as its confirmation, and the room is kept until it came.
// The room succeeds when every source reported success.
//
// Failure (an abort, a timeout, a source's failure, a lost source, closing
// the Receiver): the first reason wins, every source that may still write is
// sent AbortRoom (retried until it answers or is lost; a lost one is told a
// few times over fresh links, as it may only be cut off), and the Receiver
// sees kFailed only once every source is quiet: it acknowledged the abort,
// reported (and its staged block's scatter is over), was lost, or never had
// the page list. From then on no byte of the room lands in its pages; a late
// success report is refused and never scattered. Staging slots are released
// at the same moment, not on a timer.
//
// Thread-safety: loop thread only.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "engine/control_service.h"
#include "engine/engine_context.h"

namespace pdkv::engine {

class DecodeSide {
 public:
  explicit DecodeSide(EngineContext& ctx) : ctx_(ctx) {}

  // The Receiver's calls (the API checked the caller's own sequencing).
  void open(std::shared_ptr<RoomHandle> handle, EngineKey prefill_engine);
  void init(RoomId room);
  void send_metadata(RoomId room, proto::TransferInfo metadata);
  void abort(RoomId room, const std::string& reason);
  void close(RoomId room);

  // Reports from sources: calls, and the transport's notifications (taken
  // when it says some arrived).
  void on_room_status(const proto::RoomStatus& status, AnswerPtr answer);
  void take_notices();

  // PeerRegistry's hook.
  // True when the room still needed the peer (it fails).
  bool on_link_lost(RoomId room, const std::string& peer, const Status& reason);

  // Shutdown, first: `done` runs, on the loop, once no source's confirmation
  // of a success taken from its notice is due any more (at once if none is).
  void when_confirmed(std::function<void()> done);
  // Fails every room with `reason` and tells its sources (the engine is going).
  void shutdown(const Status& reason);
  // Publishes kFailed for the rooms whose sources did not answer in time.
  void give_up();
  size_t rooms() const { return rooms_.size(); }

 private:
  struct Source {
    RankKey key;
    proto::RankInfo rank;
    Link link;
    std::string peer;  // PeerRegistry key
    enum class Info {
      kNotSent,
      kWaitingForSlot,
      kSending,
      kAccepted,
      kRefused
    } info = Info::kNotSent;
    bool reported = false;  // success or failure: it writes nothing more
    bool succeeded = false;
    // Its success came as a notice over the data plane; its RoomStatus call,
    // the confirmation its Sender waits for, has not come yet.
    bool confirm_due = false;
    uint64_t bytes = 0;
    std::optional<uint64_t> slot;  // our staging slot for its block
    uint64_t slot_bytes = 0;
    // AbortRoom: retried while it is alive and slow to answer; sent again
    // over a fresh link, kFailureNoticeTries in all, while it is lost (it
    // may only be cut off), and the room is kept meanwhile.
    enum class Abort { kNone, kSending, kAcked } abort = Abort::kNone;
    std::chrono::milliseconds abort_backoff{100};
    uint32_t lost_tells = 0;  // AbortRooms sent while it was lost
    bool lost = false;
    // Its staged block is being copied into the room's pages (copy_then):
    // the slot and the room are kept, and the room is not quiet.
    bool scattering = false;
    // Nothing of the room can land from this source any more.
    bool quiet() const {
      if (scattering) return false;
      return info == Info::kNotSent || info == Info::kWaitingForSlot || info == Info::kRefused ||
             reported || lost || abort == Abort::kAcked;
    }
  };

  struct DecodeRoom {
    RoomId id = 0;
    std::shared_ptr<RoomHandle> handle;  // null once closed
    EngineKey engine;
    bool init = false;
    bool lookup_pending = false;
    bool bound = false;
    std::map<RankKey, Source> sources;
    std::vector<RankKey> notices;  // idle prefill ranks this rank tells of the room's engine
    std::vector<std::string> notice_peers;  // their PeerRegistry keys
    std::optional<proto::TransferInfo> metadata;
    Clock::time_point metadata_at;
    std::optional<Status> failure;  // published as kFailed once every source is quiet
    std::string abort_reason;       // what AbortRoom says (default: the failure)
    bool published_failure = false;
    bool succeeded = false;
    EventLoop::TimerId deadline = 0;
    uint32_t retries = 0;
  };

  DecodeRoom* find(RoomId room);
  void ensure_bound(DecodeRoom& room);
  void on_lookup(RoomId room, const Result<const PeerEngine*>& engine);
  void bind(DecodeRoom& room, const PeerEngine& engine);
  void send_notices(DecodeRoom& room, const PeerEngine& engine);

  void step(DecodeRoom& room);
  void fail(DecodeRoom& room, const Status& reason);
  void check_quiet(DecodeRoom& room);
  void maybe_erase(DecodeRoom& room);
  void on_deadline(RoomId room);
  void succeed(DecodeRoom& room);

  // decode_reports.cc: reports, by call or by notice.
  Source* source_of(DecodeRoom& room, const proto::RankRef& from);
  void on_success_notice(const proto::RoomStatus& status);
  void note_report(DecodeRoom& room, Source& source, uint64_t bytes);
  void take_success(DecodeRoom& room, Source& source);
  void confirmation_settled(Source& source);  // came, or never will

  // decode_sources.cc: metadata, staging slots, aborts.
  void send_infos(DecodeRoom& room);
  void on_info_reply(RoomId room, RankKey source, const grpc::Status& s);
  // Reserves a staging slot for `source` when staging pays (see Staging):
  // false while a route that must be staged waits for room in the pool; an
  // error when it never can be.
  Result<bool> reserve_staging(const DecodeRoom& room, Source& source);
  // The plan that fills this rank's pages from `source`, with the request's
  // pages numbered 0..n-1 on the source side (the staging layout does not
  // depend on the source's page numbers).
  Result<TransferPlan> staging_plan(const Source& source, const proto::TransferInfo& info);
  // Starts copying the source's staged block into the room's pages
  // (EngineContext::copy_then); on_scattered ends its part.
  void start_scatter(DecodeRoom& room, Source& source);
  void on_scattered(RoomId room, RankKey source, const Status& scattered);
  void release_slot(Source& source);
  void wake_slot_waiters();
  void send_abort(DecodeRoom& room, Source& source);
  void on_abort_reply(RoomId room, RankKey source, const grpc::Status& s);

  EngineContext& ctx_;
  std::unordered_map<RoomId, DecodeRoom> rooms_;
  std::deque<RoomId> slot_waiters_;  // rooms with a source waiting for a staging slot
  uint64_t confirmations_due_ = 0;   // sources with confirm_due set
  std::function<void()> on_all_confirmed_;
};

}  // namespace pdkv::engine

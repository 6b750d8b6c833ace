// The prefill side of an engine: one state machine per room, run by the
// engine's loop when an event concerns that room (a Sender call, metadata,
// an abort, a lookup, a connection, a batch, a report, a timer, a lost
// peer), never by a scan of all rooms.
//
// A room (PrefillRoom) writes to its destinations (the decode ranks the
// transfer map names for this rank). For each destination:
//   metadata accepted -> writes posted as chunks arrive (or, when the decode
//   rank reserved a staging slot, one block gathered at the last chunk, on
//   a copy thread when it is large) -> every batch done ->
//   RoomStatus(Success) -> acknowledged.
// Where the transport has notifications, the last batch to a destination
// (when no other is in flight) also carries the success report, which the
// transport delivers once its bytes are visible there, so that the decode
// rank need not wait for the call; the call still decides the acknowledgement.
// The room succeeds when every destination acknowledged.
//
// Failure: the first reason wins; the Sender sees kFailed at once, unless a
// batch that carries a success notice is in flight: then once it ended, so
// that the application does not reuse the pages it reads (a notice that
// lands says the bytes are the room's). Each
// destination then hears RoomStatus(Failed) (unless it aborted) only once
// none of the room's batches to it is in flight, and an abort is answered
// at the same moment: a decode rank never learns of a failure while bytes
// are still on their way to its pages. Batches that do not end within the
// transfer timeout of the failure are ended by failing the transport
// connection to that peer.
//
// Thread-safety: loop thread only.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "engine/batch_tracker.h"
#include "engine/control_service.h"
#include "engine/engine_context.h"
#include "spare_vectors.h"

namespace pdkv::engine {

class PrefillSide {
 public:
  explicit PrefillSide(EngineContext& ctx);

  // The Sender's calls (the API checked the caller's own sequencing).
  void open(std::shared_ptr<RoomHandle> handle, std::optional<EngineKey> decode_engine);
  void init(RoomId room, uint64_t num_pages, uint32_t aux_slot, std::vector<uint32_t> state_slots);
  void send(RoomId room, std::vector<uint64_t> pages, bool last);
  void abort(RoomId room, const std::string& reason);
  void close(RoomId room);

  // Control messages from decode ranks.
  void on_transfer_info(const proto::TransferInfo& info, AnswerPtr answer);
  void on_abort(const proto::AbortRequest& request, AnswerPtr answer);

  // PeerRegistry's hooks.
  // True when the room still needed the peer (it fails).
  bool on_link_lost(RoomId room, const std::string& peer, const Status& reason);
  void on_wire_ready(RoomId room, const std::string& peer);
  void on_wire_failed(RoomId room, const std::string& peer, const Status& reason);

  // Fails every room with `reason` (the engine is going).
  void shutdown(const Status& reason);
  // The engine stops now: answers held for writes to end are sent (and any
  // later one at once), so that the control server can stop.
  void give_up();
  size_t rooms() const { return rooms_.size(); }
  // The transport announced that batches ended: they are polled now.
  void on_batch_end_event() { batches_.on_batch_end_event(); }

 private:
  struct Destination {
    RankKey key;
    proto::RankInfo rank;
    Link link;
    std::string peer;  // PeerRegistry key
    std::optional<proto::TransferInfo> info;
    uint64_t pages_written = 0;  // of the pages after the decode prefix
    bool extras_written = false;
    uint64_t bytes = 0;
    uint32_t batches = 0;         // in flight
    bool carries_notice = false;  // the batch in flight carries our success notice
    std::optional<uint64_t> gather_slot;
    bool waiting_for_gather = false;  // for room in the staging pool
    bool gathering = false;           // a copy fills the slot: it and the room are kept
    bool gathered = false;            // the slot holds the block, to be written
    // A failure notice on its way (kFailureSending) holds the room; one
    // whose link was lost is sent again, kFailureNoticeTries in all.
    enum class Report {
      kNone,
      kSending,
      kAcked,
      kFailureSending,
      kFailureSent
    } report = Report::kNone;
    uint32_t notice_tries = 0;
    // The transport connection a failed batch to this rank went on, if one
    // did: bytes of it may still be on their way (RoomStatus.cut_connection).
    std::optional<PeerId> cut_connection;
    bool aborted = false;                  // by the decode rank: nothing more to it
    std::vector<AnswerPtr> abort_answers;  // sent once no batch is in flight
  };

  struct PrefillRoom {
    RoomId id = 0;
    std::shared_ptr<RoomHandle> handle;  // null: opened by early messages, or closed
    bool early = false;                  // opened by a message, no Sender yet (early_rooms_)
    bool closed = false;                 // the Sender let go
    std::optional<EngineKey> engine;     // the decode engine
    bool engine_named = false;           // by the Sender
    bool lookup_pending = false;
    bool bound = false;  // destinations known
    std::map<RankKey, Destination> dests;
    std::vector<std::pair<proto::TransferInfo, AnswerPtr>> early_infos;  // before bound
    // The Sender's input.
    bool initialized = false;
    uint64_t num_pages = 0;
    uint32_t aux_slot = 0;
    std::vector<uint32_t> state_slots;
    std::vector<uint64_t> pages;
    bool last = false;
    // Outcome.
    std::optional<Status> failure;
    bool failure_published = false;  // the Sender sees it (publish_failure)
    bool succeeded = false;
    // One deadline at a time: waiting for data (or, opened by a message, for
    // a Sender), then for the transfer once the last chunk is in.
    enum class Deadline { kNone, kData, kTransfer } deadline_kind = Deadline::kNone;
    EventLoop::TimerId deadline = 0;
    bool expired = false;  // opened by a message, and no Sender came in time
    EventLoop::TimerId drain_timer = 0;
    std::optional<Clock::time_point> first_post;
  };

  // "decode dp 0 tp 1 pp 0, ..." for the destinations `pick` picks.
  template <typename Pick>
  static std::string names_of(const std::map<RankKey, Destination>& dests, Pick pick) {
    std::string out;
    for (const auto& [key, d] : dests) {
      if (pick(d)) out += (out.empty() ? "" : ", ") + describe(d.rank);
    }
    return out;
  }

  PrefillRoom* find(RoomId room);
  PrefillRoom& orphan(RoomId room);  // opened by a message before the Sender
  // Whether another room may be opened by a message (Limits::early_rooms).
  Status room_for_early_message(RoomId room) const;
  void ensure_bound(PrefillRoom& room);
  void on_lookup(RoomId room, const Result<const PeerEngine*>& engine);
  void bind(PrefillRoom& room, const PeerEngine& engine);
  // Answers the metadata; true when it was accepted.
  bool accept_info(PrefillRoom& room, const proto::TransferInfo& info, const AnswerPtr& answer);
  Status check_info(const PrefillRoom& room, const Destination& dest,
                    const proto::TransferInfo& info) const;
  // One timer per room: waiting for data (or for a Sender), then for the
  // transfer; on_deadline says which from the room's state.
  void arm_deadline(PrefillRoom& room, PrefillRoom::Deadline kind);
  void cancel_deadline(PrefillRoom& room);
  void on_deadline(RoomId room);

  // The state machine: moves the room on as far as it goes now.
  void step(PrefillRoom& room);
  void fail(PrefillRoom& room, const Status& reason);
  void drive_failure(PrefillRoom& room);
  // The Sender sees the failure once no batch carrying a notice reads its
  // pages (at once with `even_under_notice`: the engine is going).
  void publish_failure(PrefillRoom& room, bool even_under_notice = false);
  void maybe_erase(PrefillRoom& room);

  // prefill_writes.cc: writes, batches, gathers and reports.
  Status post_writes(PrefillRoom& room, Destination& dest);
  Status post_kv_direct(PrefillRoom& room, Destination& dest, std::vector<WriteOp>& ops);
  Result<bool> post_kv_staged(PrefillRoom& room, Destination& dest, std::vector<WriteOp>& ops);
  // Takes a slot and starts the gather into it (EngineContext::copy_then),
  // or waits for a slot.
  Status start_gather(PrefillRoom& room, Destination& dest);
  void on_gathered(RoomId room, RankKey dest, const Status& gathered);
  void add_extras(const PrefillRoom& room, const Destination& dest, std::vector<WriteOp>& ops);
  void on_batch_end(RoomId room, RankKey dest, PeerId connection, const BatchStatus& status);
  void on_batch_failing(RoomId room, RankKey dest, const Status& error);
  // A failed batch's reason, as the room's failure: "room R: write to RANK: ...".
  Status write_failure(RoomId room, const Destination& dest, const Status& error) const;
  void release_gather(Destination& dest);
  void wake_gather_waiters();
  // The RoomStatus of `dest`'s part, as its call or its notice sends it.
  proto::RoomStatus status_of(const PrefillRoom& room, const Destination& dest,
                              const Status& outcome) const;
  void report(PrefillRoom& room, Destination& dest, const Status& outcome);
  void on_notice_reply(PrefillRoom& room, Destination& dest, const grpc::Status& s);
  void on_drain_timeout(RoomId room);
  bool complete(const PrefillRoom& room, const Destination& dest) const;

  EngineContext& ctx_;
  BatchTracker batches_;
  std::unordered_map<RoomId, PrefillRoom> rooms_;
  std::deque<std::pair<RoomId, RankKey>> gather_waiters_;  // for room in the staging pool
  bool giving_up_ = false;
  const bool notices_ = false;  // the transport has notifications: success travels with the bytes
  uint32_t early_rooms_ = 0;    // rooms with `early` set
  SpareVectors<WriteOp> spare_ops_;  // post_writes' lists, kept from batch to batch
};

}  // namespace pdkv::engine

// The decode side's reports from sources: RoomStatus calls over the control
// plane, and the success notices that a source's last batch to this rank
// carries over the data plane (Transport::write_and_notify). A notice lets
// the room succeed as soon as the bytes are here, without waiting for the
// call; the call still comes, and confirms to the source's Sender that its
// success was taken (docs/protocol.md, "Success over the data plane").
#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "engine/decode_side.h"
#include "grpc_status.h"
#include "log.h"

namespace pdkv::engine {

DecodeSide::Source* DecodeSide::source_of(DecodeRoom& room, const proto::RankRef& from) {
  auto found = room.sources.find({from.tp_rank(), from.pp_rank()});
  if (found == room.sources.end() || from.engine_id() != room.engine.first ||
      from.incarnation() != found->second.rank.incarnation()) {
    return nullptr;
  }
  return &found->second;
}

void DecodeSide::on_room_status(const proto::RoomStatus& status, AnswerPtr answer) {
  const RoomId id = status.room();
  DecodeRoom* room = find(id);
  const Status closed =
      Status::failed_precondition(fmt::format("room {} is closed on {}", id, describe(ctx_.self)));
  if (room == nullptr) {
    if (ctx_.directory.closed_before(id)) return answer->send(closed);
    return answer->send(
        Status::not_found(fmt::format("room {} is not open on {}", id, describe(ctx_.self))));
  }
  Source* found = source_of(*room, status.prefill());
  if (found == nullptr) {
    return answer->send(Status::invalid_argument(fmt::format(
        "room {}: {} is not a source of {}", id, describe(status.prefill()), describe(ctx_.self))));
  }
  Source& source = *found;
  auto reported_already = [&] {
    return Status::failed_precondition(
        fmt::format("room {}: {} reported already", id, describe(source.rank)));
  };
  if (source.confirm_due) {
    // Its success came first, as a notice, and was taken then: this call is
    // the confirmation its Sender waits for, whatever the room did since (as
    // for a call taken before the room failed). A failure it reports now
    // came after its bytes had all landed, which the notice said.
    answer->send(status.success() ? Status::ok() : reported_already());
    confirmation_settled(source);
    return maybe_erase(*room);
  }
  if (source.reported && room->handle && !room->failure) {
    // A source reports once. A second report (a peer's bug) changes
    // nothing: a second scatter would read the slot the first one frees.
    // (One on a failed room is answered below, as any late report is.)
    return answer->send(reported_already());
  }
  note_report(*room, source, status.bytes());
  if (!room->handle || room->failure) {
    // Too late: the room failed here (a success after a failure stays a
    // failure), and its pages are not the room's any more once it is quiet.
    // Nothing is scattered.
    answer->send(!room->handle ? closed
                               : Status::failed_precondition(
                                     fmt::format("room {} failed on {} already: {}", id,
                                                 describe(ctx_.self), room->failure->message())));
    return check_quiet(*room);
  }
  if (!status.success()) {
    // Bytes of a batch the source gave up on may trail: dropped before the
    // room's pages are given back.
    if (status.writes_cut()) ctx_.peers.fence_inbound(source.peer, status.cut_connection());
    answer->send(Status::ok());
    const auto code = static_cast<StatusCode>(status.code());
    return fail(*room, Status(code == StatusCode::kOk ? StatusCode::kInternal : code,
                              fmt::format("{} failed room {}: {}", describe(source.rank), id,
                                          status.reason())));
  }
  // The report is taken: the source hears so before the scatter below, a
  // copy of gigabytes for a long request that must not run out the
  // source's call (a 32k request's reply waited 20 s on it here).
  answer->send(Status::ok());
  take_success(*room, source);
}

void DecodeSide::take_notices() {
  for (const std::string& notice : ctx_.transport.take_notifications()) {
    proto::RoomStatus status;
    if (!status.ParseFromString(notice) || !status.success() ||
        !check_protocol_version(status.protocol_version()).is_ok()) {
      logger("engine")->warn(
          "{}: dropped a data-plane notification of {} bytes that is no "
          "success report of this protocol version",
          describe(ctx_.self), notice.size());
      continue;
    }
    on_success_notice(status);
  }
}

void DecodeSide::on_success_notice(const proto::RoomStatus& status) {
  DecodeRoom* room = find(status.room());
  Source* source = room ? source_of(*room, status.prefill()) : nullptr;
  // What is not taken here is decided by the source's RoomStatus call, which
  // follows it: a room not open here, a stranger, a source without our page
  // list or that reported already (the call came first), a room that failed.
  const bool has_pages =
      source && (source->info == Source::Info::kSending || source->info == Source::Info::kAccepted);
  if (!has_pages || source->reported || !room->handle || room->failure) {
    logger("engine")->debug("{}: success notice of room {} from {} left to its call",
                            describe(ctx_.self), status.room(), describe(status.prefill()));
    return;
  }
  source->confirm_due = true;
  ++confirmations_due_;
  ++ctx_.counters.notified_reports;
  note_report(*room, *source, status.bytes());
  take_success(*room, *source);
}

void DecodeSide::confirmation_settled(Source& source) {
  if (!source.confirm_due) return;
  source.confirm_due = false;
  if (--confirmations_due_ > 0 || !on_all_confirmed_) return;
  std::exchange(on_all_confirmed_, nullptr)();
}

void DecodeSide::when_confirmed(std::function<void()> done) {
  if (confirmations_due_ == 0) return done();
  on_all_confirmed_ = std::move(done);
}

void DecodeSide::note_report(DecodeRoom& room, Source& source, uint64_t bytes) {
  // Whatever it says, this source writes nothing more for the room.
  source.reported = true;
  source.bytes = bytes;
  // The deadline is for the reports (engine.h): a scatter still to come
  // ends by itself.
  if (std::all_of(room.sources.begin(), room.sources.end(),
                  [](const auto& s) { return s.second.reported; })) {
    ctx_.loop.cancel(room.deadline);
    room.deadline = 0;
  }
}

void DecodeSide::take_success(DecodeRoom& room, Source& source) {
  // The source's bytes are here (staged or in place): make them visible to
  // this thread and, through the room's state, to the caller.
  ctx_.transport.acquire_remote_writes();
  if (source.slot && room.metadata) return start_scatter(room, source);
  source.succeeded = true;
  step(room);
}

}  // namespace pdkv::engine

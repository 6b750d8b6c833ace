// The decode side: rooms, the Receiver's calls, reports from sources and the
// state machine. Metadata, staging slots and aborts are in decode_sources.cc.
#include <fmt/format.h>

#include <algorithm>

#include "engine/decode_side.h"
#include "log.h"

namespace pdkv::engine {

DecodeSide::DecodeRoom* DecodeSide::find(RoomId room) {
  auto it = rooms_.find(room);
  return it == rooms_.end() ? nullptr : &it->second;
}

void DecodeSide::open(std::shared_ptr<RoomHandle> handle, EngineKey prefill_engine) {
  const RoomId id = handle->id;
  DecodeRoom& room = rooms_[id];
  room.id = id;
  room.handle = std::move(handle);
  room.engine = std::move(prefill_engine);
  ctx_.counters.rooms = rooms_.size();
}

void DecodeSide::init(RoomId id) {
  DecodeRoom* room = find(id);
  if (room == nullptr || room->failure) return;
  room->init = true;
  ensure_bound(*room);
}

void DecodeSide::ensure_bound(DecodeRoom& room) {
  if (room.bound || room.lookup_pending) return;
  const RoomId id = room.id;
  auto cached = ctx_.lookups.want(
      room.engine, [this, id](const Result<const PeerEngine*>& engine) { on_lookup(id, engine); });
  if (cached) {
    bind(room, **cached);
  } else {
    room.lookup_pending = true;
  }
}

void DecodeSide::on_lookup(RoomId id, const Result<const PeerEngine*>& engine) {
  DecodeRoom* room = find(id);
  if (room == nullptr) return;
  room->lookup_pending = false;
  if (!engine.is_ok()) {
    fail(*room, engine.status());
    if ((room = find(id))) maybe_erase(*room);
    return;
  }
  bind(*room, **engine);
}

void DecodeSide::bind(DecodeRoom& room, const PeerEngine& engine) {
  const RankKey me{ctx_.config.tp_rank, ctx_.config.pp_rank};
  for (const Link& link : engine.links) {
    if (!(link.dst == me)) continue;
    Source& source = room.sources[link.src];
    source.key = link.src;
    source.link = link;
    source.rank = engine.topology.at(link.src);
    source.peer = ctx_.peers.attach(source.rank, room.id);  // watched from now on
  }
  for (const EngineNotice& n : engine.notices) {
    if (n.teller == me) room.notices.push_back(n.idle_source);
  }
  for (RankKey idle : room.notices) {
    room.notice_peers.push_back(ctx_.peers.attach(engine.topology.at(idle), room.id));
  }
  room.bound = true;
  if (room.failure) {
    // Failed while the sources were unknown: they may be waiting for our
    // metadata, so they hear of it now.
    for (auto& [key, source] : room.sources) send_abort(room, source);
    return check_quiet(room);
  }
  ctx_.advance(room.handle.get(), PollState::kWaitingForInput);
  send_notices(room, engine);
  send_infos(room);
  step(room);
}

void DecodeSide::send_notices(DecodeRoom& room, const PeerEngine& engine) {
  for (RankKey idle : room.notices) {
    const proto::RankInfo& rank = engine.topology.at(idle);
    ControlLink* link = ctx_.peers.link(PeerRegistry::key_of(rank));
    if (link == nullptr) continue;
    proto::TransferInfo notice;
    notice.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
    notice.set_room(room.id);
    *notice.mutable_decode() = ctx_.self_ref();
    notice.set_engine_notice(true);
    // Best effort: a Sender that named the engine, or none at all, needs none.
    link->send_transfer_info(std::move(notice), kControlCallTimeout, [](const grpc::Status&) {});
  }
}

void DecodeSide::send_metadata(RoomId id, proto::TransferInfo metadata) {
  DecodeRoom* room = find(id);
  if (room == nullptr || room->failure) return;
  room->metadata = std::move(metadata);
  room->metadata_at = Clock::now();
  room->deadline =
      ctx_.loop.after(ctx_.config.timeouts.waiting_for_data, [this, id] { on_deadline(id); });
  send_infos(*room);
}

void DecodeSide::abort(RoomId id, const std::string& reason) {
  if (DecodeRoom* room = find(id)) {
    if (!room->failure) room->abort_reason = reason;  // the sources hear the caller's words
    fail(*room,
         Status::aborted(fmt::format("{} aborted room {}: {}", describe(ctx_.self), id, reason)));
  }
}

void DecodeSide::close(RoomId id) {
  DecodeRoom* room = find(id);
  if (room == nullptr) return;
  room->handle.reset();
  if (!room->failure && !room->succeeded) {
    fail(*room, Status::aborted(fmt::format("room {} closed by its receiver", id)));
  }
  if ((room = find(id))) maybe_erase(*room);
}

void DecodeSide::on_deadline(RoomId id) {
  DecodeRoom* room = find(id);
  if (room == nullptr) return;
  room->deadline = 0;
  std::string missing;
  for (const auto& [key, s] : room->sources) {
    if (s.reported) continue;
    missing += (missing.empty() ? "" : ", ") + describe(s.rank);
  }
  const auto waited = ctx_.config.timeouts.waiting_for_data.count();
  if (room->bound) {
    return fail(*room, Status::deadline_exceeded(fmt::format(
                           "room {}: [{}] did not report within {} ms", id, missing, waited)));
  }
  const std::string last = ctx_.lookups.last_answer(room->engine);
  fail(*room,
       Status::deadline_exceeded(fmt::format(
           "room {}: prefill engine '{}' not found within {} ms{}", id, room->engine.first, waited,
           last.empty() ? "" : " (the bootstrap service's last answer: " + last + ")")));
}

void DecodeSide::step(DecodeRoom& room) {
  ++ctx_.counters.room_steps;
  if (room.failure) return check_quiet(room);
  if (room.succeeded || !room.bound || room.sources.empty()) return;
  bool all_accepted = true, all_succeeded = true;
  for (const auto& [key, s] : room.sources) {
    all_accepted &= s.info == Source::Info::kAccepted;
    all_succeeded &= s.succeeded;
  }
  if (all_accepted || all_succeeded) ctx_.advance(room.handle.get(), PollState::kTransferring);
  if (all_succeeded) succeed(room);
}

void DecodeSide::succeed(DecodeRoom& room) {
  room.succeeded = true;
  ctx_.loop.cancel(room.deadline);
  room.deadline = 0;
  if (room.handle) {
    std::lock_guard lock(room.handle->mu);
    TransferMetrics& m = room.handle->metrics_;
    for (const auto& [key, s] : room.sources) m.bytes += s.bytes;
    m.latency =
        std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - room.metadata_at);
    m.retries = room.retries;
  }
  ctx_.advance(room.handle.get(), PollState::kSuccess);
  maybe_erase(room);
}

void DecodeSide::fail(DecodeRoom& room, const Status& reason) {
  if (room.failure || room.succeeded) return;
  room.failure = reason;
  logger("engine")->warn("room {} failed: {}", room.id, reason.message());
  ctx_.loop.cancel(room.deadline);
  room.deadline = 0;
  // Every source is told: those with our page list must stop writing into
  // pages we will reuse, the others must not wait for metadata.
  for (auto& [key, source] : room.sources) {
    if (source.info == Source::Info::kWaitingForSlot) source.info = Source::Info::kNotSent;
    // A lost source hears it over a fresh link: it may only have been cut off.
    if (!source.reported) send_abort(room, source);
  }
  check_quiet(room);
}

void DecodeSide::check_quiet(DecodeRoom& room) {
  if (!room.failure || room.published_failure) return;
  for (const auto& [key, s] : room.sources) {
    if (!s.quiet()) return;
  }
  room.published_failure = true;
  for (auto& [key, s] : room.sources) release_slot(s);
  if (room.handle) {
    std::lock_guard lock(room.handle->mu);
    room.handle->metrics_.retries = room.retries;
  }
  ctx_.fail(room.handle.get(), *room.failure);
  maybe_erase(room);
}

void DecodeSide::maybe_erase(DecodeRoom& room) {
  const bool ended = room.succeeded || room.published_failure;
  if (room.handle || !ended || room.lookup_pending) return;
  // A source's confirmation must find the room that took its notice, and a
  // lost source's abort, which may be sent again, keeps its link open.
  for (const auto& [key, s] : room.sources) {
    if (s.confirm_due || (s.lost && s.abort == Source::Abort::kSending)) return;
  }
  for (auto& [key, s] : room.sources) {
    release_slot(s);
    ctx_.peers.detach(s.peer, room.id);
  }
  // The idle ranks told of the room's engine were bound to it as well.
  for (const std::string& peer : room.notice_peers) ctx_.peers.detach(peer, room.id);
  ctx_.loop.cancel(room.deadline);
  rooms_.erase(room.id);
  ctx_.counters.rooms = rooms_.size();
}

bool DecodeSide::on_link_lost(RoomId id, const std::string& peer, const Status& reason) {
  DecodeRoom* room = find(id);
  if (room == nullptr) return false;
  bool owed = false;
  for (auto& [key, s] : room->sources) {
    if (s.peer != peer) continue;
    s.lost = true;            // quiet: a dead peer writes nothing, a cut-off one is fenced
    confirmation_settled(s);  // never comes
    owed |= !s.reported;
  }
  if (owed) {
    // A peer that was only cut off may still have bytes on the way: dropped
    // before the room reports (where the backend can: docs/reliability.md).
    ctx_.peers.fence_inbound(peer);
    if (!room->failure) {
      fail(*room, reason);
      return true;
    }
    // Failed already: it hears so over a fresh link now, also when it was
    // to be asked again after a backoff.
    for (auto& [key, s] : room->sources) {
      if (s.peer == peer && !s.reported) send_abort(*room, s);
    }
    check_quiet(*room);
  } else {
    check_quiet(*room);
    // A confirmation it owed will not come.
    if ((room = find(id))) maybe_erase(*room);
  }
  return owed;
}

void DecodeSide::shutdown(const Status& reason) {
  std::vector<RoomId> ids;
  for (const auto& [id, room] : rooms_) ids.push_back(id);
  for (RoomId id : ids) {
    if (DecodeRoom* room = find(id)) fail(*room, reason);
  }
}

void DecodeSide::give_up() {
  for (auto& [id, room] : rooms_) {
    if (!room.failure || room.published_failure) continue;
    room.published_failure = true;
    ctx_.fail(room.handle.get(), *room.failure);
  }
}

}  // namespace pdkv::engine

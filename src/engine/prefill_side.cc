// The prefill side: rooms, the Sender's calls, lookups and binding, peers'
// losses, deadlines and the state machine. Messages from decode ranks are in
// prefill_messages.cc; writes, batches and reports in prefill_writes.cc.
#include <fmt/format.h>

#include "engine/prefill_side.h"
#include "log.h"

namespace pdkv::engine {

PrefillSide::PrefillSide(EngineContext& ctx)
    : ctx_(ctx),
      batches_(ctx.loop, ctx.transport),
      notices_(ctx.transport.capabilities().notifications) {}

PrefillSide::PrefillRoom* PrefillSide::find(RoomId room) {
  auto it = rooms_.find(room);
  return it == rooms_.end() ? nullptr : &it->second;
}

PrefillSide::PrefillRoom& PrefillSide::orphan(RoomId id) {
  PrefillRoom& room = rooms_[id];
  room.id = id;
  room.early = true;
  ++early_rooms_;
  ctx_.counters.rooms = rooms_.size();
  arm_deadline(room, PrefillRoom::Deadline::kData);
  return room;
}

void PrefillSide::open(std::shared_ptr<RoomHandle> handle, std::optional<EngineKey> engine) {
  const RoomId id = handle->id;
  PrefillRoom* found = find(id);
  PrefillRoom& room = found ? *found : rooms_[id];
  room.id = id;
  ctx_.counters.rooms = rooms_.size();
  if (std::exchange(room.early, false)) --early_rooms_;
  room.handle = std::move(handle);
  if (room.failure) {  // aborted before this Sender came: it finds the failure
    ctx_.fail(room.handle.get(), *room.failure);
    return;
  }
  arm_deadline(room, PrefillRoom::Deadline::kData);
  if (engine) {
    if (room.engine && *room.engine != *engine) {
      return fail(room,
                  Status::invalid_argument(fmt::format(
                      "room {} is bound for engine '{}' dp {}, but its metadata came from "
                      "'{}' dp {}",
                      id, engine->first, engine->second, room.engine->first, room.engine->second)));
    }
    room.engine = engine;
    room.engine_named = true;
  }
  if (room.engine) ensure_bound(room);
  step(room);
}

void PrefillSide::init(RoomId id, uint64_t num_pages, uint32_t aux_slot,
                       std::vector<uint32_t> state_slots) {
  PrefillRoom* room = find(id);
  if (room == nullptr || room->failure) return;
  room->initialized = true;
  room->num_pages = num_pages;
  room->aux_slot = aux_slot;
  room->state_slots = std::move(state_slots);
  // Metadata that arrived before init() is checked against it now.
  for (auto& [key, dest] : room->dests) {
    if (!dest.info) continue;
    if (uint64_t(dest.info->dst_pages_size()) != num_pages ||
        size_t(dest.info->state_slots_size()) != room->state_slots.size()) {
      return fail(*room, Status::invalid_argument(fmt::format(
                             "room {}: {} offers {} pages and {} state slots, prefill sends {} "
                             "and {}",
                             id, describe(dest.rank), dest.info->dst_pages_size(),
                             dest.info->state_slots_size(), num_pages, room->state_slots.size())));
    }
  }
  step(*room);
}

void PrefillSide::send(RoomId id, std::vector<uint64_t> pages, bool last) {
  PrefillRoom* room = find(id);
  if (room == nullptr || room->failure) return;
  room->pages.insert(room->pages.end(), pages.begin(), pages.end());
  room->last = last;
  step(*room);
}

void PrefillSide::abort(RoomId id, const std::string& reason) {
  if (PrefillRoom* room = find(id)) {
    fail(*room, Status::aborted(fmt::format("prefill {} aborted room {}: {}", describe(ctx_.self),
                                            id, reason)));
  }
}

void PrefillSide::close(RoomId id) {
  PrefillRoom* room = find(id);
  if (room == nullptr) return;
  room->handle.reset();
  room->closed = true;
  if (!room->failure && !room->succeeded) {
    return fail(*room, Status::aborted(fmt::format("room {} closed by its sender", id)));
  }
  maybe_erase(*room);
}

void PrefillSide::ensure_bound(PrefillRoom& room) {
  if (room.bound || room.lookup_pending || !room.engine) return;
  const RoomId id = room.id;
  auto cached = ctx_.lookups.want(
      *room.engine, [this, id](const Result<const PeerEngine*>& engine) { on_lookup(id, engine); });
  if (cached) {
    bind(room, **cached);
  } else {
    room.lookup_pending = true;
  }
}

void PrefillSide::on_lookup(RoomId id, const Result<const PeerEngine*>& engine) {
  PrefillRoom* room = find(id);
  if (room == nullptr) return;
  room->lookup_pending = false;
  if (!engine.is_ok()) {
    for (auto& [info, answer] : room->early_infos) answer->send(engine.status());
    room->early_infos.clear();
    return fail(*room, engine.status());
  }
  if (!room->bound) bind(*room, **engine);
}

void PrefillSide::bind(PrefillRoom& room, const PeerEngine& engine) {
  const RankKey me{ctx_.config.tp_rank, ctx_.config.pp_rank};
  for (const Link& link : engine.links) {
    if (!(link.src == me)) continue;
    Destination& dest = room.dests[link.dst];
    dest.key = link.dst;
    dest.link = link;
    dest.rank = engine.topology.at(link.dst);
    dest.peer = ctx_.peers.attach(dest.rank, room.id);  // watched from now on
  }
  room.bound = true;
  auto early = std::move(room.early_infos);
  room.early_infos.clear();
  const RoomId id = room.id;
  for (auto& [info, answer] : early) {
    PrefillRoom* r = find(id);
    if (r == nullptr) {
      answer->send(Status::aborted(fmt::format("room {} ended", id)));
      continue;
    }
    (void)accept_info(*r, info, answer);
  }
  if (PrefillRoom* r = find(id)) step(*r);
}

void PrefillSide::arm_deadline(PrefillRoom& room, PrefillRoom::Deadline kind) {
  ctx_.loop.cancel(room.deadline);
  const RoomId id = room.id;
  room.deadline_kind = kind;
  room.deadline =
      ctx_.loop.after(kind == PrefillRoom::Deadline::kData ? ctx_.config.timeouts.waiting_for_data
                                                           : ctx_.config.timeouts.transfer,
                      [this, id] { on_deadline(id); });
}

void PrefillSide::cancel_deadline(PrefillRoom& room) {
  ctx_.loop.cancel(room.deadline);
  room.deadline = 0;
  room.deadline_kind = PrefillRoom::Deadline::kNone;
}

void PrefillSide::on_deadline(RoomId id) {
  PrefillRoom* room = find(id);
  if (room == nullptr) return;
  const bool data = room->deadline_kind == PrefillRoom::Deadline::kData;
  room->deadline = 0;
  room->deadline_kind = PrefillRoom::Deadline::kNone;
  const auto& t = ctx_.config.timeouts;
  if (!room->handle && !room->closed) {
    room->expired = true;
    if (room->failure) return maybe_erase(*room);  // the failure waited for a Sender in vain
    return fail(*room, Status::deadline_exceeded(fmt::format(
                           "room {}: metadata arrived but no sender opened it within {} ms", id,
                           t.waiting_for_data.count())));
  }
  if (data) {
    const std::string missing =
        room->bound ? names_of(room->dests, [](const Destination& d) { return !d.info; })
                    : "any decode rank";
    return fail(*room,
                Status::deadline_exceeded(fmt::format("room {}: no metadata from [{}] within {} ms",
                                                      id, missing, t.waiting_for_data.count())));
  }
  // A destination whose bytes are visible and whose success report is on
  // the wire is decided by the report's reply (it has a deadline of its
  // own), not by this timer.
  using Report = Destination::Report;
  const std::string missing = names_of(room->dests, [](const Destination& d) {
    return d.report != Report::kAcked && d.report != Report::kSending;
  });
  if (missing.empty()) return;
  fail(*room,
       Status::deadline_exceeded(fmt::format("room {}: transfer to [{}] not complete within {} ms",
                                             id, missing, t.transfer.count())));
}

void PrefillSide::step(PrefillRoom& room) {
  ++ctx_.counters.room_steps;
  if (room.failure) return drive_failure(room);
  if (room.succeeded || !room.bound || !room.handle) return;
  bool all_infos = true;
  for (const auto& [key, d] : room.dests) all_infos &= d.info.has_value();
  if (!all_infos) return;  // Bootstrapping
  if (room.deadline_kind == PrefillRoom::Deadline::kData) {
    cancel_deadline(room);  // no clock while the application computes
  }
  ctx_.advance(room.handle.get(), PollState::kWaitingForInput);
  if (!room.initialized) return;
  if (room.dests.empty()) {
    // The transfer map gives this rank nothing to send for this room.
    room.succeeded = true;
    ctx_.advance(room.handle.get(), PollState::kSuccess);
    return;
  }
  for (auto& [key, dest] : room.dests) {
    if (dest.aborted) continue;
    if (Status posted = post_writes(room, dest); !posted.is_ok()) return fail(room, posted);
  }
  if (room.pages.empty() && !room.last) return;
  ctx_.advance(room.handle.get(), PollState::kTransferring);
  if (room.last && room.deadline_kind == PrefillRoom::Deadline::kNone) {
    arm_deadline(room, PrefillRoom::Deadline::kTransfer);
  }
  bool all_acked = true;
  for (auto& [key, dest] : room.dests) {
    if (dest.report == Destination::Report::kNone && complete(room, dest)) {
      report(room, dest, Status::ok());
    }
    all_acked &= dest.report == Destination::Report::kAcked;
  }
  if (!all_acked) return;
  room.succeeded = true;
  cancel_deadline(room);
  {
    std::lock_guard lock(room.handle->mu);
    TransferMetrics& m = room.handle->metrics_;
    for (const auto& [key, dest] : room.dests) m.bytes += dest.bytes;
    if (room.first_post) {
      m.latency =
          std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - *room.first_post);
    }
  }
  ctx_.advance(room.handle.get(), PollState::kSuccess);
}

void PrefillSide::fail(PrefillRoom& room, const Status& reason) {
  if (room.succeeded) return maybe_erase(room);
  if (room.failure) return drive_failure(room);  // the first reason stays
  room.failure = reason;
  logger("engine")->warn("room {} failed: {}", room.id, reason.message());
  if (room.handle || room.closed) cancel_deadline(room);  // an orphan keeps its failure a while
  publish_failure(room);
  for (auto& [info, answer] : room.early_infos) answer->send(reason);
  room.early_infos.clear();
  for (auto& [key, dest] : room.dests) {
    if (dest.batches > 0 && room.drain_timer == 0) {
      const RoomId id = room.id;
      room.drain_timer =
          ctx_.loop.after(ctx_.config.timeouts.transfer, [this, id] { on_drain_timeout(id); });
    }
  }
  drive_failure(room);
}

void PrefillSide::publish_failure(PrefillRoom& room, bool even_under_notice) {
  if (room.failure_published || !room.failure) return;
  for (const auto& [key, dest] : room.dests) {
    if (dest.carries_notice && !even_under_notice) return;
  }
  room.failure_published = true;
  ctx_.fail(room.handle.get(), *room.failure);
}

void PrefillSide::drive_failure(PrefillRoom& room) {
  ++ctx_.counters.room_steps;
  publish_failure(room);
  bool draining = false;
  for (auto& [key, dest] : room.dests) {
    if (dest.batches > 0) {
      draining = true;
      continue;
    }
    // Nothing of this room is on its way to that rank any more: now it may
    // hear of the failure, and its aborts are answered.
    for (const AnswerPtr& answer : dest.abort_answers) answer->send(Status::ok());
    dest.abort_answers.clear();
    release_gather(dest);
    if (dest.report == Destination::Report::kNone && !dest.aborted) {
      report(room, dest, *room.failure);
    }
  }
  if (!draining) {
    ctx_.loop.cancel(room.drain_timer);
    room.drain_timer = 0;
  }
  maybe_erase(room);
}

void PrefillSide::maybe_erase(PrefillRoom& room) {
  const bool ended = room.failure || room.succeeded;
  if (!ended || room.handle || room.lookup_pending || !(room.closed || room.expired)) return;
  for (const auto& [key, dest] : room.dests) {
    if (dest.batches > 0 || dest.gathering || dest.report == Destination::Report::kSending ||
        dest.report == Destination::Report::kFailureSending) {
      return;
    }
  }
  for (const auto& [key, dest] : room.dests) ctx_.peers.detach(dest.peer, room.id);
  ctx_.loop.cancel(room.deadline);
  ctx_.loop.cancel(room.drain_timer);
  const RoomId id = room.id;
  if (room.early) --early_rooms_;
  rooms_.erase(id);
  ctx_.directory.bury(id);
  ctx_.counters.rooms = rooms_.size();
}

bool PrefillSide::on_link_lost(RoomId id, const std::string& peer, const Status& reason) {
  PrefillRoom* room = find(id);
  if (room == nullptr) return false;
  bool needed = false;
  for (auto& [key, dest] : room->dests) {
    // A destination that acknowledged, or is acknowledging (a success report
    // in flight is decided by its reply), owes this room nothing more.
    if (dest.peer != peer || dest.report == Destination::Report::kAcked ||
        dest.report == Destination::Report::kSending) {
      continue;
    }
    dest.abort_answers.clear();
    if (dest.report != Destination::Report::kNone) continue;  // told, or being told
    needed |= !room->failure.has_value();                     // a failed room only drains
    // The failure is told over a fresh link once nothing of the room is on
    // its way there: the peer may only have been cut off, and waits for it.
    fail(*room, reason);
    if ((room = find(id)) == nullptr) return true;
  }
  return needed;
}

void PrefillSide::on_wire_ready(RoomId id, const std::string&) {
  if (PrefillRoom* room = find(id)) step(*room);
}

void PrefillSide::on_wire_failed(RoomId id, const std::string& peer, const Status& reason) {
  PrefillRoom* room = find(id);
  if (room == nullptr) return;
  for (auto& [key, dest] : room->dests) {
    if (dest.peer == peer && !dest.aborted && !complete(*room, dest)) return fail(*room, reason);
  }
}

void PrefillSide::shutdown(const Status& reason) {
  std::vector<RoomId> ids;
  for (const auto& [id, room] : rooms_) ids.push_back(id);
  for (RoomId id : ids) {
    if (PrefillRoom* room = find(id)) fail(*room, reason);
  }
}

void PrefillSide::give_up() {
  giving_up_ = true;
  const Status why = Status::unavailable(fmt::format("{} is shutting down", describe(ctx_.self)));
  for (auto& [id, room] : rooms_) {
    publish_failure(room,
                    /*even_under_notice=*/true);  // the engine goes, and its transport with it
    for (auto& [info, answer] : room.early_infos) answer->send(why);
    room.early_infos.clear();
    for (auto& [key, dest] : room.dests) {
      for (const AnswerPtr& answer : dest.abort_answers) answer->send(why);
      dest.abort_answers.clear();
    }
  }
}

}  // namespace pdkv::engine

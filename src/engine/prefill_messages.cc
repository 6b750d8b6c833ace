// The prefill side's incoming messages from decode ranks: metadata (and
// engine notices), checked against the room and the destination's pool, and
// aborts, answered once the room's writes to that rank have ended.
#include <fmt/format.h>

#include "engine/prefill_side.h"

namespace pdkv::engine {
namespace {

RankKey key_of(const proto::RankRef& r) { return {r.tp_rank(), r.pp_rank()}; }

}  // namespace

Status PrefillSide::room_for_early_message(RoomId id) const {
  if (early_rooms_ < ctx_.config.limits.early_rooms) return Status::ok();
  return Status::resource_exhausted(
      fmt::format("room {}: {} rooms known only from early messages are open on {} already "
                  "(Limits::early_rooms)",
                  id, early_rooms_, describe(ctx_.self)));
}

void PrefillSide::on_transfer_info(const proto::TransferInfo& info, AnswerPtr answer) {
  const RoomId id = info.room();
  if (uint64_t(info.dst_pages_size()) > ctx_.config.limits.page_list) {
    return answer->send(Status::resource_exhausted(
        fmt::format("room {}: {} lists {} pages, more than {} (Limits::page_list)", id,
                    describe(info.decode()), info.dst_pages_size(), ctx_.config.limits.page_list)));
  }
  PrefillRoom* found = find(id);
  if (ctx_.directory.closed_before(id) || (found && found->closed)) {
    return answer->send(Status::failed_precondition(
        fmt::format("room {} is closed on {}", id, describe(ctx_.self))));
  }
  const EngineKey engine{info.decode().engine_id(), info.decode().dp_rank()};
  if (found && found->engine && *found->engine != engine) {
    return answer->send(Status::invalid_argument(
        fmt::format("room {} is bound for engine '{}' dp {}, not {}", id, found->engine->first,
                    found->engine->second, describe(info.decode()))));
  }
  // A room that already failed answers with its own failure (code and reason).
  if (found && found->failure) return answer->send(*found->failure);
  // Metadata may come before the Sender: it opens the room, for a while.
  if (!found) {
    if (Status full = room_for_early_message(id); !full.is_ok()) return answer->send(full);
  }
  PrefillRoom& room = found ? *found : orphan(id);
  room.engine = engine;
  if (!room.bound) {
    room.early_infos.emplace_back(info, std::move(answer));
    return ensure_bound(room);
  }
  const bool accepted = accept_info(room, info, answer);
  if (!accepted && found == nullptr) {
    // A room is only opened for metadata that is accepted.
    for (const auto& [key, dest] : room.dests) ctx_.peers.detach(dest.peer, id);
    ctx_.loop.cancel(room.deadline);
    if (room.early) --early_rooms_;
    rooms_.erase(id);
    ctx_.counters.rooms = rooms_.size();
    return;
  }
  step(room);
}

bool PrefillSide::accept_info(PrefillRoom& room, const proto::TransferInfo& info,
                              const AnswerPtr& answer) {
  auto refuse = [&](const Status& why) {
    answer->send(why);
    return false;
  };
  if (room.failure) return refuse(*room.failure);
  if (info.engine_notice()) {  // the engine was all it said
    answer->send(Status::ok());
    return true;
  }
  auto dest = room.dests.find(key_of(info.decode()));
  if (dest == room.dests.end()) {
    return refuse(Status::invalid_argument(
        fmt::format("room {}: {} has nothing to send to {}; its destinations are [{}]", room.id,
                    describe(ctx_.self), describe(info.decode()),
                    names_of(room.dests, [](const Destination&) { return true; }))));
  }
  if (dest->second.rank.incarnation() != info.decode().incarnation()) {
    // Our view of that engine is stale (it restarted unseen): look again next time.
    ctx_.lookups.forget_peer(dest->second.peer);
    return refuse(Status::failed_precondition(fmt::format(
        "room {}: {} incarnation {} is not the registered one ({})", room.id,
        describe(info.decode()), info.decode().incarnation(), dest->second.rank.incarnation())));
  }
  if (Status bad = check_info(room, dest->second, info); !bad.is_ok()) return refuse(bad);
  dest->second.info = info;
  if (room.handle) {
    std::lock_guard lock(room.handle->mu);
    room.handle->decode_prefix_pages = info.prefix_pages();
  }
  answer->send(Status::ok());
  return true;
}

Status PrefillSide::check_info(const PrefillRoom& room, const Destination& dest,
                               const proto::TransferInfo& info) const {
  const std::string name = describe(dest.rank);
  if (dest.info) {
    return Status::already_exists(fmt::format("room {}: second metadata from {}", room.id, name));
  }
  const uint64_t pool = dest.rank.kv_spec().num_pages();
  std::vector<bool> seen(pool);
  for (int i = 0; i < info.dst_pages_size(); ++i) {
    const uint64_t page = info.dst_pages(i);
    if (page >= pool) {
      return Status::out_of_range(
          fmt::format("room {}: {} page list entry {} is page {}, but its pool has {} pages",
                      room.id, name, i, page, pool));
    }
    if (seen[page]) {
      return Status::invalid_argument(
          fmt::format("room {}: {} lists page {} twice", room.id, name, page));
    }
    seen[page] = true;
  }
  for (const auto& [key, other] : room.dests) {
    if (other.info && other.info->prefix_pages() != info.prefix_pages()) {
      return Status::invalid_argument(
          fmt::format("room {}: {} holds a prefix of {} pages, but {} holds {}", room.id, name,
                      info.prefix_pages(), describe(other.rank), other.info->prefix_pages()));
    }
  }
  if (room.initialized && uint64_t(info.dst_pages_size()) != room.num_pages) {
    return Status::invalid_argument(fmt::format("room {}: {} offers {} pages, prefill sends {}",
                                                room.id, name, info.dst_pages_size(),
                                                room.num_pages));
  }
  if (dest.link.writes_aux && info.aux_slot() >= dest.rank.aux_slots()) {
    return Status::out_of_range(fmt::format("room {}: {} aux slot {} of {} slots", room.id, name,
                                            info.aux_slot(), dest.rank.aux_slots()));
  }
  if (room.initialized && size_t(info.state_slots_size()) != room.state_slots.size()) {
    return Status::invalid_argument(fmt::format("room {}: {} offers {} state slots, prefill has {}",
                                                room.id, name, info.state_slots_size(),
                                                room.state_slots.size()));
  }
  if (info.staging_bytes() > 0 &&
      (ctx_.config.staging_bytes == 0 || info.staging_offset() > dest.rank.staging_bytes() ||
       info.staging_bytes() > dest.rank.staging_bytes() - info.staging_offset())) {
    return Status::out_of_range(fmt::format(
        "room {}: {} staging slot [{}, {}) outside its {}-byte staging pool, or this rank has "
        "no staging pool ({} bytes)",
        room.id, name, info.staging_offset(), info.staging_offset() + info.staging_bytes(),
        dest.rank.staging_bytes(), ctx_.config.staging_bytes));
  }
  if (info.staging_bytes() > ctx_.config.staging_bytes) {
    return Status::out_of_range(
        fmt::format("room {}: {} reserved {} staging bytes, more than this rank's pool of {}",
                    room.id, name, info.staging_bytes(), ctx_.config.staging_bytes));
  }
  for (uint32_t s : info.state_slots()) {
    if (s >= dest.rank.state().num_slots()) {
      return Status::out_of_range(fmt::format("room {}: {} state slot {} of {} slots", room.id,
                                              name, s, dest.rank.state().num_slots()));
    }
  }
  return Status::ok();
}

void PrefillSide::on_abort(const proto::AbortRequest& request, AnswerPtr answer) {
  const RoomId id = request.room();
  PrefillRoom* found = find(id);
  if (found == nullptr && ctx_.directory.closed_before(id)) {
    return answer->send(Status::ok());  // nothing of it is in flight here
  }
  const Status why = Status::aborted(
      fmt::format("{} aborted room {}: {}", describe(request.decode()), id, request.reason()));
  // Aborted before this rank's Sender opened it: the failure waits for it.
  if (!found) {
    if (Status full = room_for_early_message(id); !full.is_ok()) return answer->send(full);
  }
  PrefillRoom& room = found ? *found : orphan(id);
  const EngineKey engine{request.decode().engine_id(), request.decode().dp_rank()};
  if (room.engine && *room.engine != engine) {
    return answer->send(Status::invalid_argument(
        fmt::format("room {} is bound for engine '{}' dp {}, not {}", id, room.engine->first,
                    room.engine->second, describe(request.decode()))));
  }
  if (!room.bound) {
    // Nothing is written before the destinations are known.
    answer->send(Status::ok());
    return fail(room, why);
  }
  auto dest = room.dests.find(key_of(request.decode()));
  if (dest == room.dests.end()) {
    return answer->send(
        Status::invalid_argument(fmt::format("room {}: {} is not a destination of {}", id,
                                             describe(request.decode()), describe(ctx_.self))));
  }
  if (dest->second.rank.incarnation() != request.decode().incarnation()) {
    // Only the registered process of that rank speaks for it.
    return answer->send(Status::invalid_argument(fmt::format(
        "room {}: {} incarnation {} is not the registered one ({})", id, describe(request.decode()),
        request.decode().incarnation(), dest->second.rank.incarnation())));
  }
  dest->second.aborted = true;
  // Acknowledged once no batch of this room to that rank is in flight.
  if (giving_up_) {
    answer->send(Status::unavailable(fmt::format("{} is shutting down", describe(ctx_.self))));
  } else {
    dest->second.abort_answers.push_back(std::move(answer));
  }
  if (room.failure) return drive_failure(room);
  fail(room, why);
}

}  // namespace pdkv::engine

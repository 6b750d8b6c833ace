// The decode side's traffic with its sources: the metadata (with a staging
// slot when the route is staged), scattering staged blocks, and aborts.
#include <fmt/format.h>

#include <algorithm>

#include "engine/decode_side.h"
#include "grpc_status.h"

namespace pdkv::engine {
namespace {

constexpr auto kMaxAbortBackoff = std::chrono::milliseconds(1000);

}  // namespace

void DecodeSide::send_infos(DecodeRoom& room) {
  if (!room.metadata || !room.bound || room.failure) return;
  bool released = false;
  for (auto& [key, source] : room.sources) {
    using Info = Source::Info;
    if (source.info != Info::kNotSent && source.info != Info::kWaitingForSlot) continue;
    const Result<bool> ready = reserve_staging(room, source);
    if (!ready.is_ok()) return fail(room, ready.status());
    if (!*ready) {
      if (source.info != Info::kWaitingForSlot) slot_waiters_.push_back(room.id);
      source.info = Info::kWaitingForSlot;
      continue;
    }
    if (!released) {
      // The pages and slots named in the metadata may have been read
      // (verified, scattered) by this process: that comes before the peer
      // writes them.
      ctx_.transport.release_to_peers();
      released = true;
    }
    proto::TransferInfo info = *room.metadata;
    if (source.slot) {
      info.set_staging_offset(*source.slot);
      info.set_staging_bytes(source.slot_bytes);
    }
    source.info = Info::kSending;
    ControlLink* link = ctx_.peers.link(source.peer);
    const RoomId id = room.id;
    const RankKey src = key;
    link->send_transfer_info(std::move(info), kControlCallTimeout,
                             [this, id, src](const grpc::Status& s) { on_info_reply(id, src, s); });
  }
}

void DecodeSide::on_info_reply(RoomId id, RankKey key, const grpc::Status& s) {
  DecodeRoom* room = find(id);
  if (room == nullptr) return;
  Source& source = room->sources.at(key);
  if (source.info != Source::Info::kSending) return;
  // A definitive refusal means the source will not write; anything else
  // (a timeout, a lost reply) may hide an acceptance: the room fails, and
  // is quiet only once the source answers the abort or is lost.
  source.info = s.ok() || !is_definitive(s) ? Source::Info::kAccepted : Source::Info::kRefused;
  if (!s.ok()) {
    fail(*room,
         from_grpc(s, fmt::format("room {}: {} refused the metadata", id, describe(source.rank))));
    return;
  }
  step(*room);
}

Result<TransferPlan> DecodeSide::staging_plan(const Source& source,
                                              const proto::TransferInfo& info) {
  std::vector<uint64_t> numbered(info.dst_pages_size());
  for (size_t i = 0; i < numbered.size(); ++i) numbered[i] = i;
  const std::vector<uint64_t> dst(info.dst_pages().begin(), info.dst_pages().end());
  return ctx_.planner.plan(shard_of(source.rank), ctx_.shard, *source.link.kv, numbered, dst);
}

Result<bool> DecodeSide::reserve_staging(const DecodeRoom& room, Source& source) {
  const EngineConfig& config = ctx_.config;
  const proto::TransferInfo& metadata = *room.metadata;
  // Device pools that a transport cannot write in place (here or at the
  // source) leave no choice: the route is staged, or waits until it can be.
  const bool must = source.link.kv && (ctx_.staged_only() || source.rank.kv_staged_only());
  if (must) {
    if (config.staging_bytes == 0 || source.rank.staging_bytes() == 0) {
      return Status::failed_precondition(fmt::format(
          "room {}: {} and {} must stage KV (device pools the transport cannot register), but "
          "{} has no staging pool",
          room.id, describe(source.rank), describe(ctx_.self),
          config.staging_bytes == 0 ? describe(ctx_.self) : describe(source.rank)));
    }
  } else if (config.staging == Staging::kOff || config.staging == Staging::kNaive ||
             config.staging_bytes == 0 || !source.link.kv || source.rank.staging_bytes() == 0 ||
             uint64_t(metadata.dst_pages_size()) > source.rank.kv_spec().num_pages()) {
    return true;
  }
  auto plan = staging_plan(source, metadata);
  if (!plan.is_ok()) {  // a bad route surfaces at the source, unless it cannot go direct
    return must ? Result<bool>(plan.status()) : Result<bool>(true);
  }
  if (plan->bytes() == 0) return true;
  // Auto: staging when the transport's writes of these fragments would cost
  // more than gathering them there and scattering them here, with those of
  // the room's other sources that send KV (the transport says what a write
  // from this source costs).
  if (!must && config.staging == Staging::kAuto) {
    const auto kv_sources = std::count_if(room.sources.begin(), room.sources.end(),
                                          [](const auto& s) { return bool(s.second.link.kv); });
    const uint64_t overhead =
        ctx_.transport.write_overhead_bytes_from(source.rank.transport_descriptor());
    if (!staging_pays(*plan, overhead, static_cast<uint32_t>(kv_sources))) return true;
  }
  // Both pools must hold the block: ours receives it, the source gathers it.
  const bool fits =
      plan->bytes() <= config.staging_bytes && plan->bytes() <= source.rank.staging_bytes();
  if (!fits) {
    if (!must) return true;  // direct instead
    return Status::failed_precondition(fmt::format(
        "room {}: {} must be staged ({} bytes), but the staging pools hold {} here and {} at "
        "the source",
        room.id, describe(source.rank), plan->bytes(), config.staging_bytes,
        source.rank.staging_bytes()));
  }
  auto offset = ctx_.staging.allocate(plan->bytes());
  if (!offset) return !must;  // no room: direct, or wait when it must be staged
  source.slot = *offset;
  source.slot_bytes = plan->bytes();
  ctx_.note_staged(room.handle.get());
  return true;
}

void DecodeSide::start_scatter(DecodeRoom& room, Source& source) {
  Result<TransferPlan> plan = staging_plan(source, *room.metadata);
  source.scattering = true;
  if (!plan.is_ok()) return on_scattered(room.id, source.key, plan.status());  // ends at once
  ctx_.copy_then(
      EngineContext::Copy::kScatter, std::move(*plan), *source.slot,
      [this, id = room.id, key = source.key](const Status& s) { on_scattered(id, key, s); });
}

void DecodeSide::on_scattered(RoomId id, RankKey key, const Status& scattered) {
  DecodeRoom* room = find(id);
  if (room == nullptr) return;  // never: a room with a scatter under way is kept
  Source& source = room->sources.at(key);
  source.scattering = false;
  release_slot(source);
  if (!scattered.is_ok() && !room->failure) {
    return fail(*room,
                scattered.with_context(fmt::format("room {}: scattering the staged bytes of {}", id,
                                                   describe(source.rank))));
  }
  // A room that failed meanwhile is published failed now (step: check_quiet).
  source.succeeded = !room->failure;
  step(*room);
}

void DecodeSide::release_slot(Source& source) {
  if (!source.slot || source.scattering) return;  // on_scattered releases it
  ctx_.staging.release(*source.slot);
  source.slot.reset();
  // In a task of its own: a waiter's step may erase a room (this one too)
  // that the caller goes on using.
  ctx_.loop.post([this] { wake_slot_waiters(); });
}

void DecodeSide::wake_slot_waiters() {
  auto waiting = std::move(slot_waiters_);
  slot_waiters_.clear();
  for (RoomId id : waiting) {
    if (DecodeRoom* room = find(id)) send_infos(*room);
  }
}

void DecodeSide::send_abort(DecodeRoom& room, Source& source) {
  if (source.abort == Source::Abort::kSending) return;
  // A lost source hears it over a fresh link, a few times at most.
  if (source.lost && source.lost_tells >= kFailureNoticeTries) return;
  ControlLink* link = ctx_.peers.link_to_tell(source.peer);
  if (link == nullptr) return;
  if (source.lost) ++source.lost_tells;
  source.abort = Source::Abort::kSending;
  proto::AbortRequest request;
  request.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  request.set_room(room.id);
  *request.mutable_decode() = ctx_.self_ref();
  request.set_reason(!room.abort_reason.empty() ? room.abort_reason
                     : room.failure             ? room.failure->message()
                                                : "aborted");
  const RoomId id = room.id;
  const RankKey key = source.key;
  // The source answers once its writes to us have ended, which may take up
  // to its transfer timeout.
  link->abort_room(std::move(request), ctx_.config.timeouts.transfer + kControlCallTimeout,
                   [this, id, key](const grpc::Status& s) { on_abort_reply(id, key, s); });
}

void DecodeSide::on_abort_reply(RoomId id, RankKey key, const grpc::Status& s) {
  DecodeRoom* room = find(id);
  if (room == nullptr) return;
  Source& source = room->sources.at(key);
  source.abort = Source::Abort::kNone;
  if (s.ok() || is_definitive(s)) {
    source.abort = Source::Abort::kAcked;  // nothing of the room is in flight from it
  } else if (!source.quiet() && ctx_.peers.health(source.peer).is_ok()) {
    // Alive but not answering in time: ask again, until it answers or is lost.
    ++room->retries;
    const auto delay = source.abort_backoff;
    source.abort_backoff = std::min(source.abort_backoff * 2, kMaxAbortBackoff);
    ctx_.loop.after(delay, [this, id, key] {
      DecodeRoom* r = find(id);
      if (r == nullptr) return;
      Source& src = r->sources.at(key);
      if (!src.quiet()) send_abort(*r, src);
    });
  } else if (source.lost) {
    // Its fresh link was lost too: it may still be cut off, or be back with
    // a path that returned just after the link gave up. It waits for this.
    send_abort(*room, source);
  }
  check_quiet(*room);
  if ((room = find(id))) maybe_erase(*room);  // the last try may have held it
}

}  // namespace pdkv::engine

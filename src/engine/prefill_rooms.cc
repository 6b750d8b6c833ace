// The prefill half of EngineCore: Sender calls, incoming metadata, writes
// through the transport, reports and aborts from decode ranks.
#include <fmt/format.h>

#include <algorithm>

#include "engine/core.h"
#include "grpc_status.h"
#include "log.h"

namespace pdkv::engine {
namespace {

RankKey key_of(const proto::RankRef& r) { return {r.tp_rank(), r.pp_rank()}; }

std::string names_of(const std::map<RankKey, Destination>& dests,
                     bool (*pick)(const Destination&)) {
  std::string out;
  for (const auto& [key, d] : dests) {
    if (!pick(d)) continue;
    if (!out.empty()) out += ", ";
    out += describe(d.rank);
  }
  return out;
}

}  // namespace

Status EngineCore::open_prefill_room(RoomId id, const std::string& decode_engine, uint32_t dp) {
  if (config_.role != Role::kPrefill) {
    return Status::failed_precondition("sender() needs a prefill engine; this one is decode");
  }
  std::lock_guard lock(mu_);
  PDKV_RETURN_IF_ERROR(check_room_unused(id));
  auto& slot = prefill_rooms_[id];
  if (slot && slot->has_sender) {
    return Status::already_exists(fmt::format("room {} already has a sender", id));
  }
  if (slot && (slot->decode_engine != decode_engine || slot->decode_dp != dp)) {
    return Status::invalid_argument(
        fmt::format("room {} is bound for engine '{}' dp {}, but its metadata came from '{}' dp {}",
                    id, decode_engine, dp, slot->decode_engine, slot->decode_dp));
  }
  if (!slot) {
    slot = std::make_unique<PrefillRoom>();
    slot->id = id;
    slot->decode_engine = decode_engine;
    slot->decode_dp = dp;
    peer_engine({decode_engine, dp});
  }
  slot->has_sender = true;
  slot->deadline = Clock::time_point::max();
  wake();
  return Status::ok();
}

Status EngineCore::prefill_init(RoomId id, uint64_t num_pages, uint32_t aux_slot,
                                std::vector<uint32_t> state_slots) {
  std::lock_guard lock(mu_);
  auto it = prefill_rooms_.find(id);
  if (it == prefill_rooms_.end()) return Status::not_found(fmt::format("room {} is not open", id));
  PrefillRoom& room = *it->second;
  if (room.initialized)
    return Status::failed_precondition(fmt::format("room {}: init() twice", id));
  if (num_pages == 0) return Status::invalid_argument(fmt::format("room {}: 0 pages", id));
  if (config_.aux_bytes > 0 && aux_slot >= config_.aux_slots) {
    return Status::out_of_range(
        fmt::format("room {}: aux slot {} of {} slots", id, aux_slot, config_.aux_slots));
  }
  for (uint32_t s : state_slots) {
    if (s >= config_.state.num_slots) {
      return Status::out_of_range(
          fmt::format("room {}: state slot {} of {} slots", id, s, config_.state.num_slots));
    }
  }
  room.initialized = true;
  room.num_pages = num_pages;
  room.aux_slot = aux_slot;
  room.state_slots = std::move(state_slots);
  room.deadline = Clock::now() + config_.timeouts.waiting_for_data;
  // Metadata that arrived before init() is checked against it now.
  for (auto& [key, dest] : room.destinations) {
    if (!dest.info) continue;
    if (uint64_t(dest.info->dst_pages_size()) != num_pages ||
        size_t(dest.info->state_slots_size()) != room.state_slots.size()) {
      fail_prefill(
          room, Status::invalid_argument(fmt::format(
                    "room {}: {} offers {} pages and {} state slots, prefill sends {} and {}", id,
                    describe(dest.rank), dest.info->dst_pages_size(), dest.info->state_slots_size(),
                    num_pages, room.state_slots.size())));
      break;
    }
  }
  wake();
  return Status::ok();
}

Status EngineCore::prefill_send(RoomId id, std::span<const uint64_t> pages, bool is_last) {
  std::lock_guard lock(mu_);
  auto it = prefill_rooms_.find(id);
  if (it == prefill_rooms_.end()) return Status::not_found(fmt::format("room {} is not open", id));
  PrefillRoom& room = *it->second;
  if (!room.initialized)
    return Status::failed_precondition(fmt::format("room {}: send() before init()", id));
  if (room.state.state() == PollState::kFailed) return room.state.failure();
  if (room.last)
    return Status::failed_precondition(fmt::format("room {}: send() after the last chunk", id));
  const uint64_t total = room.pages.size() + pages.size();
  if (total > room.num_pages) {
    return Status::invalid_argument(fmt::format(
        "room {}: chunks add up to {} pages but init() announced {}", id, total, room.num_pages));
  }
  if (is_last && total != room.num_pages) {
    return Status::invalid_argument(
        fmt::format("room {}: the last chunk ends at {} pages but init() announced {}", id, total,
                    room.num_pages));
  }
  for (uint64_t p : pages) {
    if (p >= config_.kv.num_pages) {
      return Status::out_of_range(fmt::format("room {}: page {} is beyond this pool's {} pages", id,
                                              p, config_.kv.num_pages));
    }
  }
  room.pages.insert(room.pages.end(), pages.begin(), pages.end());
  room.last = is_last;
  wake();
  return Status::ok();
}

void EngineCore::prefill_abort(RoomId id, const std::string& reason) {
  std::lock_guard lock(mu_);
  auto it = prefill_rooms_.find(id);
  if (it == prefill_rooms_.end()) return;
  fail_prefill(*it->second, Status::aborted(fmt::format("prefill {} aborted room {}: {}",
                                                        describe(self_), id, reason)));
  wake();
}

void EngineCore::bind_prefill_room(PrefillRoom& room, const PeerEngine& peer) {
  const RankKey me{config_.tp_rank, config_.pp_rank};
  for (const Link& link : peer.links) {
    if (!(link.src == me)) continue;
    Destination& dest = room.destinations[link.dst];
    dest.link = link;
    dest.rank = peer.topology.at(link.dst);
    link_to(dest.rank);  // start watching the peer now, not at the first report
  }
}

Status EngineCore::on_transfer_info(const proto::TransferInfo& info) {
  const RoomId id = info.room();
  const std::string who =
      fmt::format("{} dp {} tp {} pp {}", info.decode().engine_id(), info.decode().dp_rank(),
                  info.decode().tp_rank(), info.decode().pp_rank());
  std::unique_lock lock(mu_);
  if (config_.role != Role::kPrefill) {
    return Status::failed_precondition(fmt::format("{} is a decode rank", describe(self_)));
  }
  if (closed_before(id)) {
    return Status::failed_precondition(fmt::format("room {} is closed on {}", id, describe(self_)));
  }
  // Metadata names a decode engine this rank may not have looked up yet.
  const EngineKey engine{info.decode().engine_id(), info.decode().dp_rank()};
  const PeerEngine* found = await_peer(lock, engine);
  if (found == nullptr) {
    auto p = peers_.find(engine);
    if (p != peers_.end() && p->second.lookup == PeerEngine::Lookup::kFailed)
      return p->second.error;
    return Status::unavailable(fmt::format("room {}: engine '{}' not known yet", id, engine.first));
  }
  const PeerEngine& peer = *found;

  // Metadata may come before the Sender: then it opens the room, for a while.
  // A room is only created for metadata that is accepted.
  std::unique_ptr<PrefillRoom> fresh;
  PrefillRoom* room = nullptr;
  if (auto it = prefill_rooms_.find(id); it != prefill_rooms_.end()) {
    room = it->second.get();
    if (room->decode_engine != engine.first || room->decode_dp != engine.second) {
      return Status::invalid_argument(fmt::format("room {} is bound for engine '{}' dp {}, not {}",
                                                  id, room->decode_engine, room->decode_dp, who));
    }
  } else {
    fresh = std::make_unique<PrefillRoom>();
    fresh->id = id;
    fresh->decode_engine = engine.first;
    fresh->decode_dp = engine.second;
    fresh->deadline = Clock::now() + config_.timeouts.waiting_for_data;
    room = fresh.get();
  }
  if (room->destinations.empty()) bind_prefill_room(*room, peer);
  auto dest = room->destinations.find(key_of(info.decode()));
  if (dest == room->destinations.end()) {
    return Status::invalid_argument(fmt::format(
        "room {}: {} has nothing to send to {}; its destinations are [{}]", id, describe(self_),
        who, names_of(room->destinations, [](const Destination&) { return true; })));
  }
  if (dest->second.rank.incarnation() != info.decode().incarnation()) {
    return Status::failed_precondition(
        fmt::format("room {}: {} incarnation {} is not the registered one ({})", id, who,
                    info.decode().incarnation(), dest->second.rank.incarnation()));
  }
  PDKV_RETURN_IF_ERROR(accept_info(*room, info));
  dest->second.info = info;
  if (fresh) prefill_rooms_[id] = std::move(fresh);
  wake();
  return Status::ok();
}

Status EngineCore::accept_info(PrefillRoom& room, const proto::TransferInfo& info) {
  const Destination& dest = room.destinations.at(key_of(info.decode()));
  const std::string who = describe(dest.rank);
  if (dest.info) {
    return Status::already_exists(fmt::format("room {}: second metadata from {}", room.id, who));
  }
  // A room that already failed answers with its own failure (code and reason).
  if (room.state.state() == PollState::kFailed) return room.state.failure();
  const uint64_t pool = dest.rank.kv_spec().num_pages();
  std::vector<bool> seen(pool);
  for (int i = 0; i < info.dst_pages_size(); ++i) {
    const uint64_t page = info.dst_pages(i);
    if (page >= pool) {
      return Status::out_of_range(
          fmt::format("room {}: {} page list entry {} is page {}, but its pool has {} pages",
                      room.id, who, i, page, pool));
    }
    if (seen[page]) {
      return Status::invalid_argument(
          fmt::format("room {}: {} lists page {} twice", room.id, who, page));
    }
    seen[page] = true;
  }
  if (room.initialized && uint64_t(info.dst_pages_size()) != room.num_pages) {
    return Status::invalid_argument(fmt::format("room {}: {} offers {} pages, prefill sends {}",
                                                room.id, who, info.dst_pages_size(),
                                                room.num_pages));
  }
  if (dest.link.writes_aux && info.aux_slot() >= dest.rank.aux_slots()) {
    return Status::out_of_range(fmt::format("room {}: {} aux slot {} of {} slots", room.id, who,
                                            info.aux_slot(), dest.rank.aux_slots()));
  }
  if (room.initialized && size_t(info.state_slots_size()) != room.state_slots.size()) {
    return Status::invalid_argument(fmt::format("room {}: {} offers {} state slots, prefill has {}",
                                                room.id, who, info.state_slots_size(),
                                                room.state_slots.size()));
  }
  if (info.staging_bytes() > 0 &&
      (config_.staging_bytes == 0 || info.staging_offset() > dest.rank.staging_bytes() ||
       info.staging_bytes() > dest.rank.staging_bytes() - info.staging_offset())) {
    return Status::out_of_range(fmt::format(
        "room {}: {} staging slot [{}, {}) outside its {}-byte staging pool, or this rank has "
        "no staging pool ({} bytes)",
        room.id, who, info.staging_offset(), info.staging_offset() + info.staging_bytes(),
        dest.rank.staging_bytes(), config_.staging_bytes));
  }
  for (uint32_t s : info.state_slots()) {
    if (s >= dest.rank.state().num_slots()) {
      return Status::out_of_range(fmt::format("room {}: {} state slot {} of {} slots", room.id, who,
                                              s, dest.rank.state().num_slots()));
    }
  }
  return Status::ok();
}

void EngineCore::progress_prefill(PrefillRoom& room, bool& busy) {
  for (auto& [key, dest] : room.destinations) {
    drain(dest);
    busy |= !dest.in_flight.empty();
  }
  const Clock::time_point now = Clock::now();
  if (!room.has_sender) {
    // Opened by metadata or an abort, never by a Sender: forgotten after a while.
    if (now >= room.deadline) {
      fail_prefill(room, Status::deadline_exceeded(fmt::format(
                             "room {}: metadata arrived but no sender opened it within {} ms",
                             room.id, config_.timeouts.waiting_for_data.count())));
      room.expired = true;
    }
    return;
  }
  if (room.state.terminal()) return;
  auto peer = peers_.find({room.decode_engine, room.decode_dp});
  if (peer == peers_.end()) {
    peer_engine({room.decode_engine, room.decode_dp});  // dropped after a peer loss: again
    return;
  }
  if (peer->second.lookup == PeerEngine::Lookup::kPending) return;
  if (peer->second.lookup == PeerEngine::Lookup::kFailed) {
    fail_prefill(room, peer->second.error);
    return;
  }
  if (room.destinations.empty()) bind_prefill_room(room, peer->second);
  if (!room.initialized) return;
  room.state.advance(PollState::kWaitingForInput);
  if (room.destinations.empty()) {
    // The transfer map gives this rank nothing to send for this room.
    room.state.advance(PollState::kSuccess);
    return;
  }
  bool all_infos = true, all_reported = true;
  for (auto& [key, dest] : room.destinations) {
    all_infos &= dest.info.has_value();
    if (!dest.info || dest.aborted) {
      all_reported = false;
      continue;
    }
    const Status posted = post_writes(room, dest);
    if (!posted.is_ok()) {
      fail_prefill(room, posted);
      return;
    }
    busy |= !dest.in_flight.empty();
    const bool complete = room.last && dest.pages_written == room.num_pages &&
                          dest.extras_written && dest.in_flight.empty();
    if (complete && !dest.reported && !dest.report_pending) {
      dest.report_pending = true;
      deferred_.push_back(report_action(room.id, dest.rank, Status::ok()));
    }
    all_reported &= dest.reported;
  }
  if (all_infos) room.state.advance(PollState::kTransferring);
  if (all_reported) {
    room.state.advance(PollState::kSuccess);
    return;
  }
  if (all_infos && room.last && room.deadline > now + config_.timeouts.transfer) {
    room.deadline = now + config_.timeouts.transfer;  // from here on, the transfer timeout
  }
  if (now >= room.deadline) {
    if (!all_infos) {
      fail_prefill(room,
                   Status::deadline_exceeded(fmt::format(
                       "room {}: no metadata from [{}] within {} ms", room.id,
                       names_of(room.destinations, [](const Destination& d) { return !d.info; }),
                       config_.timeouts.waiting_for_data.count())));
    } else if (room.last) {
      fail_prefill(
          room, Status::deadline_exceeded(fmt::format(
                    "room {}: transfer to [{}] not complete within {} ms", room.id,
                    names_of(room.destinations, [](const Destination& d) { return !d.reported; }),
                    config_.timeouts.transfer.count())));
    }
  }
}

Status EngineCore::post_writes(PrefillRoom& room, Destination& dest) {
  const uint64_t available = room.pages.size();
  const bool extras_due = room.last && available == room.num_pages && !dest.extras_written;
  if (dest.pages_written == available && !extras_due) return Status::ok();
  if (!dest.peer) {
    const std::string key = PeerLinks::key_of(dest.rank);
    auto known = transport_peers_.find(key);
    if (known == transport_peers_.end()) {
      PDKV_ASSIGN_OR_RETURN(PeerId peer, transport_->connect(dest.rank.transport_descriptor()));
      known = transport_peers_.emplace(key, peer).first;
    }
    dest.peer = known->second;
  }
  std::vector<WriteOp> ops;
  const proto::TransferInfo& info = *dest.info;
  if (info.staging_bytes() > 0 && dest.link.kv) {
    // Staged: the whole request is gathered into one block once the last
    // chunk is here, and written into the slot the decode rank reserved.
    if (!extras_due) {
      dest.pages_written = available;
      return Status::ok();
    }
    const std::span<const uint64_t> dst(info.dst_pages().data(), info.dst_pages_size());
    PDKV_ASSIGN_OR_RETURN(TransferPlan plan, planner_.plan(shard_, shard_of(dest.rank),
                                                           *dest.link.kv, room.pages, dst));
    if (plan.bytes() != info.staging_bytes()) {
      return Status::invalid_argument(
          fmt::format("room {}: {} reserved a staging slot of {} bytes, but the plan moves {}",
                      room.id, describe(dest.rank), info.staging_bytes(), plan.bytes()));
    }
    if (!dest.local_staging) {
      dest.local_staging = staging_pool_.allocate(plan.bytes());
      if (!dest.local_staging) return Status::ok();  // no room to gather yet: retry when freed
    }
    PDKV_RETURN_IF_ERROR(pool_staging_->gather(plan, *dest.local_staging));
    ops.push_back({staging_key_, *dest.local_staging, dest.rank.staging_region(),
                   info.staging_offset(), plan.bytes()});
    ++stats_.staged_routes;
  } else if (dest.link.kv && staged_only()) {
    return Status::failed_precondition(fmt::format(
        "room {}: {} reserved no staging slot, but this rank's KV pools are device memory that "
        "backend '{}' cannot register",
        room.id, describe(dest.rank), config_.backend));
  } else if (dest.link.kv && dest.pages_written < available) {
    const std::span<const uint64_t> src(room.pages.data() + dest.pages_written,
                                        available - dest.pages_written);
    const std::span<const uint64_t> dst(info.dst_pages().data() + dest.pages_written, src.size());
    PDKV_ASSIGN_OR_RETURN(TransferPlan plan,
                          planner_.plan(shard_, shard_of(dest.rank), *dest.link.kv, src, dst));
    ops.reserve(plan.fragment_count());
    if (dest.pages_written == 0) ++stats_.direct_routes;
    const RegionKey remote_first = dest.rank.kv_region_first();
    // Naive: cut every fragment into one token's bytes of this segment.
    const bool per_head = !config_.kv.mla && config_.kv.layout == Layout::kHnd;
    const uint64_t piece =
        config_.staging == Staging::kNaive
            ? config_.kv.head_bytes() * (per_head ? 1 : dest.link.kv->heads.count)
            : UINT64_MAX;
    plan.for_each([&](const Fragment& f) {
      for (uint64_t at = 0; at < f.length; at += piece) {
        ops.push_back({kv_keys_[f.src_buffer], f.src_offset + at, remote_first + f.dst_buffer,
                       f.dst_offset + at, std::min(piece, f.length - at)});
      }
    });
  }
  if (extras_due) {
    if (dest.link.writes_aux) {
      const uint64_t n = config_.aux_bytes;
      ops.push_back({aux_key_, room.aux_slot * n, dest.rank.aux_region(), info.aux_slot() * n, n});
    }
    if (dest.link.state_channels && !room.state_slots.empty()) {
      // [slot][local layer][local channel][channel_bytes] on both sides.
      const Segment& cs = *dest.link.state_channels;
      const Segment& ls = *dest.link.state_layers;
      const uint64_t cb = config_.state.channel_bytes;
      const uint64_t src_layers = shard_.layers.count, dst_layers = dest.rank.layer_count();
      const uint64_t dst_channels = AxisSharding::even(config_.state.channels, dest.rank.tp_size())
                                        .value()
                                        .owned(dest.rank.tp_rank())
                                        .value()
                                        .count;
      for (size_t i = 0; i < room.state_slots.size(); ++i) {
        for (uint32_t l = 0; l < ls.count; ++l) {
          const uint64_t src =
              ((room.state_slots[i] * src_layers + ls.src_offset + l) * local_channels_ +
               cs.src_offset) *
              cb;
          const uint64_t dst =
              ((info.state_slots(int(i)) * dst_layers + ls.dst_offset + l) * dst_channels +
               cs.dst_offset) *
              cb;
          ops.push_back({state_key_, src, dest.rank.state_region(), dst, cs.count * cb});
        }
      }
    }
    dest.extras_written = true;
  }
  dest.pages_written = available;
  if (ops.empty()) return Status::ok();
  auto batch = transport_->write(*dest.peer, ops);
  if (!batch.is_ok()) {
    return batch.status().with_context(
        fmt::format("room {}: write to {}", room.id, describe(dest.rank)));
  }
  dest.in_flight.push_back(*batch);
  return Status::ok();
}

void EngineCore::fail_prefill(PrefillRoom& room, const Status& reason) {
  if (!room.state.fail(reason)) return;
  logger("engine")->warn("room {} failed: {}", room.id, reason.message());
  for (auto& [key, dest] : room.destinations) {
    if (!dest.reported) deferred_.push_back(report_action(room.id, dest.rank, reason));
  }
}

Action EngineCore::report_action(RoomId id, const proto::RankInfo& dest, const Status& outcome) {
  return [this, id, dest, outcome] {
    auto link = link_to(dest);
    proto::RoomStatus msg;
    msg.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
    msg.set_room(id);
    *msg.mutable_prefill() = self_ref();
    msg.set_success(outcome.is_ok());
    msg.set_reason(outcome.message());
    msg.set_code(static_cast<uint32_t>(outcome.code()));
    proto::ControlReply reply;
    const grpc::Status s = link->call(kControlCallTimeout, [&](grpc::ClientContext& ctx) {
      return link->stub().ReportStatus(&ctx, msg, &reply);
    });
    if (!outcome.is_ok()) return;  // failure notices are best effort: the peer may be gone
    std::lock_guard lock(mu_);
    PrefillRoom* room = find_prefill(id);
    if (room == nullptr) return;
    auto d = room->destinations.find({dest.tp_rank(), dest.pp_rank()});
    if (d == room->destinations.end()) return;
    d->second.report_pending = false;
    if (s.ok()) {
      d->second.reported = true;
    } else {
      fail_prefill(
          *room, from_grpc(s, fmt::format("room {}: reporting success to {}", id, describe(dest))));
    }
    wake();
  };
}

Status EngineCore::on_abort(const proto::AbortRequest& request) {
  const RoomId id = request.room();
  std::unique_lock lock(mu_);
  if (closed_before(id)) return Status::ok();  // nothing of it is in flight here
  PrefillRoom* room = find_prefill(id);
  if (room == nullptr) {
    // Aborted before this rank's Sender opened it: keep the failure for the
    // Sender to find, for a while.
    auto fresh = std::make_unique<PrefillRoom>();
    fresh->id = id;
    fresh->decode_engine = request.decode().engine_id();
    fresh->decode_dp = request.decode().dp_rank();
    fresh->deadline = Clock::now() + config_.timeouts.waiting_for_data;
    fresh->state.fail(Status::aborted(fmt::format(
        "decode dp {} tp {} pp {} of '{}' aborted room {}: {}", request.decode().dp_rank(),
        request.decode().tp_rank(), request.decode().pp_rank(), request.decode().engine_id(), id,
        request.reason())));
    prefill_rooms_[id] = std::move(fresh);
    return Status::ok();
  }
  if (room->destinations.empty()) {
    // The room's map may still be looked up: bind it to find the destination.
    const PeerEngine* peer = await_peer(lock, {room->decode_engine, room->decode_dp});
    room = find_prefill(id);
    if (peer != nullptr && room != nullptr && room->destinations.empty()) {
      bind_prefill_room(*room, *peer);
    }
    if (room == nullptr) return Status::ok();
  }
  auto dest = room->destinations.find(key_of(request.decode()));
  if (dest == room->destinations.end()) {
    return Status::invalid_argument(
        fmt::format("room {}: {} dp {} tp {} pp {} is not a destination of {}", id,
                    request.decode().engine_id(), request.decode().dp_rank(),
                    request.decode().tp_rank(), request.decode().pp_rank(), describe(self_)));
  }
  dest->second.aborted = true;
  fail_prefill(
      *room, Status::aborted(fmt::format("{} aborted room {}: {}", describe(dest->second.rank), id,
                                         request.reason())));
  wake();
  // Acknowledge only once no write of this room to that rank is in flight.
  const RankKey key = dest->first;
  const bool drained = cv_.wait_for(lock, config_.timeouts.transfer, [&] {
    PrefillRoom* r = find_prefill(id);
    return stopping_ || r == nullptr || r->destinations.at(key).in_flight.empty();
  });
  if (!drained) {
    return Status::deadline_exceeded(
        fmt::format("room {}: writes to the aborting rank still in "
                    "flight after {} ms",
                    id, config_.timeouts.transfer.count()));
  }
  return Status::ok();
}

}  // namespace pdkv::engine

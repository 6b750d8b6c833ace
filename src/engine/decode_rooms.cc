// The decode half of EngineCore: Receiver calls, metadata to the sources the
// map names, their reports, and aborts.
#include <fmt/format.h>

#include "engine/core.h"
#include "grpc_status.h"
#include "log.h"

namespace pdkv::engine {
Status EngineCore::open_decode_room(RoomId id, const std::string& prefill_engine, uint32_t dp) {
  if (config_.role != Role::kDecode) {
    return Status::failed_precondition("receiver() needs a decode engine; this one is prefill");
  }
  std::lock_guard lock(mu_);
  PDKV_RETURN_IF_ERROR(check_room_unused(id));
  auto& slot = decode_rooms_[id];
  if (slot) return Status::already_exists(fmt::format("room {} already has a receiver", id));
  slot = std::make_unique<DecodeRoom>();
  slot->id = id;
  slot->prefill_engine = prefill_engine;
  slot->prefill_dp = dp;
  return Status::ok();
}

Status EngineCore::decode_init(RoomId id) {
  std::lock_guard lock(mu_);
  auto it = decode_rooms_.find(id);
  if (it == decode_rooms_.end()) return Status::not_found(fmt::format("room {} is not open", id));
  DecodeRoom& room = *it->second;
  if (room.init_called)
    return Status::failed_precondition(fmt::format("room {}: init() twice", id));
  room.init_called = true;
  peer_engine({room.prefill_engine, room.prefill_dp});
  wake();
  return Status::ok();
}

Status EngineCore::decode_send_metadata(RoomId id, std::span<const uint64_t> pages,
                                        uint32_t aux_slot, std::vector<uint32_t> state_slots) {
  std::lock_guard lock(mu_);
  auto it = decode_rooms_.find(id);
  if (it == decode_rooms_.end()) return Status::not_found(fmt::format("room {} is not open", id));
  DecodeRoom& room = *it->second;
  if (!room.init_called) {
    return Status::failed_precondition(fmt::format("room {}: send_metadata() before init()", id));
  }
  if (room.metadata) {
    return Status::failed_precondition(fmt::format("room {}: send_metadata() twice", id));
  }
  if (room.state.state() == PollState::kFailed) return room.state.failure();
  if (pages.empty()) return Status::invalid_argument(fmt::format("room {}: no pages", id));
  std::vector<bool> seen(config_.kv.num_pages);
  for (size_t i = 0; i < pages.size(); ++i) {
    if (pages[i] >= config_.kv.num_pages) {
      return Status::out_of_range(
          fmt::format("room {}: page list entry {} is page {}, but this "
                      "pool has {} pages",
                      id, i, pages[i], config_.kv.num_pages));
    }
    if (seen[pages[i]]) {
      return Status::invalid_argument(fmt::format("room {}: page {} listed twice", id, pages[i]));
    }
    seen[pages[i]] = true;
  }
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
  proto::TransferInfo info;
  info.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  info.set_room(id);
  *info.mutable_decode() = self_ref();
  info.mutable_dst_pages()->Add(pages.begin(), pages.end());
  info.set_aux_slot(aux_slot);
  info.mutable_state_slots()->Add(state_slots.begin(), state_slots.end());
  room.metadata = std::move(info);
  room.deadline = Clock::now() + config_.timeouts.waiting_for_data;
  wake();
  return Status::ok();
}

void EngineCore::bind_decode_room(DecodeRoom& room, const PeerEngine& peer) {
  const RankKey me{config_.tp_rank, config_.pp_rank};
  for (const Link& link : peer.links) {
    if (!(link.dst == me)) continue;
    Source& source = room.sources[link.src];
    source.link = link;
    source.rank = peer.topology.at(link.src);
    link_to(source.rank);  // watch the source from now on
  }
}

void EngineCore::progress_decode(DecodeRoom& room) {
  if (room.state.terminal() || !room.init_called) return;
  const Clock::time_point now = Clock::now();
  auto peer = peers_.find({room.prefill_engine, room.prefill_dp});
  if (peer == peers_.end()) {
    peer_engine({room.prefill_engine, room.prefill_dp});  // dropped after a peer loss: again
    return;
  }
  if (peer->second.lookup == PeerEngine::Lookup::kFailed) {
    fail_decode(room, peer->second.error);
    return;
  }
  if (peer->second.lookup == PeerEngine::Lookup::kReady) {
    if (room.sources.empty()) bind_decode_room(room, peer->second);
    room.state.advance(PollState::kWaitingForInput);
  }
  if (room.metadata && !room.sources.empty()) {
    bool all_sent = true, all_reported = true;
    for (auto& [key, source] : room.sources) {
      if (!source.info_sent && !source.info_pending) {
        const Result<bool> ready = reserve_staging(room, source);
        if (!ready.is_ok()) {
          fail_decode(room, ready.status());
          return;
        }
        if (!*ready) {
          staging_starved_ = true;
          all_sent = all_reported = false;
          continue;
        }
        source.info_pending = true;
        proto::TransferInfo info = *room.metadata;
        if (source.staging_offset) {
          info.set_staging_offset(*source.staging_offset);
          info.set_staging_bytes(source.staging_bytes);
        }
        deferred_.push_back(info_action(room.id, source.rank, info));
      }
      all_sent &= source.info_sent;
      all_reported &= source.reported;
    }
    if (all_sent) room.state.advance(PollState::kTransferring);
    if (all_reported) {
      room.state.advance(PollState::kSuccess);
      return;
    }
  }
  if (now >= room.deadline) {
    std::string missing;
    for (const auto& [key, s] : room.sources) {
      if (s.reported) continue;
      missing += (missing.empty() ? "" : ", ") + describe(s.rank);
    }
    fail_decode(
        room, Status::deadline_exceeded(
                  room.metadata
                      ? fmt::format("room {}: [{}] did not report within {} ms", room.id, missing,
                                    config_.timeouts.waiting_for_data.count())
                      : fmt::format("room {}: prefill engine '{}' not found within {} ms", room.id,
                                    room.prefill_engine, config_.timeouts.bootstrap.count())));
  }
}

Action EngineCore::info_action(RoomId id, const proto::RankInfo& source,
                               const proto::TransferInfo& info) {
  return [this, id, source, info] {
    // The pages and slots named in `info` may have been read (verified,
    // scattered) by this process: that comes before the peer writes them.
    transport_->release_to_peers();
    auto link = link_to(source);
    proto::ControlReply reply;
    const grpc::Status s = link->call(kControlCallTimeout, [&](grpc::ClientContext& ctx) {
      return link->stub().SendTransferInfo(&ctx, info, &reply);
    });
    std::lock_guard lock(mu_);
    auto it = decode_rooms_.find(id);
    if (it == decode_rooms_.end()) return;
    auto src = it->second->sources.find({source.tp_rank(), source.pp_rank()});
    if (src == it->second->sources.end()) return;
    src->second.info_pending = false;
    if (s.ok()) {
      src->second.info_sent = true;
    } else {
      fail_decode(*it->second, from_grpc(s, fmt::format("room {}: {} refused the metadata", id,
                                                        describe(source))));
    }
    wake();
  };
}

void EngineCore::fail_decode(DecodeRoom& room, const Status& reason) {
  if (!room.state.fail(reason)) return;
  logger("engine")->warn("room {} failed: {}", room.id, reason.message());
  // Every source is told: those with our page list must stop writing into
  // pages we will reuse, the others must not wait for metadata.
  for (auto& [key, source] : room.sources) {
    deferred_.push_back([this, id = room.id, rank = source.rank, why = reason.message()] {
      (void)send_abort(id, rank, why);
    });
  }
}

Status EngineCore::decode_abort(RoomId id, const std::string& reason) {
  std::vector<proto::RankInfo> sources;
  {
    std::unique_lock lock(mu_);
    auto it = decode_rooms_.find(id);
    if (it == decode_rooms_.end()) return Status::not_found(fmt::format("room {} is not open", id));
    DecodeRoom& room = *it->second;
    room.state.fail(
        Status::aborted(fmt::format("{} aborted room {}: {}", describe(self_), id, reason)));
    if (room.init_called && room.sources.empty()) {
      // Every source must hear of it, so the map is needed: wait for the lookup.
      const PeerEngine* peer = await_peer(lock, {room.prefill_engine, room.prefill_dp});
      it = decode_rooms_.find(id);
      if (it == decode_rooms_.end()) return Status::ok();  // closed meanwhile
      if (peer != nullptr && it->second->sources.empty()) bind_decode_room(*it->second, *peer);
    }
    for (auto& [key, source] : it->second->sources) sources.push_back(source.rank);
    wake();
  }
  std::string unanswered;
  for (const auto& source : sources) {
    const Status acked = send_abort(id, source, reason);
    if (!acked.is_ok()) unanswered += (unanswered.empty() ? "" : "; ") + acked.message();
  }
  if (!unanswered.empty()) {
    return Status::unavailable(fmt::format("room {}: abort not acknowledged: {}", id, unanswered));
  }
  return Status::ok();
}

Status EngineCore::send_abort(RoomId id, const proto::RankInfo& source, const std::string& reason) {
  auto link = link_to(source);
  // A lost peer writes nothing any more: its death is the acknowledgement.
  if (!link->alive().is_ok()) return Status::ok();
  proto::AbortRequest request;
  request.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  request.set_room(id);
  *request.mutable_decode() = self_ref();
  request.set_reason(reason);
  proto::ControlReply reply;
  const grpc::Status s = link->call(
      config_.timeouts.transfer + kControlCallTimeout,
      [&](grpc::ClientContext& ctx) { return link->stub().AbortRoom(&ctx, request, &reply); });
  if (!s.ok() && link->alive().is_ok()) {
    return from_grpc(s, fmt::format("{}", describe(source)));
  }
  return Status::ok();
}

Result<TransferPlan> EngineCore::staging_plan(const Source& source,
                                              const proto::TransferInfo& info) {
  std::vector<uint64_t> numbered(info.dst_pages_size());
  for (size_t i = 0; i < numbered.size(); ++i) numbered[i] = i;
  const std::vector<uint64_t> dst(info.dst_pages().begin(), info.dst_pages().end());
  return planner_.plan(shard_of(source.rank), shard_, *source.link.kv, numbered, dst);
}

Result<bool> EngineCore::reserve_staging(const DecodeRoom& room, Source& source) {
  // Device pools that a transport cannot write in place (here or at the
  // source) leave no choice: the route is staged, or waits until it can be.
  const bool must = source.link.kv && (staged_only() || source.rank.kv_staged_only());
  if (must) {
    if (config_.staging_bytes == 0 || source.rank.staging_bytes() == 0) {
      return Status::failed_precondition(fmt::format(
          "room {}: {} and {} must stage KV (device pools the transport cannot register), but "
          "{} has no staging pool",
          room.id, describe(source.rank), describe(self_),
          config_.staging_bytes == 0 ? describe(self_) : describe(source.rank)));
    }
  } else if (config_.staging == Staging::kOff || config_.staging == Staging::kNaive ||
             config_.staging_bytes == 0 || !source.link.kv || source.rank.staging_bytes() == 0 ||
             uint64_t(room.metadata->dst_pages_size()) > source.rank.kv_spec().num_pages()) {
    return true;
  }
  auto plan = staging_plan(source, *room.metadata);
  if (!plan.is_ok()) {  // a bad route surfaces at the source, unless it cannot go direct
    return must ? Result<bool>(plan.status()) : Result<bool>(true);
  }
  if (plan->bytes() == 0) return true;
  // Auto: staging pays when fragments are small (one write instead of many).
  constexpr uint64_t kSmallFragment = 4096;
  if (!must && config_.staging == Staging::kAuto &&
      plan->bytes() / std::max<uint64_t>(1, plan->fragment_count()) >= kSmallFragment) {
    return true;
  }
  if (must &&
      (plan->bytes() > config_.staging_bytes || plan->bytes() > source.rank.staging_bytes())) {
    return Status::failed_precondition(fmt::format(
        "room {}: {} must be staged ({} bytes), but the staging pools hold {} here and {} at "
        "the source",
        room.id, describe(source.rank), plan->bytes(), config_.staging_bytes,
        source.rank.staging_bytes()));
  }
  auto offset = staging_pool_.allocate(plan->bytes());
  if (!offset) return !must;  // no room: direct, or wait when it must be staged
  source.staging_offset = *offset;
  source.staging_bytes = plan->bytes();
  ++stats_.staged_routes;
  return true;
}

Status EngineCore::scatter_staged(const DecodeRoom& room, Source& source) {
  PDKV_ASSIGN_OR_RETURN(TransferPlan plan, staging_plan(source, *room.metadata));
  const Status st = pool_staging_->scatter(plan, *source.staging_offset);
  staging_pool_.release(*source.staging_offset);
  source.staging_offset.reset();
  return st.with_context(
      fmt::format("room {}: scattering the staged bytes of {}", room.id, describe(source.rank)));
}

Status EngineCore::on_room_status(const proto::RoomStatus& status) {
  const RoomId id = status.room();
  std::lock_guard lock(mu_);
  if (config_.role != Role::kDecode) {
    return Status::failed_precondition(fmt::format("{} is a prefill rank", describe(self_)));
  }
  if (closed_before(id)) {
    return Status::failed_precondition(fmt::format("room {} is closed on {}", id, describe(self_)));
  }
  auto it = decode_rooms_.find(id);
  if (it == decode_rooms_.end()) {
    return Status::not_found(fmt::format("room {} is not open on {}", id, describe(self_)));
  }
  DecodeRoom& room = *it->second;
  const auto& from = status.prefill();
  auto source = room.sources.find({from.tp_rank(), from.pp_rank()});
  if (source == room.sources.end() || from.engine_id() != room.prefill_engine ||
      from.incarnation() != source->second.rank.incarnation()) {
    return Status::invalid_argument(
        fmt::format("room {}: {} dp {} tp {} pp {} is not a source of {}", id, from.engine_id(),
                    from.dp_rank(), from.tp_rank(), from.pp_rank(), describe(self_)));
  }
  if (status.success()) {
    // The report says the source's bytes are here (staged or in place): make
    // them visible to this thread and, through mu_, to the caller's poll().
    transport_->acquire_remote_writes();
    if (source->second.staging_offset && room.metadata) {
      // The source's bytes are in our staging slot, visible: put them in place.
      const Status scattered = scatter_staged(room, source->second);
      if (!scattered.is_ok()) fail_decode(room, scattered);
    }
    source->second.reported = true;
  } else {
    const auto code = static_cast<StatusCode>(status.code());
    fail_decode(room, Status(code == StatusCode::kOk ? StatusCode::kInternal : code,
                             fmt::format("{} failed room {}: {}", describe(source->second.rank), id,
                                         status.reason())));
  }
  wake();
  return Status::ok();
}

}  // namespace pdkv::engine

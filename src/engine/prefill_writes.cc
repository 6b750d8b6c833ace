// The prefill side's writes: what a destination is sent (KV direct or one
// gathered block, aux and state), the batches in flight, the gather slots
// of the staging pool, and the reports that end a destination's part.
#include <fmt/format.h>

#include "engine/prefill_side.h"
#include "grpc_status.h"

namespace pdkv::engine {

bool PrefillSide::complete(const PrefillRoom& room, const Destination& dest) const {
  return dest.info && room.last && room.pages.size() == room.num_pages &&
         dest.pages_written == room.pages.size() && dest.extras_written && dest.batches == 0;
}

Status PrefillSide::post_writes(PrefillRoom& room, Destination& dest) {
  if (!dest.info || dest.waiting_for_gather || dest.gathering) return Status::ok();
  const uint64_t available = room.pages.size();
  const bool extras_due = room.last && available == room.num_pages && !dest.extras_written;
  const bool kv_due = dest.link.kv && dest.pages_written < available;
  if (!kv_due && !extras_due) return Status::ok();
  const std::optional<PeerId> wire = ctx_.peers.wire(dest.peer);
  if (!wire) return Status::ok();  // on_wire_ready (or on_wire_failed) follows
  // The list of an earlier batch, emptied (spare_vectors.h).
  SpareVectors<WriteOp>::Lease lease(spare_ops_);
  std::vector<WriteOp>& ops = *lease;
  if (dest.info->staging_bytes() > 0 && dest.link.kv) {
    PDKV_ASSIGN_OR_RETURN(const bool gathered, post_kv_staged(room, dest, ops));
    if (!gathered) return Status::ok();
  } else if (dest.link.kv && ctx_.staged_only()) {
    return Status::failed_precondition(fmt::format(
        "room {}: {} reserved no staging slot, but this rank's KV pools are device memory that "
        "backend '{}' cannot register",
        room.id, describe(dest.rank), ctx_.config.backend));
  } else if (kv_due) {
    PDKV_RETURN_IF_ERROR(post_kv_direct(room, dest, ops));
  }
  if (extras_due) {
    add_extras(room, dest, ops);
    dest.extras_written = true;
  }
  dest.pages_written = available;
  if (ops.empty()) return Status::ok();
  uint64_t batch_bytes = 0;
  for (const WriteOp& op : ops) batch_bytes += op.length;
  // The last batch, with no other in flight to that rank, tells it of the
  // success itself once its bytes are there (docs/protocol.md, "Success over
  // the data plane"). A notice too large for the transport is not sent.
  std::string notice;
  if (notices_ && extras_due && dest.batches == 0) {
    proto::RoomStatus success = status_of(room, dest, Status::ok());
    success.set_bytes(dest.bytes + batch_bytes);
    notice = success.SerializeAsString();
    if (notice.size() > Transport::kMaxNotificationBytes) notice.clear();
  }
  auto batch = notice.empty() ? ctx_.transport.write(*wire, ops)
                              : ctx_.transport.write_and_notify(*wire, ops, notice);
  if (!batch.is_ok()) {
    return batch.status().with_context(
        fmt::format("room {}: write to {}", room.id, describe(dest.rank)));
  }
  dest.bytes += batch_bytes;
  dest.carries_notice = !notice.empty();
  ++dest.batches;
  ++ctx_.counters.batches_in_flight;
  if (!room.first_post) room.first_post = Clock::now();
  const RoomId id = room.id;
  const RankKey key = dest.key;
  batches_.add(
      *batch,
      [this, id, key, connection = *wire](const BatchStatus& st) {
        on_batch_end(id, key, connection, st);
      },
      [this, id, key](const Status& error) { on_batch_failing(id, key, error); });
  return Status::ok();
}

Status PrefillSide::post_kv_direct(PrefillRoom& room, Destination& dest,
                                   std::vector<WriteOp>& ops) {
  const proto::TransferInfo& info = *dest.info;
  const std::span<const uint64_t> src(room.pages.data() + dest.pages_written,
                                      room.pages.size() - dest.pages_written);
  const std::span<const uint64_t> dst(info.dst_pages().data() + dest.pages_written, src.size());
  PDKV_ASSIGN_OR_RETURN(TransferPlan plan, ctx_.planner.plan(ctx_.shard, shard_of(dest.rank),
                                                             *dest.link.kv, src, dst));
  ops.reserve(ops.size() + plan.fragment_count());
  if (dest.pages_written == 0) ++ctx_.counters.direct_routes;
  const RegionKey remote_first = dest.rank.kv_region_first();
  // Naive: cut every fragment into one token's bytes of this segment.
  const KvSpec& kv = ctx_.config.kv;
  const bool per_head = !kv.mla && kv.layout == Layout::kHnd;
  const uint64_t piece = ctx_.config.staging == Staging::kNaive
                             ? kv.head_bytes() * (per_head ? 1 : dest.link.kv->heads.count)
                             : UINT64_MAX;
  plan.for_each([&](const Fragment& f) {
    for (uint64_t at = 0; at < f.length; at += piece) {
      ops.push_back({ctx_.keys.kv[f.src_buffer], f.src_offset + at, remote_first + f.dst_buffer,
                     f.dst_offset + at, std::min(piece, f.length - at)});
    }
  });
  return Status::ok();
}

Result<bool> PrefillSide::post_kv_staged(PrefillRoom& room, Destination& dest,
                                         std::vector<WriteOp>& ops) {
  // The whole request is gathered into one block once the last chunk is
  // here, and written into the slot the decode rank reserved.
  const proto::TransferInfo& info = *dest.info;
  if (!(room.last && room.pages.size() == room.num_pages)) {
    dest.pages_written = room.pages.size();
    return false;
  }
  if (!dest.gathered) {
    PDKV_RETURN_IF_ERROR(start_gather(room, dest));
    return false;
  }
  // start_gather checked that the block is the slot's size.
  ops.push_back({ctx_.keys.staging, *dest.gather_slot, dest.rank.staging_region(),
                 info.staging_offset(), info.staging_bytes()});
  ctx_.note_staged(room.handle.get());
  return true;
}

Status PrefillSide::start_gather(PrefillRoom& room, Destination& dest) {
  const proto::TransferInfo& info = *dest.info;
  const std::span<const uint64_t> dst(info.dst_pages().data(), info.dst_pages_size());
  PDKV_ASSIGN_OR_RETURN(TransferPlan plan, ctx_.planner.plan(ctx_.shard, shard_of(dest.rank),
                                                             *dest.link.kv, room.pages, dst));
  if (plan.bytes() != info.staging_bytes()) {
    return Status::invalid_argument(
        fmt::format("room {}: {} reserved a staging slot of {} bytes, but the plan moves {}",
                    room.id, describe(dest.rank), info.staging_bytes(), plan.bytes()));
  }
  if (!dest.gather_slot) {
    dest.gather_slot = ctx_.staging.allocate(plan.bytes());
    if (!dest.gather_slot) {  // no room to gather now: again when a slot frees
      dest.waiting_for_gather = true;
      gather_waiters_.emplace_back(room.id, dest.key);
      return Status::ok();
    }
  }
  dest.gathering = true;
  ctx_.copy_then(
      EngineContext::Copy::kGather, std::move(plan), *dest.gather_slot,
      [this, id = room.id, key = dest.key](const Status& s) { on_gathered(id, key, s); });
  return Status::ok();
}

void PrefillSide::on_gathered(RoomId id, RankKey key, const Status& gathered) {
  PrefillRoom* room = find(id);
  if (room == nullptr) return;  // never: a room with a gather under way is kept
  Destination& dest = room->dests.at(key);
  dest.gathering = false;
  if (!gathered.is_ok() || room->failure) {
    release_gather(dest);
    if (room->failure) return drive_failure(*room);  // it may be erased now
    return fail(*room, gathered.with_context(fmt::format("room {}: gathering the block for {}", id,
                                                         describe(dest.rank))));
  }
  dest.gathered = true;
  step(*room);  // writes the block
}

void PrefillSide::add_extras(const PrefillRoom& room, const Destination& dest,
                             std::vector<WriteOp>& ops) {
  const proto::TransferInfo& info = *dest.info;
  if (dest.link.writes_aux) {
    const auto& items = ctx_.config.aux_item_bytes;
    for (size_t i = 0; i < items.size(); ++i) {
      const uint64_t n = items[i];
      ops.push_back({ctx_.keys.aux_first + static_cast<RegionKey>(i), room.aux_slot * n,
                     dest.rank.aux_region_first() + static_cast<RegionKey>(i), info.aux_slot() * n,
                     n});
    }
  }
  if (!dest.link.state_channels || room.state_slots.empty()) return;
  // [slot][local layer][local channel][channel_bytes] on both sides.
  const Segment& cs = *dest.link.state_channels;
  const Segment& ls = *dest.link.state_layers;
  const uint64_t cb = ctx_.config.state.channel_bytes;
  const uint64_t src_layers = ctx_.shard.layers.count, dst_layers = dest.rank.layer_count();
  const uint64_t dst_channels = AxisSharding::even(ctx_.config.state.channels, dest.rank.tp_size())
                                    .value()
                                    .owned(dest.rank.tp_rank())
                                    .value()
                                    .count;
  for (size_t i = 0; i < room.state_slots.size(); ++i) {
    for (uint32_t l = 0; l < ls.count; ++l) {
      const uint64_t src =
          ((room.state_slots[i] * src_layers + ls.src_offset + l) * ctx_.local_channels +
           cs.src_offset) *
          cb;
      const uint64_t dst =
          ((info.state_slots(int(i)) * dst_layers + ls.dst_offset + l) * dst_channels +
           cs.dst_offset) *
          cb;
      ops.push_back({ctx_.keys.state, src, dest.rank.state_region(), dst, cs.count * cb});
    }
  }
}

void PrefillSide::on_batch_failing(RoomId id, RankKey key, const Status& error) {
  PrefillRoom* room = find(id);
  if (room == nullptr) return;
  Destination& dest = room->dests.at(key);
  // A notice goes with the last batch, when no other is in flight: this is
  // it, and it will not land, so the failure need not wait for its drain
  // to be published.
  if (dest.batches == 1) dest.carries_notice = false;
  fail(*room, write_failure(id, dest, error));
}

Status PrefillSide::write_failure(RoomId id, const Destination& dest, const Status& error) const {
  return error.with_context(fmt::format("room {}: write to {}", id, describe(dest.rank)));
}

void PrefillSide::on_batch_end(RoomId id, RankKey key, PeerId connection,
                               const BatchStatus& status) {
  --ctx_.counters.batches_in_flight;
  PrefillRoom* room = find(id);
  if (room == nullptr) return;  // never: a room with batches in flight is kept
  Destination& dest = room->dests.at(key);
  --dest.batches;
  if (dest.batches == 0) dest.carries_notice = false;
  // The gathered block has left: its slot is free again.
  if (dest.batches == 0 && dest.extras_written) release_gather(dest);
  if (status.state == BatchState::kFailed) {
    // The bytes of this route never all arrived: the room fails, at both
    // ends, and the receiver fences what may trail.
    if (status.may_trail) dest.cut_connection = connection;
    return fail(*room, write_failure(id, dest, status.error));
  }
  step(*room);
}

void PrefillSide::release_gather(Destination& dest) {
  if (!dest.gather_slot || dest.gathering) return;  // the copy releases it when it ends
  dest.gathered = false;
  ctx_.staging.release(*dest.gather_slot);
  dest.gather_slot.reset();
  // In a task of its own: a waiter's step may erase a room (this one too)
  // that the caller goes on using.
  ctx_.loop.post([this] { wake_gather_waiters(); });
}

void PrefillSide::wake_gather_waiters() {
  auto waiting = std::move(gather_waiters_);
  gather_waiters_.clear();
  for (const auto& [id, key] : waiting) {
    PrefillRoom* room = find(id);
    if (room == nullptr) continue;
    auto dest = room->dests.find(key);
    if (dest == room->dests.end() || !dest->second.waiting_for_gather) continue;
    dest->second.waiting_for_gather = false;
    step(*room);  // gathers now, or waits again
  }
}

proto::RoomStatus PrefillSide::status_of(const PrefillRoom& room, const Destination& dest,
                                         const Status& outcome) const {
  proto::RoomStatus msg;
  msg.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  msg.set_room(room.id);
  *msg.mutable_prefill() = ctx_.self_ref();
  msg.set_success(outcome.is_ok());
  msg.set_reason(outcome.message());
  msg.set_code(static_cast<uint32_t>(outcome.code()));
  msg.set_bytes(dest.bytes);
  if (!outcome.is_ok() && dest.cut_connection) {
    msg.set_writes_cut(true);
    msg.set_cut_connection(*dest.cut_connection);
  }
  return msg;
}

void PrefillSide::report(PrefillRoom& room, Destination& dest, const Status& outcome) {
  using Report = Destination::Report;
  const bool success = outcome.is_ok();
  dest.report = success ? Report::kSending : Report::kFailureSending;
  ControlLink* link = success ? ctx_.peers.link(dest.peer) : ctx_.peers.link_to_tell(dest.peer);
  if (link == nullptr) {  // never bound to a peer: nobody to tell
    if (!success) {
      dest.report = Report::kFailureSent;
      return;
    }
    dest.report = Report::kNone;
    return fail(room, Status::internal(fmt::format("room {}: no control link to {}", room.id,
                                                   describe(dest.rank))));
  }
  proto::RoomStatus msg = status_of(room, dest, outcome);
  const RoomId id = room.id;
  const RankKey key = dest.key;
  if (!success) ++dest.notice_tries;
  link->report_status(
      std::move(msg), kControlCallTimeout, [this, id, key, success](const grpc::Status& s) {
        PrefillRoom* r = find(id);
        if (r == nullptr) return;
        Destination& d = r->dests.at(key);
        if (!success) return on_notice_reply(*r, d, s);
        if (d.report != Report::kSending) return;
        if (s.ok()) {
          d.report = Report::kAcked;
          return step(*r);
        }
        d.report = Report::kNone;  // told of the failure instead
        fail(*r,
             from_grpc(s, fmt::format("room {}: reporting success to {}", id, describe(d.rank))));
      });
}

void PrefillSide::on_notice_reply(PrefillRoom& room, Destination& dest, const grpc::Status& s) {
  dest.report = Destination::Report::kFailureSent;
  // Lost on the way (its link died: the peer may be cut off still, or again
  // as it came back): told again over a fresh link, a few times at most.
  if (!s.ok() && !is_definitive(s) && dest.notice_tries < kFailureNoticeTries && room.failure) {
    return report(room, dest, *room.failure);
  }
  maybe_erase(room);
}

void PrefillSide::on_drain_timeout(RoomId id) {
  PrefillRoom* room = find(id);
  if (room == nullptr) return;
  room->drain_timer = 0;
  // Batches that outlive their room's failure by the transfer timeout are
  // ended by failing the connection they travel on (other rooms' batches on
  // it fail too: a connection that holds writes this long is broken).
  for (auto& [key, dest] : room->dests) {
    if (dest.batches == 0) continue;
    ctx_.peers.fail_wire(
        dest.peer, Status::deadline_exceeded(fmt::format(
                       "room {}: writes to {} did not end within {} ms of the room's failure", id,
                       describe(dest.rank), ctx_.config.timeouts.transfer.count())));
  }
}

}  // namespace pdkv::engine

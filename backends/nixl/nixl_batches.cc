// The nixl backend's batches and peer failures: submit on the caller's
// thread, everything else on the progress thread (nixl_transport.h).
#include <fmt/format.h>

#include "log.h"
#include "nixl_transport.h"

namespace pdkv::backends::nixl {

Result<BatchId> NixlTransport::submit(PeerId peer_id, std::span<const WriteOp> ops,
                                      std::string_view notification, Direction direction) {
  PDKV_RETURN_IF_ERROR(check_notification(notification));
  BatchId id;
  {
    std::lock_guard lock(mu_);
    auto peer = peers_.find(peer_id);
    if (peer == peers_.end()) {
      if (auto failure = failures_.failure(peer_id)) return *failure;
      return Status::not_found(fmt::format("no nixl peer {}", peer_id));
    }
    std::vector<uint64_t> local_lengths;
    for (const auto& r : regions_) local_lengths.push_back(r.region.length);
    PDKV_RETURN_IF_ERROR(check_ops_bounds(direction == Direction::kWrite ? "write" : "read", ops,
                                          local_lengths, peer->second.region_lengths));
    id = next_batch_++;
    Batch batch;  // field by field: GCC's -O3 sees `{}` as maybe uninitialised
    batch.peer = peer_id;
    batch.notification = std::string(notification);
    batches_.emplace(id, std::move(batch));
    peer->second.batches.insert(id);
    ++in_flight_;
  }
  std::vector<WriteOp> copy = spare_ops_.take();
  copy.assign(ops.begin(), ops.end());
  thread_.post([this, id, direction, copy = std::move(copy)]() mutable {
    start_batch(id, copy, direction);
    spare_ops_.give_back(std::move(copy));
  });
  return id;
}

bool NixlTransport::progress() {
  // A bounded pass: under a steady stream of arrivals the queued tasks (a
  // fence, new batches) still get their turn between passes.
  unsigned events = 0;
  for (int i = 0; i < kProgressCallsPerPass && ucp_worker_progress(worker_) != 0; ++i) ++events;
  // What UCX's callbacks recorded, acted on now that UCX has returned.
  // Failed peers first: their batches then end with the peer's reason.
  auto errored = std::exchange(peers_errored_, {});
  for (auto [peer, status] : errored) {
    peer_failed(peer, ucx_error("UCX reported the peer failed", status));
  }
  auto flushes = std::exchange(flushes_done_, {});
  for (auto [id, status] : flushes) {
    auto pending = pending_.extract(id);
    if (!pending.empty()) flushed(*pending.mapped(), status);
  }
  auto notes = std::exchange(notes_done_, {});
  for (auto [id, status] : notes) {
    pending_.erase(id);  // UCX is done with the payload
    notified(id, status);
  }
  auto answers = std::exchange(answers_, {});
  for (const Answer& a : answers) answered(a);
  auto sent = std::exchange(messages_sent_, {});
  for (Pending* p : sent) message_sent(p);
  if (!closing_.empty()) finish_closes(/*all=*/false);
  notes_arrived_.announce();
  return events > 0 || !errored.empty() || !flushes.empty() || !notes.empty() || !answers.empty() ||
         !sent.empty();
}

bool NixlTransport::busy() const {
  if (!closing_.empty()) return true;  // progress-thread state, like this call
  std::lock_guard lock(mu_);
  return in_flight_ > 0;
}

void NixlTransport::start_batch(BatchId id, const std::vector<WriteOp>& ops, Direction direction) {
  PeerId peer;
  {
    std::lock_guard lock(mu_);
    auto it = batches_.find(id);
    if (it == batches_.end() || it->second.status.state != BatchState::kInProgress) return;
    peer = it->second.peer;
  }
  auto w = wires_.find(peer);
  if (w == wires_.end()) return;  // the peer failed meanwhile; its close ends the batch
  if (direction == Direction::kWrite && w->second.messages) {
    return send_messages(id, peer, ops);
  }
  Wire& wire = w->second;
  auto pending = std::make_unique<Pending>(this, id);
  // Each op's completion only counts (puts_done_, a drain's sign of
  // progress); the flush below is what ends the batch. Every op names its
  // local memory handle, so UCX need not look the buffer up in its
  // registration cache, and asks for bandwidth over latency: a batch posts
  // many ops before anything waits on one (MULTI_SEND). UCX 1.13's default
  // protocols ignore both; its newer protocols (UCX_PROTO_ENABLE=y, the
  // default from 1.16) use them.
  ucp_request_param_t counted{};
  counted.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                         UCP_OP_ATTR_FIELD_MEMH | UCP_OP_ATTR_FLAG_MULTI_SEND;
  counted.cb.send = &NixlTransport::on_op_done;
  counted.user_data = this;
  for (const WriteOp& op : ops) {
    // regions_ grows only on this thread: read without mu_.
    const LocalRegion& local = regions_[op.local_region];
    counted.memh = local.memh;
    const RemoteRegion& remote = wire.regions[op.remote_region];
    void* buffer = static_cast<char*>(local.region.base) + op.local_offset;
    const uint64_t address = remote.base + op.remote_offset;
    ucs_status_ptr_t req =
        direction == Direction::kWrite
            ? ucp_put_nbx(wire.ep, buffer, op.length, address, remote.rkey, &counted)
            : ucp_get_nbx(wire.ep, buffer, op.length, address, remote.rkey, &counted);
    if (UCS_PTR_IS_ERR(req)) {
      // The ops already posted may still move: the flush below settles them
      // before the batch is reported failed.
      pending->error = ucx_error(direction == Direction::kWrite ? "ucp_put_nbx" : "ucp_get_nbx",
                                 UCS_PTR_STATUS(req));
      break;
    }
    if (req == nullptr) ++puts_done_;  // done at once: no callback comes (UCX frees it then)
  }
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &NixlTransport::on_flush;
  param.user_data = pending.get();
  ucs_status_ptr_t flush = ucp_ep_flush_nbx(wire.ep, &param);
  if (UCS_PTR_IS_PTR(flush)) {
    pending_[id] = std::move(pending);  // until on_flush
    return;
  }
  flushed(*pending, UCS_PTR_STATUS(flush));  // done (or failed) at once: no callback comes
}

void NixlTransport::flushed(Pending& flush, ucs_status_t status) {
  const BatchId id = flush.batch;
  if (!flush.error.is_ok()) return end_batch(id, {BatchState::kFailed, flush.error});
  if (status != UCS_OK) return end_batch(id, {BatchState::kFailed, ucx_error("flush", status)});
  PeerId peer;
  std::string note;
  {
    std::lock_guard lock(mu_);
    auto it = batches_.find(id);
    if (it == batches_.end() || it->second.status.state != BatchState::kInProgress) return;
    peer = it->second.peer;
    note = std::move(it->second.notification);
  }
  if (note.empty()) return end_batch(id, {BatchState::kDone, Status::ok()});
  auto w = wires_.find(peer);
  if (w == wires_.end()) return;  // the peer failed meanwhile; its close ends the batch
  // After the flush: the peer sees the notification only once the bytes are
  // there. The payload stays alive (pending_) until UCX says it is done.
  auto pending = std::make_unique<Pending>(this, id);
  pending->payload = std::move(note);
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.cb.send = &NixlTransport::on_notified;
  param.user_data = pending.get();
  param.flags = UCP_AM_SEND_FLAG_EAGER;
  ucs_status_ptr_t req = ucp_am_send_nbx(w->second.ep, kNotifyAmId, nullptr, 0,
                                         pending->payload.data(), pending->payload.size(), &param);
  if (UCS_PTR_IS_PTR(req)) {
    pending_[id] = std::move(pending);
    return;
  }
  notified(id, UCS_PTR_STATUS(req));
}

void NixlTransport::notified(BatchId id, ucs_status_t status) {
  if (status != UCS_OK)
    return end_batch(id, {BatchState::kFailed, ucx_error("notification", status)});
  end_batch(id, {BatchState::kDone, Status::ok()});
}

void NixlTransport::end_batch(BatchId id, BatchStatus status) {
  {
    std::lock_guard lock(mu_);
    auto it = batches_.find(id);
    if (it == batches_.end() || it->second.status.state != BatchState::kInProgress) return;
    Batch& batch = it->second;
    // A batch of a failed peer fails, for the peer's reason rather than UCX's
    // echo of it, even when its flush completed while the endpoint drained:
    // fail_peer ends the batches in flight as failed (transport.h).
    if (auto failure = failures_.failure(batch.peer)) status = {BatchState::kFailed, *failure};
    batch.status = std::move(status);
    if (auto peer = peers_.find(batch.peer); peer != peers_.end()) peer->second.batches.erase(id);
    --in_flight_;
    batch_ends_.mark();
  }
  batch_ends_.announce();  // mu_ released: the caller may poll() from its callback
}

void NixlTransport::peer_failed(PeerId id, const Status& reason) {
  auto w = wires_.find(id);
  if (w == wires_.end()) return;              // unknown, or failed already
  if (!failures_.report(id, reason)) return;  // reported once, by the helper's thread
  Closing closing;
  closing.peer = id;
  closing.wire = std::move(w->second);
  closing.reason = reason;
  wires_.erase(w);
  {
    std::lock_guard lock(mu_);
    auto peer = peers_.find(id);
    if (peer != peers_.end()) {
      closing.batches = std::move(peer->second.batches);
      peers_.erase(peer);  // later writes are refused with the reason (failures_)
    }
  }
  closing_.push_back(std::move(closing));
  start_drain(closing_.back());
  finish_closes(/*all=*/false);  // a stage that completed at once moves on now
}

void NixlTransport::start_drain(Closing& closing) {
  closing.stage = Closing::Stage::kDraining;
  closing.limit = DrainDeadline(std::chrono::steady_clock::now(), kDrainLimit, kDrainCap);
  closing.puts_seen = puts_done_;
  ucp_request_param_t param{};
  ucs_status_ptr_t req = ucp_ep_flush_nbx(closing.wire.ep, &param);
  closing.request = UCS_PTR_IS_PTR(req) ? req : nullptr;
  closing.flush_failed = UCS_PTR_IS_ERR(req);
}

void NixlTransport::start_close(Closing& closing) {
  closing.stage = Closing::Stage::kClosing;
  closing.limit = DrainDeadline(std::chrono::steady_clock::now(), kCloseLimit, kCloseLimit);
  closing.request = nullptr;
  if (closing.wire.ep == nullptr) return;
  // UCX cancels what is outstanding only for endpoints in PEER error
  // handling (forced close); otherwise the close flushes, and completes when
  // every operation has landed or the endpoint failed.
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = peer_error_handling_ ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t req = ucp_ep_close_nbx(closing.wire.ep, &param);
  closing.wire.ep = nullptr;
  if (UCS_PTR_IS_PTR(req)) {
    closing.request = req;
  } else if (UCS_PTR_IS_ERR(req)) {
    logger("nixl")->debug("closing the endpoint of peer {}: {}", closing.peer,
                          ucs_status_string(UCS_PTR_STATUS(req)));
  }
}

void NixlTransport::finish_closes(bool all) {
  const auto now = std::chrono::steady_clock::now();
  for (auto it = closing_.begin(); it != closing_.end();) {
    Closing& c = *it;
    const bool done = !stage_in_progress(c);
    if (!done && !all && !c.limit.passed(now)) {
      ++it;
      continue;
    }
    // The stage completed, or ran out of time: UCX frees its request when
    // it is done with it.
    if (c.request != nullptr) ucp_request_free(c.request);
    c.request = nullptr;
    c.late = c.late || !done;
    if (c.stage == Closing::Stage::kDraining && !all) {
      start_close(c);
      continue;  // looked at again at once: the close may have completed already
    }
    Status reason = c.reason;
    if (!c.late || all) {
      destroy_wire(c.wire);
    } else {
      // UCX may still hold operations that name these rkeys: they live
      // until the worker does.
      for (auto& r : c.wire.regions) abandoned_rkeys_.push_back(std::exchange(r.rkey, nullptr));
      abandoned_args_.push_back(std::move(c.wire.error_arg));
      reason = reason.with_context(fmt::format(
          "UCX did not drain and close the endpoint in time ({} ms without progress, or {} "
          "ms in all, then {} ms to close)",
          kDrainLimit.count(), kDrainCap.count(), kCloseLimit.count()));
      logger("nixl")->warn("peer {}: {}", c.peer, reason.message());
    }
    for (BatchId b : c.batches) {
      end_batch(b, {BatchState::kFailed, reason});
      release_finished(b);  // message path: once UCX has no send of it left
    }
    it = closing_.erase(it);
  }
}

bool NixlTransport::stage_in_progress(Closing& c) {
  if (c.stage == Closing::Stage::kDraining && !c.wire.messages && puts_done_ != c.puts_seen) {
    // The put path shows progress only worker-wide: any op completed since
    // (a frozen peer's puts complete too where the sender copies, as
    // shared memory does; over a network it stops acknowledging them).
    c.puts_seen = puts_done_;
    keep_draining(c);
  }
  if (c.request != nullptr) {
    const ucs_status_t status = ucp_request_check_status(c.request);
    if (status == UCS_INPROGRESS) return true;
    c.flush_failed = c.flush_failed || (c.stage == Closing::Stage::kDraining && status != UCS_OK);
  }
  if (c.stage != Closing::Stage::kDraining || !c.wire.messages || c.flush_failed) return false;
  // Sent is not landed here: the target's answer to a batch's end is. (A
  // dead target's endpoint fails its flush; a frozen one's runs out of time.)
  std::lock_guard lock(mu_);
  for (BatchId b : c.batches) {
    const auto sending = pending_.find(b);  // reads over the same wire are gets: flushed
    if (sending == pending_.end() || !sending->second->messages) continue;
    const auto batch = batches_.find(b);
    if (batch != batches_.end() && batch->second.status.state == BatchState::kInProgress) {
      return true;
    }
  }
  return false;
}

void NixlTransport::keep_draining(Closing& c) {
  c.limit.progressed(std::chrono::steady_clock::now());
}

void NixlTransport::drain_progressed(BatchId id) {
  for (Closing& c : closing_) {
    if (c.stage == Closing::Stage::kDraining && c.batches.count(id) != 0) keep_draining(c);
  }
}

void NixlTransport::destroy_wire(Wire& wire) {
  for (auto& r : wire.regions) {
    if (r.rkey) ucp_rkey_destroy(r.rkey);
    r.rkey = nullptr;
  }
  wire.regions.clear();
}

void NixlTransport::on_op_done(void* request, ucs_status_t, void* user_data) {
  ++static_cast<NixlTransport*>(user_data)->puts_done_;
  ucp_request_free(request);
}

void NixlTransport::on_flush(void* request, ucs_status_t status, void* user_data) {
  auto* pending = static_cast<Pending*>(user_data);
  pending->self->flushes_done_.emplace_back(pending->batch, status);
  ucp_request_free(request);
}

void NixlTransport::on_notified(void* request, ucs_status_t status, void* user_data) {
  auto* pending = static_cast<Pending*>(user_data);
  pending->self->notes_done_.emplace_back(pending->batch, status);
  ucp_request_free(request);
}

void NixlTransport::on_peer_error(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* a = static_cast<ErrorArg*>(arg);
  a->self->peers_errored_.emplace_back(a->peer, status);
}

ucs_status_t NixlTransport::on_notification(void* arg, const void*, size_t, void* data,
                                            size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<NixlTransport*>(arg);
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) return UCS_OK;  // never sent: eager only
  std::lock_guard lock(self->mu_);
  self->notifications_.emplace_back(static_cast<const char*>(data), length);
  self->notes_arrived_.mark();
  return UCS_OK;
}

}  // namespace pdkv::backends::nixl

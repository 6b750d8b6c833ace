// The nixl backend's message path (nixl_transport.h): a batch's bytes as
// eager active messages that the target copies in itself, and the target's
// fence over them. Progress thread only, like the rest of the UCX side.
#include <fmt/format.h>

#include <cstring>
#include <optional>

#include "log.h"
#include "nixl_transport.h"

namespace pdkv::backends::nixl {
namespace {

ucp_request_param_t eager_send(ucp_send_nbx_callback_t callback, void* user_data, bool reply) {
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.cb.send = callback;
  param.user_data = user_data;
  // Eager only: a rendezvous would hand the target a descriptor to fetch
  // from later, outside the handler that checks the fence.
  param.flags = UCP_AM_SEND_FLAG_EAGER | (reply ? UCP_AM_SEND_FLAG_REPLY : 0);
  return param;
}

// A message's header as a T, when it is one: eager, and of T's size (else
// the message is not ours to take, and the end of its batch finds bytes
// missing).
template <class T>
std::optional<T> header_as(const void* header, size_t length, const ucp_am_recv_param_t* param) {
  if (length != sizeof(T) || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) return std::nullopt;
  T h;
  std::memcpy(&h, header, sizeof h);
  return h;
}

}  // namespace

Status NixlTransport::outcome_error(uint64_t outcome) {
  switch (outcome) {
    case kFenced:
      return Status::unavailable(
          "the nixl target fenced this connection: it had lost this rank, and drops what "
          "comes over it");
    case kShort:
      return Status::internal("the nixl target received fewer bytes than were sent");
    case kRefused:
      return Status::invalid_argument("the nixl target refused bytes outside its regions");
    default:
      return Status::internal(fmt::format("unknown answer {} from the nixl target", outcome));
  }
}

void NixlTransport::send_messages(BatchId id, PeerId peer, const std::vector<WriteOp>& ops) {
  Wire& wire = wires_.at(peer);
  auto pending = std::make_unique<Pending>(this, id);
  pending->messages = true;
  size_t chunks = 0;
  for (const WriteOp& op : ops) chunks += (op.length + kMessageChunk - 1) / kMessageChunk;
  pending->data.reserve(chunks);  // UCX keeps pointers to the headers: never reallocated
  const Connection from{instance_, peer, wire.generation};
  uint64_t bytes = 0;
  ucs_status_t failed = UCS_OK;
  for (const WriteOp& op : ops) {
    const char* source = static_cast<const char*>(regions_[op.local_region].region.base);
    const uint64_t target = wire.regions[op.remote_region].base + op.remote_offset;
    for (uint64_t done = 0; done < op.length && failed == UCS_OK; done += kMessageChunk) {
      const uint64_t length = std::min(kMessageChunk, op.length - done);
      pending->data.push_back({from, id, target + done});
      ucp_request_param_t param = eager_send(&NixlTransport::on_message_sent, pending.get(), false);
      ucs_status_ptr_t req =
          ucp_am_send_nbx(wire.ep, kDataAmId, &pending->data.back(), sizeof(DataHeader),
                          source + op.local_offset + done, length, &param);
      if (UCS_PTR_IS_ERR(req)) failed = UCS_PTR_STATUS(req);
      if (UCS_PTR_IS_PTR(req)) ++pending->sends;
      bytes += length;
    }
  }
  {
    std::lock_guard lock(mu_);
    auto it = batches_.find(id);
    if (it != batches_.end()) pending->payload = std::move(it->second.notification);
  }
  if (failed == UCS_OK) {
    pending->end = {from, id, bytes, pending->payload.empty() ? 0u : 1u};
    ucp_request_param_t param = eager_send(&NixlTransport::on_message_sent, pending.get(), true);
    ucs_status_ptr_t req =
        ucp_am_send_nbx(wire.ep, kEndAmId, &pending->end, sizeof(EndHeader),
                        pending->payload.data(), pending->payload.size(), &param);
    if (UCS_PTR_IS_ERR(req)) failed = UCS_PTR_STATUS(req);
    if (UCS_PTR_IS_PTR(req)) ++pending->sends;
  }
  pending_[id] = std::move(pending);  // until every send is done and the batch has ended
  if (failed != UCS_OK) {
    // Messages already handed to UCX may still arrive: the peer's close
    // settles them before the batch is reported failed.
    peer_failed(peer, ucx_error("ucp_am_send_nbx", failed));
  }
}

void NixlTransport::answered(const Answer& answer) {
  drain_progressed(answer.batch);
  PeerId peer = 0;
  {
    std::lock_guard lock(mu_);
    auto it = batches_.find(answer.batch);
    if (it == batches_.end() || it->second.status.state != BatchState::kInProgress) return;
    peer = it->second.peer;
  }
  if (answer.outcome == kLanded) {
    end_batch(answer.batch, {BatchState::kDone, Status::ok()});
  } else {
    // The end came after every message of the batch, on the one ordered
    // lane, and the target is done with them: nothing trails.
    const Status reason = outcome_error(answer.outcome);
    end_batch(answer.batch, {BatchState::kFailed, reason, /*may_trail=*/false});
    if (answer.outcome == kFenced) {
      // The next connection to this target is made in its new generation.
      if (auto w = wires_.find(peer); w != wires_.end()) {
        uint64_t& known = generations_[w->second.target];
        known = std::max(known, answer.generation);
      }
    }
    // A fenced or lossy connection is over: later writes go over a new one.
    if (answer.outcome != kRefused) peer_failed(peer, reason);
  }
  release_finished(answer.batch);
}

void NixlTransport::message_sent(Pending* pending) {
  drain_progressed(pending->batch);
  --pending->sends;
  release_finished(pending->batch);
}

void NixlTransport::release_finished(BatchId id) {
  auto it = pending_.find(id);
  if (it == pending_.end() || !it->second->messages || it->second->sends > 0) return;
  {
    std::lock_guard lock(mu_);
    auto batch = batches_.find(id);
    if (batch != batches_.end() && batch->second.status.state == BatchState::kInProgress) return;
  }
  pending_.erase(it);
}

void NixlTransport::fence_source(uint64_t instance, std::optional<uint64_t> cut) {
  Source& source = sources_[instance];
  if (cut) {
    source.cut = std::max(source.cut, *cut);
  } else {
    ++source.generation;  // every connection made so far, heard from or not
  }
  // What was arriving on a fenced connection will not complete.
  for (auto it = arriving_.lower_bound({instance, 0});
       it != arriving_.end() && it->first.first == instance;) {
    it = cut && it->first.second > *cut ? std::next(it) : arriving_.erase(it);
  }
}

bool NixlTransport::lands_in_region(uint64_t address, uint64_t length) const {
  for (const LocalRegion& r : regions_) {  // grows on this thread only: no lock
    const auto base = reinterpret_cast<uint64_t>(r.region.base);
    if (address >= base && length <= r.region.length && address - base <= r.region.length - length)
      return true;
  }
  return false;
}

void NixlTransport::answer(ucp_ep_h reply_ep, uint64_t batch, Outcome outcome,
                           uint64_t generation) {
  // Unanswered, the source's batch waits for its caller's timeout (the
  // engine's transfer timeout fails the peer), as a flush that never
  // completes would.
  if (reply_ep == nullptr) {
    logger("nixl")->error("an end of batch {} came without a reply endpoint", batch);
    return;
  }
  auto* message = new Answer{batch, outcome, generation};  // UCX reads it until sent
  ucp_request_param_t param = eager_send(&NixlTransport::on_answer_sent, message, false);
  ucs_status_ptr_t req =
      ucp_am_send_nbx(reply_ep, kAnswerAmId, message, sizeof(Answer), nullptr, 0, &param);
  if (UCS_PTR_IS_ERR(req)) {
    logger("nixl")->warn("answering the end of batch {}: {}", batch,
                         ucs_status_string(UCS_PTR_STATUS(req)));
  }
  if (!UCS_PTR_IS_PTR(req)) delete message;  // done at once, or refused: no callback comes
}

void NixlTransport::on_message_sent(void* request, ucs_status_t, void* user_data) {
  auto* pending = static_cast<Pending*>(user_data);
  pending->self->messages_sent_.push_back(pending);
  ucp_request_free(request);
}

void NixlTransport::on_answer_sent(void* request, ucs_status_t, void* user_data) {
  delete static_cast<Answer*>(user_data);
  ucp_request_free(request);
}

// Target side. Handlers run inside ucp_worker_progress on the progress
// thread; they touch only the message path's own state and memory.
ucs_status_t NixlTransport::on_data(void* arg, const void* header, size_t header_length, void* data,
                                    size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<NixlTransport*>(arg);
  const std::optional<DataHeader> parsed = header_as<DataHeader>(header, header_length, param);
  if (!parsed) return UCS_OK;
  const DataHeader& h = *parsed;
  if (self->sources_[h.from.instance].fenced(h.from)) return UCS_OK;
  Arriving& arriving = self->arriving_[{h.from.instance, h.from.number}];
  if (arriving.batch != h.batch) arriving = {h.batch, 0, false};
  if (!self->lands_in_region(h.address, length)) {
    arriving.refused = true;
    return UCS_OK;
  }
  std::memcpy(reinterpret_cast<void*>(h.address), data, length);
  arriving.bytes += length;
  return UCS_OK;
}

ucs_status_t NixlTransport::on_end(void* arg, const void* header, size_t header_length, void* data,
                                   size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<NixlTransport*>(arg);
  const std::optional<EndHeader> parsed = header_as<EndHeader>(header, header_length, param);
  if (!parsed) return UCS_OK;
  const EndHeader& h = *parsed;
  const ucp_ep_h reply_ep =
      (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : nullptr;
  const Source& source = self->sources_[h.from.instance];
  if (source.fenced(h.from)) {
    self->answer(reply_ep, h.batch, kFenced, source.generation);
    return UCS_OK;
  }
  Arriving arriving;
  if (auto it = self->arriving_.find({h.from.instance, h.from.number});
      it != self->arriving_.end()) {
    if (it->second.batch == h.batch) arriving = it->second;
    self->arriving_.erase(it);  // the connection's batch is over, whatever came of it
  }
  Outcome outcome = kLanded;
  if (arriving.refused) {
    outcome = kRefused;
  } else if (h.bytes != 0 && arriving.bytes != h.bytes) {
    outcome = kShort;
  }
  if (outcome == kLanded && h.notify != 0) {
    std::lock_guard lock(self->mu_);
    self->notifications_.emplace_back(static_cast<const char*>(data), length);
    self->notes_arrived_.mark();
  }
  self->answer(reply_ep, h.batch, outcome, source.generation);
  return UCS_OK;
}

ucs_status_t NixlTransport::on_answer(void* arg, const void* header, size_t header_length, void*,
                                      size_t, const ucp_am_recv_param_t* param) {
  if (auto a = header_as<Answer>(header, header_length, param)) {
    static_cast<NixlTransport*>(arg)->answers_.push_back(*a);
  }
  return UCS_OK;
}

}  // namespace pdkv::backends::nixl

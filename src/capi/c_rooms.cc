// The C ABI's per-room calls: Sender (prefill) and Receiver (decode).
#include "capi/c_handles.h"

using pdkv::Status;
using pdkv::capi::c_call;
using pdkv::capi::require;

namespace {

pdkv::Result<std::vector<uint32_t>> slots(const uint32_t* state_slots, size_t count) {
  if (count > 0 && state_slots == nullptr) {
    return Status::invalid_argument("state_slots is NULL with " + std::to_string(count) + " slots");
  }
  return std::vector<uint32_t>(state_slots, state_slots + count);
}

Status check_pages(const uint64_t* pages, size_t count) {
  if (count > 0 && pages == nullptr) {
    return Status::invalid_argument("pages is NULL with " + std::to_string(count) + " pages");
  }
  return Status::ok();
}

// The calls Sender and Receiver share, over either handle; `name` is the
// handle's parameter name, for the refusal of a NULL one.
template <typename Handle>
pdkv_status poll_room(const char* function, const Handle* handle, const char* name,
                      pdkv_poll_state* state) {
  return c_call(function, [&] {
    PDKV_RETURN_IF_ERROR(require(handle, name));
    PDKV_RETURN_IF_ERROR(require(state, "state"));
    *state = static_cast<pdkv_poll_state>(handle->room->poll());
    return Status::ok();
  });
}

template <typename Handle>
pdkv_status abort_room(const char* function, Handle* handle, const char* name, const char* reason) {
  return c_call(function, [&] {
    PDKV_RETURN_IF_ERROR(require(handle, name));
    handle->room->abort(reason != nullptr ? reason : "aborted by the caller");
    return Status::ok();
  });
}

// A failed room's reason as this thread's last error (unprefixed: it is the
// room's own reason), and its code.
template <typename Handle>
pdkv_status room_failure(const Handle* handle, const char* name) {
  return c_call(nullptr, [&] {
    PDKV_RETURN_IF_ERROR(require(handle, name));
    return handle->room->failure();
  });
}

template <typename Handle>
pdkv_status room_metrics(const char* function, const Handle* handle, const char* name,
                         pdkv_transfer_metrics* out) {
  return c_call(function, [&] {
    PDKV_RETURN_IF_ERROR(require(handle, name));
    PDKV_RETURN_IF_ERROR(require(out, "out"));
    const pdkv::TransferMetrics m = handle->room->metrics();
    *out = pdkv_transfer_metrics{m.bytes, static_cast<uint64_t>(m.latency.count()),
                                 m.staged ? 1 : 0, m.retries};
    return Status::ok();
  });
}

}  // namespace

extern "C" {

pdkv_status pdkv_engine_sender(pdkv_engine* engine, uint64_t room, const char* decode_engine,
                               uint32_t decode_dp_rank, pdkv_sender** out) {
  return c_call(__func__, [&] {
    PDKV_RETURN_IF_ERROR(require(engine, "engine"));
    PDKV_RETURN_IF_ERROR(require(out, "out"));
    std::unique_ptr<pdkv::Sender> sender;
    if (decode_engine != nullptr) {
      PDKV_ASSIGN_OR_RETURN(sender, engine->engine->sender(room, decode_engine, decode_dp_rank));
    } else {
      PDKV_ASSIGN_OR_RETURN(sender, engine->engine->sender(room));
    }
    *out = new pdkv_sender{std::move(sender)};
    return Status::ok();
  });
}

void pdkv_sender_destroy(pdkv_sender* sender) { delete sender; }

pdkv_status pdkv_sender_init(pdkv_sender* sender, uint64_t num_pages, uint32_t aux_slot,
                             const uint32_t* state_slots, size_t num_state_slots) {
  return c_call(__func__, [&] {
    PDKV_RETURN_IF_ERROR(require(sender, "sender"));
    PDKV_ASSIGN_OR_RETURN(auto state, slots(state_slots, num_state_slots));
    return sender->room->init(num_pages, aux_slot, std::move(state));
  });
}

pdkv_status pdkv_sender_send(pdkv_sender* sender, const uint64_t* pages, size_t num_pages,
                             int32_t is_last) {
  return c_call(__func__, [&] {
    PDKV_RETURN_IF_ERROR(require(sender, "sender"));
    PDKV_RETURN_IF_ERROR(check_pages(pages, num_pages));
    return sender->room->send({pages, num_pages}, is_last != 0);
  });
}

pdkv_status pdkv_sender_poll(const pdkv_sender* sender, pdkv_poll_state* state) {
  return poll_room(__func__, sender, "sender", state);
}

pdkv_status pdkv_sender_abort(pdkv_sender* sender, const char* reason) {
  return abort_room(__func__, sender, "sender", reason);
}

pdkv_status pdkv_sender_failure(const pdkv_sender* sender) {
  return room_failure(sender, "sender");
}

pdkv_status pdkv_sender_decode_prefix_pages(const pdkv_sender* sender, uint64_t* pages) {
  return c_call(__func__, [&] {
    PDKV_RETURN_IF_ERROR(require(sender, "sender"));
    PDKV_RETURN_IF_ERROR(require(pages, "pages"));
    *pages = sender->room->decode_prefix_pages();
    return Status::ok();
  });
}

pdkv_status pdkv_sender_metrics(const pdkv_sender* sender, pdkv_transfer_metrics* out) {
  return room_metrics(__func__, sender, "sender", out);
}

pdkv_status pdkv_engine_receiver(pdkv_engine* engine, uint64_t room, const char* prefill_engine,
                                 uint32_t prefill_dp_rank, pdkv_receiver** out) {
  return c_call(__func__, [&] {
    PDKV_RETURN_IF_ERROR(require(engine, "engine"));
    PDKV_RETURN_IF_ERROR(require(prefill_engine, "prefill_engine"));
    PDKV_RETURN_IF_ERROR(require(out, "out"));
    PDKV_ASSIGN_OR_RETURN(auto receiver,
                          engine->engine->receiver(room, prefill_engine, prefill_dp_rank));
    *out = new pdkv_receiver{std::move(receiver)};
    return Status::ok();
  });
}

void pdkv_receiver_destroy(pdkv_receiver* receiver) { delete receiver; }

pdkv_status pdkv_receiver_init(pdkv_receiver* receiver) {
  return c_call(__func__, [&] {
    PDKV_RETURN_IF_ERROR(require(receiver, "receiver"));
    return receiver->room->init();
  });
}

pdkv_status pdkv_receiver_send_metadata(pdkv_receiver* receiver, const uint64_t* pages,
                                        size_t num_pages, uint32_t aux_slot,
                                        const uint32_t* state_slots, size_t num_state_slots,
                                        uint64_t prefix_pages) {
  return c_call(__func__, [&] {
    PDKV_RETURN_IF_ERROR(require(receiver, "receiver"));
    PDKV_RETURN_IF_ERROR(check_pages(pages, num_pages));
    PDKV_ASSIGN_OR_RETURN(auto state, slots(state_slots, num_state_slots));
    return receiver->room->send_metadata({pages, num_pages}, aux_slot, std::move(state),
                                         prefix_pages);
  });
}

pdkv_status pdkv_receiver_poll(const pdkv_receiver* receiver, pdkv_poll_state* state) {
  return poll_room(__func__, receiver, "receiver", state);
}

pdkv_status pdkv_receiver_abort(pdkv_receiver* receiver, const char* reason) {
  return abort_room(__func__, receiver, "receiver", reason);
}

pdkv_status pdkv_receiver_failure(const pdkv_receiver* receiver) {
  return room_failure(receiver, "receiver");
}

pdkv_status pdkv_receiver_metrics(const pdkv_receiver* receiver, pdkv_transfer_metrics* out) {
  return room_metrics(__func__, receiver, "receiver", out);
}

}  // extern "C"

// EngineCore: the API entry points, the control requests handed to the
// loop, statistics and shutdown. Start-up is in engine_start.cc.
#include "engine/core.h"

#include <future>

#include <fmt/format.h>

#include "log.h"

namespace pdkv::engine {
namespace {

// Shutdown: how long failure notices and aborts get to reach the peers, and
// the server's calls in progress to deliver their replies.
constexpr auto kFarewell = std::chrono::milliseconds(1000);

}  // namespace

EngineCore::~EngineCore() { shutdown(); }

void EngineCore::shutdown() {
  if (stopped_.exchange(true)) return;
  if (ctx_) {
    // 0. A source whose success a decode room took from its notice still
    // confirms it by a call, which its Sender waits for: such calls get
    // kFarewell to arrive (a decode worker stops as soon as its rooms
    // succeeded), or those Senders would fail transfers that fully arrived.
    auto confirmed = std::make_shared<std::promise<void>>();
    loop_.post(
        [this, confirmed] { decode_->when_confirmed([confirmed] { confirmed->set_value(); }); });
    (void)confirmed->get_future().wait_for(kFarewell);
    // 1. Every room fails; peers are told (failure reports, aborts).
    const Status reason = Status::aborted(fmt::format("engine {} shut down", describe(self_)));
    // Waited for, and then the tasks it posted (a link sends its reports
    // from one), so that the calls it made are in flight before the wait.
    std::promise<void> told;
    loop_.post([this, reason, &told] {
      registration_->stop();
      prefill_->shutdown(reason);
      decode_->shutdown(reason);
      loop_.post([&told] { told.set_value(); });
    });
    told.get_future().wait();
    // Copies under way end (their rooms failed above); those not started are
    // dropped. A decode room that still scatters is published failed only
    // once its copy is over: give_up below publishes regardless.
    copier_.stop();
    (void)calls_.wait_idle(kFarewell, CallTracker::Kind::kUnary);
    // 2. Rooms whose sources did not answer fail now; links and lookups end.
    // Waited for: until it has run, a timer on the loop (a lookup's retry)
    // may still start a call, which step 4 must see to wait for it.
    std::promise<void> ended;
    loop_.post([this, &ended] {
      prefill_->give_up();
      decode_->give_up();
      lookups_->stop();
      peers_->stop_all();
      ended.set_value();
    });
    ended.get_future().wait();
  }
  // 3. Peers see this rank leave (their Watch streams end); replies already
  // decided are still delivered, through the loop, which runs until the
  // server's last call has ended.
  if (server_) {
    service_.close_watches();
    server_->Shutdown(std::chrono::system_clock::now() + kFarewell);
    server_->Wait();
  }
  // 4. Our own calls and streams: cancelled, and gRPC done with every one.
  calls_.cancel_all();
  if (!calls_.wait_idle(std::chrono::seconds(10))) {
    logger("engine")->error("{}: {} control calls still in flight at shutdown", describe(self_),
                            calls_.in_flight());
  }
  service_.close();
  transport_inbox_->close();
  loop_.stop();
  connector_.stop();
  server_.reset();
}

EngineStats EngineCore::stats() const {
  EngineStats s;
  s.staged_routes = counters_.staged_routes;
  s.direct_routes = counters_.direct_routes;
  s.batches_in_flight = counters_.batches_in_flight;
  s.rooms = counters_.rooms;
  s.peers = counters_.peers;
  s.loop_tasks = loop_.tasks_run() + loop_.timers_fired();
  s.room_steps = counters_.room_steps;
  s.notified_reports = counters_.notified_reports;
  s.engine_threads = 1 + connector_.threads() + copier_.threads();
  return s;
}

Result<std::shared_ptr<RoomHandle>> EngineCore::open_sender(RoomId room,
                                                            std::optional<EngineKey> decode) {
  if (!prefill()) {
    return Status::failed_precondition("sender() needs a prefill engine; this one is decode");
  }
  PDKV_ASSIGN_OR_RETURN(auto handle, directory_.open(room, "sender"));
  loop_.post([this, handle, decode] { prefill_->open(handle, decode); });
  return handle;
}

Result<std::shared_ptr<RoomHandle>> EngineCore::open_receiver(RoomId room,
                                                              EngineKey prefill_engine) {
  if (prefill()) {
    return Status::failed_precondition("receiver() needs a decode engine; this one is prefill");
  }
  PDKV_ASSIGN_OR_RETURN(auto handle, directory_.open(room, "receiver"));
  loop_.post([this, handle, prefill_engine] { decode_->open(handle, prefill_engine); });
  return handle;
}

Status EngineCore::check_slots(RoomId room, uint32_t aux_slot,
                               const std::vector<uint32_t>& state_slots, uint32_t aux_slots,
                               uint32_t state_slots_max) const {
  if (!config_.aux_item_bytes.empty() && aux_slot >= aux_slots) {
    return Status::out_of_range(
        fmt::format("room {}: aux slot {} of {} slots", room, aux_slot, aux_slots));
  }
  for (uint32_t s : state_slots) {
    if (s >= state_slots_max) {
      return Status::out_of_range(
          fmt::format("room {}: state slot {} of {} slots", room, s, state_slots_max));
    }
  }
  return Status::ok();
}

Status EngineCore::sender_init(RoomHandle& room, uint64_t num_pages, uint32_t aux_slot,
                               std::vector<uint32_t> state_slots) {
  PDKV_RETURN_IF_ERROR(
      check_slots(room.id, aux_slot, state_slots, config_.aux_slots, config_.state.num_slots));
  {
    std::lock_guard lock(room.mu);
    if (room.initialized) {
      return Status::failed_precondition(fmt::format("room {}: init() twice", room.id));
    }
    room.initialized = true;
    room.num_pages = num_pages;
  }
  const RoomId id = room.id;
  loop_.post([this, id, num_pages, aux_slot, state_slots = std::move(state_slots)]() mutable {
    prefill_->init(id, num_pages, aux_slot, std::move(state_slots));
  });
  return Status::ok();
}

Status EngineCore::sender_send(RoomHandle& room, std::span<const uint64_t> pages, bool is_last) {
  const RoomId id = room.id;
  if (room.state.state() == PollState::kFailed) return room.state.failure();
  for (uint64_t p : pages) {
    if (p >= config_.kv.num_pages) {
      return Status::out_of_range(fmt::format("room {}: page {} is beyond this pool's {} pages", id,
                                              p, config_.kv.num_pages));
    }
  }
  {
    std::lock_guard lock(room.mu);
    if (!room.initialized) {
      return Status::failed_precondition(fmt::format("room {}: send() before init()", id));
    }
    if (room.last_sent) {
      return Status::failed_precondition(fmt::format("room {}: send() after the last chunk", id));
    }
    const uint64_t total = room.pages_sent + pages.size();
    if (total > room.num_pages) {
      return Status::invalid_argument(fmt::format(
          "room {}: chunks add up to {} pages but init() announced {}", id, total, room.num_pages));
    }
    if (is_last && total != room.num_pages) {
      return Status::invalid_argument(
          fmt::format("room {}: the last chunk ends at {} pages but init() announced {}", id, total,
                      room.num_pages));
    }
    room.pages_sent = total;
    room.last_sent = is_last;
  }
  loop_.post([this, id, pages = std::vector<uint64_t>(pages.begin(), pages.end()),
              is_last]() mutable { prefill_->send(id, std::move(pages), is_last); });
  return Status::ok();
}

void EngineCore::sender_abort(RoomHandle& room, const std::string& reason) {
  loop_.post([this, id = room.id, reason] { prefill_->abort(id, reason); });
}

Status EngineCore::receiver_init(RoomHandle& room) {
  {
    std::lock_guard lock(room.mu);
    if (room.init_called) {
      return Status::failed_precondition(fmt::format("room {}: init() twice", room.id));
    }
    room.init_called = true;
  }
  loop_.post([this, id = room.id] { decode_->init(id); });
  return Status::ok();
}

Status EngineCore::receiver_send_metadata(RoomHandle& room, std::span<const uint64_t> pages,
                                          uint32_t aux_slot, std::vector<uint32_t> state_slots,
                                          uint64_t prefix_pages) {
  const RoomId id = room.id;
  if (pages.empty() && prefix_pages == 0) {
    return Status::invalid_argument(fmt::format("room {}: no pages", id));
  }
  std::vector<bool> seen(config_.kv.num_pages);
  for (size_t i = 0; i < pages.size(); ++i) {
    if (pages[i] >= config_.kv.num_pages) {
      return Status::out_of_range(
          fmt::format("room {}: page list entry {} is page {}, but this pool has {} pages", id, i,
                      pages[i], config_.kv.num_pages));
    }
    if (seen[pages[i]]) {
      return Status::invalid_argument(fmt::format("room {}: page {} listed twice", id, pages[i]));
    }
    seen[pages[i]] = true;
  }
  PDKV_RETURN_IF_ERROR(
      check_slots(id, aux_slot, state_slots, config_.aux_slots, config_.state.num_slots));
  {
    std::lock_guard lock(room.mu);
    if (!room.init_called) {
      return Status::failed_precondition(fmt::format("room {}: send_metadata() before init()", id));
    }
    if (room.metadata_sent) {
      return Status::failed_precondition(fmt::format("room {}: send_metadata() twice", id));
    }
    if (room.state.state() == PollState::kFailed) return room.state.failure();
    room.metadata_sent = true;
  }
  proto::TransferInfo info;
  info.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  info.set_room(id);
  *info.mutable_decode() = ref_of(self_);
  info.mutable_dst_pages()->Add(pages.begin(), pages.end());
  info.set_aux_slot(aux_slot);
  info.mutable_state_slots()->Add(state_slots.begin(), state_slots.end());
  info.set_prefix_pages(prefix_pages);
  loop_.post([this, id, info = std::move(info)]() mutable {
    decode_->send_metadata(id, std::move(info));
  });
  return Status::ok();
}

void EngineCore::receiver_abort(RoomHandle& room, const std::string& reason) {
  loop_.post([this, id = room.id, reason] { decode_->abort(id, reason); });
}

void EngineCore::close_room(RoomHandle& room) {
  directory_.close(room.id);
  loop_.post([this, id = room.id] { prefill() ? prefill_->close(id) : decode_->close(id); });
}

std::vector<PollState> EngineCore::poll(std::span<const RoomId> rooms) const {
  std::vector<PollState> out;
  out.reserve(rooms.size());
  for (RoomId id : rooms) {
    auto handle = directory_.find(id);
    out.push_back(handle ? handle->state.state() : PollState::kFailed);
  }
  return out;
}

void EngineCore::on_transfer_info(const proto::TransferInfo& info, AnswerPtr answer) {
  // A copy: gRPC frees its request once the answer is sent.
  loop_.post([this, info, answer] {
    if (!prefill()) {
      return answer->send(
          Status::failed_precondition(fmt::format("{} is a decode rank", describe(self_))));
    }
    prefill_->on_transfer_info(info, answer);
  });
}

void EngineCore::on_room_status(const proto::RoomStatus& status, AnswerPtr answer) {
  loop_.post([this, status, answer] {
    if (prefill()) {
      return answer->send(
          Status::failed_precondition(fmt::format("{} is a prefill rank", describe(self_))));
    }
    decode_->on_room_status(status, answer);
  });
}

void EngineCore::on_abort(const proto::AbortRequest& request, AnswerPtr answer) {
  loop_.post([this, request, answer] {
    if (!prefill()) {
      return answer->send(
          Status::failed_precondition(fmt::format("{} is a decode rank", describe(self_))));
    }
    prefill_->on_abort(request, answer);
  });
}

}  // namespace pdkv::engine

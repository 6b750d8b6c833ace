// Engine, Sender and Receiver: thin handles over EngineCore and a room's
// RoomHandle. Every call returns without waiting on a peer.
#include <fmt/format.h>

#include "engine/core.h"

namespace pdkv {

Engine::Engine(std::shared_ptr<engine::EngineCore> core) : core_(std::move(core)) {}

Engine::~Engine() { core_->shutdown(); }

Result<std::unique_ptr<Engine>> Engine::create(EngineConfig config, EnginePools pools) {
  PDKV_ASSIGN_OR_RETURN(auto core, engine::EngineCore::start(std::move(config), std::move(pools)));
  return std::unique_ptr<Engine>(new Engine(std::move(core)));
}

Result<std::unique_ptr<Engine>> Engine::create(EngineConfig config) {
  PDKV_ASSIGN_OR_RETURN(auto core, engine::EngineCore::start(std::move(config), std::nullopt));
  return std::unique_ptr<Engine>(new Engine(std::move(core)));
}

const EngineConfig& Engine::config() const { return core_->config(); }
const EnginePools& Engine::pools() const { return core_->pools(); }
std::string Engine::control_address() const { return core_->control_address(); }
EngineStats Engine::stats() const { return core_->stats(); }

Result<std::unique_ptr<Sender>> Engine::sender(RoomId room) {
  PDKV_ASSIGN_OR_RETURN(auto handle, core_->open_sender(room, std::nullopt));
  return std::unique_ptr<Sender>(new Sender(core_, std::move(handle)));
}

Result<std::unique_ptr<Sender>> Engine::sender(RoomId room, const std::string& decode_engine,
                                               uint32_t decode_dp_rank) {
  PDKV_ASSIGN_OR_RETURN(auto handle,
                        core_->open_sender(room, engine::EngineKey{decode_engine, decode_dp_rank}));
  return std::unique_ptr<Sender>(new Sender(core_, std::move(handle)));
}

Result<std::unique_ptr<Receiver>> Engine::receiver(RoomId room, const std::string& prefill_engine,
                                                   uint32_t prefill_dp_rank) {
  PDKV_ASSIGN_OR_RETURN(
      auto handle, core_->open_receiver(room, engine::EngineKey{prefill_engine, prefill_dp_rank}));
  return std::unique_ptr<Receiver>(new Receiver(core_, std::move(handle)));
}

std::vector<PollState> Engine::poll(std::span<const RoomId> rooms) const {
  return core_->poll(rooms);
}
std::vector<RoomId> Engine::take_changed_rooms() { return core_->changes().take(); }
bool Engine::wait_for_changes(std::chrono::milliseconds timeout) {
  return core_->changes().wait(timeout);
}
int Engine::change_fd() const { return core_->changes().fd(); }

Sender::~Sender() { core_->close_room(*room_); }
Status Sender::init(uint64_t num_pages, uint32_t aux_slot, std::vector<uint32_t> state_slots) {
  return core_->sender_init(*room_, num_pages, aux_slot, std::move(state_slots));
}
Status Sender::send(std::span<const uint64_t> pages, bool is_last) {
  return core_->sender_send(*room_, pages, is_last);
}
PollState Sender::poll() const { return room_->state.state(); }
void Sender::abort(const std::string& reason) { core_->sender_abort(*room_, reason); }
Status Sender::failure() const { return room_->state.failure(); }
uint64_t Sender::decode_prefix_pages() const {
  std::lock_guard lock(room_->mu);
  return room_->decode_prefix_pages;
}
TransferMetrics Sender::metrics() const { return room_->metrics(); }
RoomId Sender::room() const { return room_->id; }

Receiver::~Receiver() { core_->close_room(*room_); }
Status Receiver::init() { return core_->receiver_init(*room_); }
Status Receiver::send_metadata(std::span<const uint64_t> dst_pages, uint32_t aux_slot,
                               std::vector<uint32_t> state_slots, uint64_t prefix_pages) {
  return core_->receiver_send_metadata(*room_, dst_pages, aux_slot, std::move(state_slots),
                                       prefix_pages);
}
PollState Receiver::poll() const { return room_->state.state(); }
void Receiver::abort(const std::string& reason) { core_->receiver_abort(*room_, reason); }
Status Receiver::failure() const { return room_->state.failure(); }
TransferMetrics Receiver::metrics() const { return room_->metrics(); }
RoomId Receiver::room() const { return room_->id; }

}  // namespace pdkv

// Engine, Sender and Receiver: thin handles over EngineCore.
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

Result<std::unique_ptr<Sender>> Engine::sender(RoomId room, const std::string& decode_engine,
                                               uint32_t decode_dp_rank) {
  PDKV_RETURN_IF_ERROR(core_->open_prefill_room(room, decode_engine, decode_dp_rank));
  return std::unique_ptr<Sender>(new Sender(core_, room));
}

Result<std::unique_ptr<Receiver>> Engine::receiver(RoomId room, const std::string& prefill_engine,
                                                   uint32_t prefill_dp_rank) {
  PDKV_RETURN_IF_ERROR(core_->open_decode_room(room, prefill_engine, prefill_dp_rank));
  return std::unique_ptr<Receiver>(new Receiver(core_, room));
}

Sender::~Sender() { core_->close_room(room_); }
Status Sender::init(uint64_t num_pages, uint32_t aux_slot, std::vector<uint32_t> state_slots) {
  return core_->prefill_init(room_, num_pages, aux_slot, std::move(state_slots));
}
Status Sender::send(std::span<const uint64_t> pages, bool is_last) {
  return core_->prefill_send(room_, pages, is_last);
}
PollState Sender::poll() const { return core_->poll(room_); }
void Sender::abort(const std::string& reason) { core_->prefill_abort(room_, reason); }
Status Sender::failure() const { return core_->failure(room_); }

Receiver::~Receiver() { core_->close_room(room_); }
Status Receiver::init() { return core_->decode_init(room_); }
Status Receiver::send_metadata(std::span<const uint64_t> dst_pages, uint32_t aux_slot,
                               std::vector<uint32_t> state_slots) {
  return core_->decode_send_metadata(room_, dst_pages, aux_slot, std::move(state_slots));
}
PollState Receiver::poll() const { return core_->poll(room_); }
Status Receiver::abort(const std::string& reason) { return core_->decode_abort(room_, reason); }
Status Receiver::failure() const { return core_->failure(room_); }

}  // namespace pdkv

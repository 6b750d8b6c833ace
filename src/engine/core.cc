// EngineCore: start-up, shutdown, lookups, the progress thread, peer loss
// and room bookkeeping shared by both roles. The role-specific halves are
// prefill_rooms.cc and decode_rooms.cc.
#include "engine/core.h"

#include <fmt/format.h>

#include <random>

#include "engine/control_service.h"
#include "grpc_status.h"
#include "log.h"

namespace pdkv::engine {
namespace {

constexpr size_t kMaxTombstones = 1 << 20;  // ids of cleared rooms remembered

PoolSizes pool_sizes(const EngineConfig& c, const RankShard& shard, uint32_t local_channels) {
  PoolSizes sizes;
  sizes.kv_buffers = shard.layers.count * c.kv.buffers_per_layer();
  sizes.kv_buffer_bytes = c.kv.num_pages * c.kv.page_bytes(shard.heads.count);
  sizes.aux_bytes = c.aux_bytes > 0 ? uint64_t{c.aux_slots} * c.aux_bytes : 0;
  sizes.state_bytes = c.state.channels > 0 ? uint64_t{c.state.num_slots} * shard.layers.count *
                                                 local_channels * c.state.channel_bytes
                                           : 0;
  sizes.staging_bytes = c.staging_bytes;
  return sizes;
}

Status check_pools(const EngineConfig& c, const RankShard& shard, const PoolSizes& need,
                   const EnginePools& pools) {
  if (pools.kv.size() != need.kv_buffers) {
    return Status::invalid_argument(
        fmt::format("{} KV buffers given; a rank with {} layers x {} needs {}", pools.kv.size(),
                    shard.layers.count, c.kv.mla ? "latent" : "K+V", need.kv_buffers));
  }
  for (size_t i = 0; i < pools.kv.size(); ++i) {
    if (pools.kv[i].base == nullptr || pools.kv[i].length < need.kv_buffer_bytes) {
      return Status::invalid_argument(
          fmt::format("KV buffer {} holds {} bytes; {} pages x {} B need {}", i, pools.kv[i].length,
                      c.kv.num_pages, c.kv.page_bytes(shard.heads.count), need.kv_buffer_bytes));
    }
  }
  if (pools.aux.length < need.aux_bytes) {
    return Status::invalid_argument(
        fmt::format("aux region holds {} bytes; {} slots x {} B need {}", pools.aux.length,
                    c.aux_slots, c.aux_bytes, need.aux_bytes));
  }
  if (pools.state.length < need.state_bytes) {
    return Status::invalid_argument(
        fmt::format("state region holds {} bytes; needs {}", pools.state.length, need.state_bytes));
  }
  if (need.staging_bytes > 0 &&
      (pools.staging.base == nullptr || pools.staging.length < need.staging_bytes)) {
    return Status::invalid_argument(
        fmt::format("staging region holds {} bytes; staging_bytes is {}", pools.staging.length,
                    need.staging_bytes));
  }
  return Status::ok();
}

}  // namespace

EngineCore::EngineCore(EngineConfig config) : config_(std::move(config)) {}

Result<std::shared_ptr<EngineCore>> EngineCore::start(EngineConfig config,
                                                      std::optional<EnginePools> pools) {
  const EngineConfig& c = config;
  if (c.engine_id.empty()) return Status::invalid_argument("EngineConfig.engine_id is empty");
  if (c.bootstrap_address.empty()) {
    return Status::invalid_argument("EngineConfig.bootstrap_address is empty");
  }
  PDKV_RETURN_IF_ERROR(c.kv.validate());
  auto rank_check = [](const char* what, uint32_t rank, uint32_t size) {
    return rank < size ? Status::ok()
                       : Status::invalid_argument(fmt::format("{} rank {} is outside {} size {}",
                                                              what, rank, what, size));
  };
  PDKV_RETURN_IF_ERROR(rank_check("tp", c.tp_rank, c.tp_size));
  PDKV_RETURN_IF_ERROR(rank_check("pp", c.pp_rank, c.pp_size));
  PDKV_RETURN_IF_ERROR(rank_check("dp", c.dp_rank, c.dp_size));
  const char* role = c.role == Role::kPrefill ? "prefill" : "decode";
  PDKV_ASSIGN_OR_RETURN(auto heads, AxisSharding::even(c.kv.total_heads, c.tp_size,
                                                       {"KV heads", fmt::format("{} TP", role)}));
  UnitRange layers;
  if (c.layers) {
    layers = *c.layers;
    if (layers.count == 0 || layers.end() > c.kv.num_layers) {
      return Status::invalid_argument(fmt::format("layers [{}, {}) outside the model's {}",
                                                  layers.first, layers.end(), c.kv.num_layers));
    }
  } else {
    PDKV_ASSIGN_OR_RETURN(auto axis, AxisSharding::even(c.kv.num_layers, c.pp_size,
                                                        {"layers", fmt::format("{} PP", role)}));
    if (c.pp_size > c.kv.num_layers) {
      return Status::invalid_argument(
          fmt::format("{} PP {} exceeds the model's {} layers", role, c.pp_size, c.kv.num_layers));
    }
    layers = axis.owned(c.pp_rank).value();
  }
  uint32_t local_channels = 0;
  if (c.state.channels > 0) {
    PDKV_ASSIGN_OR_RETURN(auto chan,
                          AxisSharding::even(c.state.channels, c.tp_size,
                                             {"state channels", fmt::format("{} TP", role)}));
    local_channels = chan.owned(c.tp_rank).value().count;
  }
  if (c.aux_bytes > 0 && c.aux_slots == 0) {
    return Status::invalid_argument(fmt::format("aux_bytes {} with 0 aux slots", c.aux_bytes));
  }
  if (c.staging == Staging::kOn && c.staging_bytes == 0) {
    return Status::invalid_argument("staging on needs EngineConfig.staging_bytes > 0");
  }
  const RankShard shard{c.kv, heads.owned(c.tp_rank).value(), layers};
  const PoolSizes sizes = pool_sizes(c, shard, local_channels);
  if (pools) PDKV_RETURN_IF_ERROR(check_pools(c, shard, sizes, *pools));
  PDKV_ASSIGN_OR_RETURN(auto transport, create_transport(c.backend, c.transport_options));

  std::shared_ptr<EngineCore> core(new EngineCore(std::move(config)));
  if (pools) {
    core->pools_ = std::move(*pools);
  } else {
    PDKV_ASSIGN_OR_RETURN(core->pools_, allocate_pools(*transport, sizes, core->owned_memory_));
  }
  core->shard_ = shard;
  core->local_channels_ = local_channels;
  PDKV_RETURN_IF_ERROR(core->init(std::move(transport)));
  return core;
}

Status EngineCore::init(std::unique_ptr<Transport> transport) {
  transport_ = std::move(transport);
  PDKV_ASSIGN_OR_RETURN(
      pool_staging_,
      PoolStaging::create(config_, pools_, transport_->capabilities(), config_.backend));
  if (pool_staging_->mode() == PoolStaging::Mode::kDeviceDirect &&
      config_.staging != Staging::kNaive) {
    // The transport writes device pages directly: nothing to gather on the
    // host, which could not read them anyway.
    config_.staging = Staging::kOff;
  }
  if (pool_staging_->mode() != PoolStaging::Mode::kDeviceStaged) {  // else never written in place
    for (const MemoryRegion& region : pools_.kv) {
      PDKV_ASSIGN_OR_RETURN(RegionKey key, transport_->register_region(region));
      kv_keys_.push_back(key);
    }
  }
  if (config_.aux_bytes > 0) {
    PDKV_ASSIGN_OR_RETURN(aux_key_, transport_->register_region(pools_.aux));
  }
  if (config_.state.channels > 0) {
    PDKV_ASSIGN_OR_RETURN(state_key_, transport_->register_region(pools_.state));
  }
  if (config_.staging_bytes > 0) {
    PDKV_ASSIGN_OR_RETURN(staging_key_, transport_->register_region(pools_.staging));
    staging_pool_ = StagingPool(config_.staging_bytes);
  }
  transport_->set_peer_failure_callback(
      [this](PeerId peer, const Status& reason) { on_transport_peer_failed(peer, reason); });

  service_ = make_control_service(this);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(config_.control_host + ":0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service_.get());
  configure_server(builder, config_.timeouts.keepalive);
  server_ = builder.BuildAndStart();
  if (!server_ || port == 0) {
    return Status::unavailable(
        fmt::format("cannot start the control service on {}", config_.control_host));
  }

  std::random_device rd;
  self_.set_engine_id(config_.engine_id);
  self_.set_dp_rank(config_.dp_rank);
  self_.set_dp_size(config_.dp_size);
  self_.set_tp_rank(config_.tp_rank);
  self_.set_tp_size(config_.tp_size);
  self_.set_pp_rank(config_.pp_rank);
  self_.set_pp_size(config_.pp_size);
  self_.set_layer_first(shard_.layers.first);
  self_.set_layer_count(shard_.layers.count);
  kv_spec_to_proto(config_.kv, self_.mutable_kv_spec());
  self_.set_backend(config_.backend);
  self_.set_control_address(fmt::format("{}:{}", config_.control_host, port));
  self_.set_transport_descriptor(transport_->descriptor());
  self_.set_incarnation((uint64_t{rd()} << 32) ^ rd());
  self_.set_role(config_.role == Role::kPrefill ? proto::ROLE_PREFILL : proto::ROLE_DECODE);
  self_.set_aux_bytes(config_.aux_bytes);
  self_.set_aux_slots(config_.aux_slots);
  self_.mutable_state()->set_channels(config_.state.channels);
  self_.mutable_state()->set_channel_bytes(config_.state.channel_bytes);
  self_.mutable_state()->set_num_slots(config_.state.num_slots);
  self_.set_kv_region_first(kv_keys_.empty() ? 0 : kv_keys_.front());
  self_.set_kv_staged_only(staged_only());
  self_.set_aux_region(aux_key_);
  self_.set_state_region(state_key_);
  self_.set_staging_region(staging_key_);
  self_.set_staging_bytes(config_.staging_bytes);

  links_ = std::make_unique<PeerLinks>(
      self_ref(), config_.timeouts.keepalive, config_.timeouts.connect,
      [this](const std::string& key, const Status& reason) { on_peer_lost(key, reason); });
  bootstrap_ = std::make_unique<bootstrap::Client>(config_.bootstrap_address);
  // Publish everything above to the control service's threads, which were
  // started with the server: each handler takes mu_ before it reads any of it.
  { std::lock_guard publish(mu_); }
  worker_ = std::thread([this] { run(); });
  // Control calls block on peers: a few threads, so one slow peer does not
  // hold up every room.
  for (int i = 0; i < 4; ++i) action_threads_.emplace_back([this] { run_actions(); });

  auto registered = bootstrap_->register_rank(self_, config_.timeouts.bootstrap);
  if (!registered.is_ok()) {
    shutdown();
    return registered.status();
  }
  logger("engine")->info("{} up: control {}, backend {}", describe(self_), self_.control_address(),
                         config_.backend);
  return Status::ok();
}

EngineCore::~EngineCore() { shutdown(); }

void EngineCore::shutdown() {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    const Status reason = Status::aborted(fmt::format("engine {} shut down", describe(self_)));
    for (auto& [id, room] : prefill_rooms_) fail_prefill(*room, reason);
    for (auto& [id, room] : decode_rooms_) fail_decode(*room, reason);
  }
  wake();
  // The progress thread runs the failure notices it was handed, then stops.
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake();  // also ends handlers waiting on a lookup or for writes to drain
  if (worker_.joinable()) worker_.join();
  actions_cv_.notify_all();
  for (auto& t : action_threads_) {
    if (t.joinable()) t.join();  // after running the failure notices still queued
  }
  // Watch streams never end by themselves: end them, then give unary calls in
  // progress a moment to deliver their replies (a success report's
  // acknowledgement must reach the prefill even as this rank leaves). The
  // service object must outlive every handler thread of the server.
  if (server_) {
    close_watches(*service_);
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_->Wait();
    server_.reset();
  }
  if (links_) links_->stop_all();
  for (auto& t : lookups_) {
    if (t.joinable()) t.join();
  }
}

proto::RankRef EngineCore::self_ref() const { return ref_of(self_); }

std::shared_ptr<PeerLink> EngineCore::link_to(const proto::RankInfo& peer) {
  return links_->get(peer.control_address(), peer.incarnation(), describe(peer));
}

PeerEngine& EngineCore::peer_engine(const EngineKey& key) {
  auto [it, created] = peers_.try_emplace(key);
  PeerEngine& peer = it->second;
  if (created || peer.lookup == PeerEngine::Lookup::kFailed) {
    peer = PeerEngine{};
    if (!stopping_) lookups_.emplace_back([this, key] { lookup(key); });
  }
  return peer;
}

void EngineCore::lookup(EngineKey key) {
  auto cancelled = [this] {
    std::lock_guard lock(mu_);
    return stopping_;
  };
  const auto timeout = config_.timeouts.bootstrap;
  auto theirs = bootstrap_->wait_for_topology(key.first, key.second, timeout, cancelled);
  Result<std::vector<proto::RankInfo>> ours = Status::internal("not looked up");
  if (theirs.is_ok()) {
    ours = bootstrap_->wait_for_topology(config_.engine_id, config_.dp_rank, timeout, cancelled);
  }
  PeerEngine result;
  if (!theirs.is_ok() || !ours.is_ok()) {
    result.lookup = PeerEngine::Lookup::kFailed;
    result.error = !theirs.is_ok() ? theirs.status() : ours.status();
  } else {
    Topology peer{std::move(theirs).value()}, self{std::move(ours).value()};
    const bool peer_is_decode = peer.ranks.front().role() == proto::ROLE_DECODE;
    const bool i_am_prefill = config_.role == Role::kPrefill;
    if (peer_is_decode != i_am_prefill) {
      result.lookup = PeerEngine::Lookup::kFailed;
      result.error = Status::invalid_argument(
          fmt::format("engine '{}' is a {} engine, but a {} rank needs a {} engine", key.first,
                      peer_is_decode ? "decode" : "prefill", i_am_prefill ? "prefill" : "decode",
                      i_am_prefill ? "decode" : "prefill"));
    } else {
      auto links = i_am_prefill ? compute_links(self, peer) : compute_links(peer, self);
      if (links.is_ok()) {
        result.lookup = PeerEngine::Lookup::kReady;
        result.topology = std::move(peer);
        result.links = std::move(links).value();
      } else {
        result.lookup = PeerEngine::Lookup::kFailed;
        result.error = links.status().with_context(
            fmt::format("{} cannot exchange KV with engine '{}'", config_.engine_id, key.first));
      }
    }
  }
  {
    std::lock_guard lock(mu_);
    peers_[key] = std::move(result);
  }
  wake();
}

void EngineCore::run() {
  std::unique_lock lock(mu_);
  while (true) {
    bool busy = false;
    for (auto it = prefill_rooms_.begin(); it != prefill_rooms_.end();) {
      progress_prefill(*it->second, busy);
      if (it->second->expired) {
        bury(it->first);
        it = prefill_rooms_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = draining_.begin(); it != draining_.end();) {
      bool pending = false;
      for (auto& [key, dest] : (*it)->destinations) {
        drain(dest);
        pending |= !dest.in_flight.empty();
      }
      busy |= pending;
      it = pending ? std::next(it) : draining_.erase(it);
    }
    staging_starved_ = false;
    for (auto& [id, room] : decode_rooms_) progress_decode(*room);
    busy |= staging_starved_;  // retry soon: a slot frees as rooms finish
    const Clock::time_point now = Clock::now();
    for (auto it = staging_quarantine_.begin(); it != staging_quarantine_.end();) {
      if (now < it->first) {
        ++it;
        continue;
      }
      staging_pool_.release(it->second);
      it = staging_quarantine_.erase(it);
    }
    if (!deferred_.empty()) {
      for (Action& action : deferred_) actions_.push_back(std::move(action));
      deferred_.clear();
      actions_cv_.notify_all();
    }
    if (stopping_) break;
    // Batches in flight are polled often; otherwise sleep until the nearest
    // deadline (or a wake-up from an API call, a message or a lookup).
    auto until = Clock::now() + (busy ? std::chrono::microseconds(100) : std::chrono::seconds(1));
    for (auto& [id, room] : prefill_rooms_) until = std::min(until, room->deadline);
    for (auto& [id, room] : decode_rooms_) until = std::min(until, room->deadline);
    cv_.wait_until(lock, until);
  }
}

void EngineCore::run_actions() {
  std::unique_lock lock(mu_);
  while (true) {
    actions_cv_.wait(lock, [this] { return stopping_ || !actions_.empty(); });
    if (actions_.empty()) return;  // stopping, and nothing left to tell peers
    Action action = std::move(actions_.front());
    actions_.pop_front();
    lock.unlock();
    action();
    lock.lock();
  }
}

const PeerEngine* EngineCore::await_peer(std::unique_lock<std::mutex>& lock, const EngineKey& key) {
  peer_engine(key);
  cv_.wait_for(lock, config_.timeouts.bootstrap, [&] {
    auto p = peers_.find(key);
    return stopping_ || p == peers_.end() || p->second.lookup != PeerEngine::Lookup::kPending;
  });
  auto p = peers_.find(key);
  if (stopping_ || p == peers_.end() || p->second.lookup != PeerEngine::Lookup::kReady)
    return nullptr;
  return &p->second;
}

void EngineCore::drain(Destination& dest) {
  for (auto it = dest.in_flight.begin(); it != dest.in_flight.end();) {
    const BatchStatus st = transport_->poll(*it);
    it = st.state == BatchState::kInProgress ? std::next(it) : dest.in_flight.erase(it);
  }
  if (!dest.in_flight.empty()) return;
  // The gathered block has left: its buffer is free again.
  if (dest.local_staging && dest.extras_written) {
    staging_pool_.release(*dest.local_staging);
    dest.local_staging.reset();
  }
  cv_.notify_all();  // an abort may be waiting for this, or a room for staging space
}

void EngineCore::on_peer_lost(const std::string& key, const Status& reason) {
  std::optional<PeerId> transport_peer;
  {
    std::lock_guard lock(mu_);
    const size_t affected = fail_rooms_waiting_on(key, reason);
    // A peer that leaves when nothing waits on it is news, not a warning.
    logger("engine")->log(affected ? spdlog::level::warn : spdlog::level::info, "{}",
                          reason.message());
    // A restarted peer registers a new incarnation: look its engine up afresh.
    for (auto it = peers_.begin(); it != peers_.end();) {
      bool stale = false;
      for (const auto& r : it->second.topology.ranks) stale |= PeerLinks::key_of(r) == key;
      it = stale ? peers_.erase(it) : std::next(it);
    }
    auto tp = transport_peers_.find(key);
    if (tp != transport_peers_.end()) transport_peer = tp->second;
  }
  // Outside mu_: the transport may call back into on_transport_peer_failed.
  if (transport_peer) transport_->fail_peer(*transport_peer, reason);
  wake();
}

size_t EngineCore::fail_rooms_waiting_on(const std::string& key, const Status& reason) {
  // Only rooms that still wait on that peer fail: a destination that
  // acknowledged (or is acknowledging: a success report in flight is decided
  // by its reply, not by the loss), or a source that reported, owes this
  // room nothing more.
  size_t affected = 0;
  for (auto& [id, room] : prefill_rooms_) {
    for (auto& [k, dest] : room->destinations) {
      if (PeerLinks::key_of(dest.rank) == key && !dest.reported && !dest.report_pending &&
          !room->state.terminal()) {
        fail_prefill(*room, reason);
        ++affected;
      }
    }
  }
  for (auto& [id, room] : decode_rooms_) {
    for (auto& [k, source] : room->sources) {
      if (PeerLinks::key_of(source.rank) == key && !source.reported && !room->state.terminal()) {
        fail_decode(*room, reason);
        ++affected;
      }
    }
  }
  return affected;
}

void EngineCore::on_transport_peer_failed(PeerId peer, const Status& reason) {
  std::lock_guard lock(mu_);
  for (const auto& [key, p] : transport_peers_) {
    if (p != peer) continue;
    fail_rooms_waiting_on(
        key, Status::unavailable(fmt::format("transport lost peer {}: {}", key, reason.message())));
    break;
  }
  wake();
}

PollState EngineCore::poll(RoomId room) const {
  std::lock_guard lock(mu_);
  if (auto it = prefill_rooms_.find(room); it != prefill_rooms_.end())
    return it->second->state.state();
  if (auto it = decode_rooms_.find(room); it != decode_rooms_.end())
    return it->second->state.state();
  return PollState::kFailed;
}

Status EngineCore::failure(RoomId room) const {
  std::lock_guard lock(mu_);
  if (auto it = prefill_rooms_.find(room); it != prefill_rooms_.end())
    return it->second->state.failure();
  if (auto it = decode_rooms_.find(room); it != decode_rooms_.end())
    return it->second->state.failure();
  return Status::not_found(fmt::format("room {} is not open", room));
}

void EngineCore::bury(RoomId room) {
  if (tombstones_.insert(room).second) tombstone_order_.push_back(room);
  while (tombstone_order_.size() > kMaxTombstones) {
    tombstones_.erase(tombstone_order_.front());
    tombstone_order_.pop_front();
  }
}

void EngineCore::close_room(RoomId id) {
  std::lock_guard lock(mu_);
  if (auto it = prefill_rooms_.find(id); it != prefill_rooms_.end()) {
    PrefillRoom& room = *it->second;
    fail_prefill(room, Status::aborted(fmt::format("room {} closed by its sender", id)));
    bool in_flight = false;
    for (auto& [k, dest] : room.destinations) in_flight |= !dest.in_flight.empty();
    if (in_flight) draining_.push_back(std::move(it->second));
    prefill_rooms_.erase(it);
  }
  if (auto it = decode_rooms_.find(id); it != decode_rooms_.end()) {
    fail_decode(*it->second, Status::aborted(fmt::format("room {} closed by its receiver", id)));
    for (auto& [key, source] : it->second->sources) {
      if (!source.staging_offset) continue;
      // A source may still be writing into the slot: reuse it only later.
      staging_quarantine_.emplace_back(Clock::now() + config_.timeouts.transfer,
                                       *source.staging_offset);
    }
    decode_rooms_.erase(it);
  }
  bury(id);
  wake();
}

Status EngineCore::check_room_unused(RoomId id) const {
  if (closed_before(id)) {
    return Status::failed_precondition(fmt::format("room {} was used and closed already", id));
  }
  return Status::ok();
}

PrefillRoom* EngineCore::find_prefill(RoomId id) {
  if (auto it = prefill_rooms_.find(id); it != prefill_rooms_.end()) return it->second.get();
  for (auto& room : draining_) {
    if (room->id == id) return room.get();
  }
  return nullptr;
}

}  // namespace pdkv::engine

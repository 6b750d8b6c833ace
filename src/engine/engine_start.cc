// EngineCore's start-up: the configuration checked, pools given or
// allocated, the transport created (with injected faults, if asked) and the
// pools registered with it, the control service started, the loop's
// machinery built, and the rank registered with the bootstrap service.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <atomic>
#include <random>

#include "bootstrap/client.h"
#include "engine/core.h"
#include "log.h"
#include "security/grpc_security.h"

namespace pdkv::engine {
namespace {

PoolSizes pool_sizes(const EngineConfig& c, const RankShard& shard, uint32_t local_channels) {
  PoolSizes sizes;
  sizes.kv_buffers = shard.layers.count * c.kv.buffers_per_layer();
  sizes.kv_buffer_bytes = c.kv.num_pages * c.kv.page_bytes(shard.heads.count);
  for (uint32_t item : c.aux_item_bytes) sizes.aux_bytes.push_back(uint64_t{c.aux_slots} * item);
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
  if (pools.aux.size() != need.aux_bytes.size()) {
    return Status::invalid_argument(fmt::format("{} aux buffers given; aux_item_bytes names {}",
                                                pools.aux.size(), need.aux_bytes.size()));
  }
  for (size_t i = 0; i < pools.aux.size(); ++i) {
    if (pools.aux[i].base == nullptr || pools.aux[i].length < need.aux_bytes[i]) {
      return Status::invalid_argument(
          fmt::format("aux buffer {} holds {} bytes; {} slots x {} B need {}", i,
                      pools.aux[i].length, c.aux_slots, c.aux_item_bytes[i], need.aux_bytes[i]));
    }
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

// A transport's event callback (a batch ended, a notification arrived) that
// runs `task` on the loop. One task waits there at a time: events while it
// waits add nothing (it looks at every batch, or takes every notification),
// and one after it started posts another.
Transport::EventCallback post_once(std::shared_ptr<LoopInbox> inbox, std::function<void()> task) {
  return [inbox = std::move(inbox),
          task = std::make_shared<const std::function<void()>>(std::move(task)),
          queued = std::make_shared<std::atomic<bool>>(false)] {
    if (queued->exchange(true)) return;
    inbox->post([task, queued] {
      queued->store(false);
      (*task)();
    });
  };
}

}  // namespace

Result<std::shared_ptr<EngineCore>> EngineCore::start(EngineConfig config,
                                                      std::optional<EnginePools> pools) {
  std::shared_ptr<EngineCore> core(new EngineCore(std::move(config)));
  PDKV_RETURN_IF_ERROR(core->check_config());
  security::warn_if_unauthenticated(core->config_.security, "engine");
  PDKV_RETURN_IF_ERROR(core->set_up_memory(std::move(pools)));
  PDKV_RETURN_IF_ERROR(core->register_pools());
  Status started = core->start_server();
  if (started.is_ok()) {
    core->build_machinery();
    auto registered = bootstrap::Client(core->config_.bootstrap_address, core->config_.security)
                          .register_rank(core->self_, core->config_.timeouts.bootstrap);
    started = registered.status();
    if (started.is_ok()) core->loop_.post([c = core.get()] { c->registration_->start(); });
  }
  if (!started.is_ok()) {
    core->shutdown();
    return started;
  }
  logger("engine")->info("{} up: control {}, backend {}", describe(core->self_),
                         core->self_.control_address(), core->config_.backend);
  return core;
}

Status EngineCore::check_config() {
  const EngineConfig& c = config_;
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
  const char* role = prefill() ? "prefill" : "decode";
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
  if (c.state.channels > 0) {
    PDKV_ASSIGN_OR_RETURN(auto chan,
                          AxisSharding::even(c.state.channels, c.tp_size,
                                             {"state channels", fmt::format("{} TP", role)}));
    local_channels_ = chan.owned(c.tp_rank).value().count;
  }
  for (size_t i = 0; i < c.aux_item_bytes.size(); ++i) {
    if (c.aux_item_bytes[i] == 0) {
      return Status::invalid_argument(fmt::format("aux_item_bytes[{}] is 0", i));
    }
  }
  if (!c.aux_item_bytes.empty() && c.aux_slots == 0) {
    return Status::invalid_argument(
        fmt::format("aux_item_bytes [{}] with 0 aux slots", fmt::join(c.aux_item_bytes, ", ")));
  }
  if (c.staging == Staging::kOn && c.staging_bytes == 0) {
    return Status::invalid_argument("staging on needs EngineConfig.staging_bytes > 0");
  }
  shard_ = RankShard{c.kv, heads.owned(c.tp_rank).value(), layers};
  return Status::ok();
}

Status EngineCore::set_up_memory(std::optional<EnginePools> pools) {
  const PoolSizes sizes = pool_sizes(config_, shard_, local_channels_);
  if (pools) PDKV_RETURN_IF_ERROR(check_pools(config_, shard_, sizes, *pools));
  // The data plane is on the rank's address too, unless its options say
  // otherwise (transport option `host`, which every backend takes), and its
  // batches may take as long as the engine allows a transfer.
  TransportOptions options = config_.transport_options;
  options.try_emplace("host", config_.control_host);
  options.try_emplace(kTransferTimeoutOption, std::to_string(config_.timeouts.transfer.count()));
  PDKV_ASSIGN_OR_RETURN(auto transport, create_transport(config_.backend, options));
  transport_ = inject_faults(std::move(transport), config_.faults);
  if (pools) {
    pools_ = std::move(*pools);
  } else {
    PDKV_ASSIGN_OR_RETURN(pools_, allocate_pools(*transport_, sizes, owned_memory_));
  }
  PDKV_ASSIGN_OR_RETURN(
      pool_staging_,
      PoolStaging::create(config_, pools_, transport_->capabilities(), config_.backend));
  if (pool_staging_->mode() == PoolStaging::Mode::kDeviceDirect &&
      config_.staging != Staging::kNaive) {
    // The transport writes device pages directly: nothing to gather on the
    // host, which could not read them anyway.
    config_.staging = Staging::kOff;
  }
  return Status::ok();
}

Status EngineCore::register_pools() {
  if (pool_staging_->mode() != PoolStaging::Mode::kDeviceStaged) {  // else never written in place
    for (const MemoryRegion& region : pools_.kv) {
      PDKV_ASSIGN_OR_RETURN(RegionKey key, transport_->register_region(region));
      keys_.kv.push_back(key);
    }
  }
  // Aux buffers take consecutive keys: a peer names buffer i as first + i.
  for (size_t i = 0; i < pools_.aux.size(); ++i) {
    PDKV_ASSIGN_OR_RETURN(RegionKey key, transport_->register_region(pools_.aux[i]));
    if (i == 0) keys_.aux_first = key;
    if (key != keys_.aux_first + i) {
      return Status::internal(fmt::format("{} gave aux buffer {} key {}, not {}", config_.backend,
                                          i, key, keys_.aux_first + i));
    }
  }
  if (config_.state.channels > 0) {
    PDKV_ASSIGN_OR_RETURN(keys_.state, transport_->register_region(pools_.state));
  }
  if (config_.staging_bytes > 0) {
    PDKV_ASSIGN_OR_RETURN(keys_.staging, transport_->register_region(pools_.staging));
  }
  return Status::ok();
}

Status EngineCore::start_server() {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(config_.control_host + ":0",
                           security::server_credentials(config_.security), &port);
  builder.RegisterService(&service_);
  configure_server(builder, config_.timeouts.keepalive);
  server_ = builder.BuildAndStart();
  if (!server_ || port == 0) {
    return Status::unavailable(
        fmt::format("cannot start the control service on {}", config_.control_host));
  }
  describe_self(port);
  return Status::ok();
}

void EngineCore::describe_self(int port) {
  std::random_device rd;
  const EngineConfig& c = config_;
  self_.set_engine_id(c.engine_id);
  self_.set_dp_rank(c.dp_rank);
  self_.set_dp_size(c.dp_size);
  self_.set_tp_rank(c.tp_rank);
  self_.set_tp_size(c.tp_size);
  self_.set_pp_rank(c.pp_rank);
  self_.set_pp_size(c.pp_size);
  self_.set_layer_first(shard_.layers.first);
  self_.set_layer_count(shard_.layers.count);
  kv_spec_to_proto(c.kv, self_.mutable_kv_spec());
  self_.set_backend(c.backend);
  self_.set_control_address(fmt::format("{}:{}", c.control_host, port));
  self_.set_transport_descriptor(transport_->descriptor());
  self_.set_incarnation((uint64_t{rd()} << 32) ^ rd());
  self_.set_role(prefill() ? proto::ROLE_PREFILL : proto::ROLE_DECODE);
  self_.mutable_aux_item_bytes()->Add(c.aux_item_bytes.begin(), c.aux_item_bytes.end());
  self_.set_aux_slots(c.aux_slots);
  self_.mutable_state()->set_channels(c.state.channels);
  self_.mutable_state()->set_channel_bytes(c.state.channel_bytes);
  self_.mutable_state()->set_num_slots(c.state.num_slots);
  self_.set_kv_region_first(keys_.kv.empty() ? 0 : keys_.kv.front());
  self_.set_kv_staged_only(pool_staging_->mode() == PoolStaging::Mode::kDeviceStaged);
  self_.set_aux_region_first(keys_.aux_first);
  self_.set_state_region(keys_.state);
  self_.set_staging_region(keys_.staging);
  self_.set_staging_bytes(c.staging_bytes);
}

void EngineCore::build_machinery() {
  lookups_ = std::make_unique<TopologyLookups>(loop_, calls_, config_.bootstrap_address, config_);
  registration_ = std::make_unique<Registration>(loop_, calls_, config_.bootstrap_address,
                                                 config_.security, self_);
  PeerRegistry::Hooks hooks;
  hooks.link_lost = [this](RoomId room, const std::string& peer, const Status& why) {
    return prefill() ? prefill_->on_link_lost(room, peer, why)
                     : decode_->on_link_lost(room, peer, why);
  };
  hooks.wire_ready = [this](RoomId room, const std::string& peer) {
    if (prefill()) prefill_->on_wire_ready(room, peer);
  };
  hooks.wire_failed = [this](RoomId room, const std::string& peer, const Status& why) {
    if (prefill()) prefill_->on_wire_failed(room, peer, why);
  };
  // A restarted peer registers a new incarnation: look its engine up afresh.
  hooks.peer_lost = [this](const std::string& peer) { lookups_->forget_peer(peer); };
  peers_ = std::make_unique<PeerRegistry>(loop_, calls_, connector_, *transport_, ref_of(self_),
                                          config_.timeouts, config_.security, counters_,
                                          std::move(hooks));
  ctx_.reset(new EngineContext{config_, self_, shard_, local_channels_, *transport_, *pool_staging_,
                               keys_, loop_, copier_, *peers_, *lookups_, directory_, feed_,
                               counters_, StagingPool(config_.staging_bytes), Planner()});
  prefill_ = std::make_unique<PrefillSide>(*ctx_);
  decode_ = std::make_unique<DecodeSide>(*ctx_);
  // Backend threads report failed peers at any time, even from inside our
  // own calls into the transport: the report only posts to the loop, and
  // after shutdown closed the inbox it is dropped.
  transport_->set_peer_failure_callback(
      [inbox = transport_inbox_, peers = peers_.get()](PeerId peer, const Status& reason) {
        inbox->post([peers, peer, reason] { peers->on_transport_failed(peer, reason); });
      });
  // Batch ends, where the transport announces them, are polled at once;
  // notifications (a source's success notice, decode_reports.cc) are taken
  // at once.
  if (transport_->capabilities().batch_end_events) {
    transport_->set_batch_end_callback(
        post_once(transport_inbox_, [prefill = prefill_.get()] { prefill->on_batch_end_event(); }));
  }
  if (transport_->capabilities().notifications) {
    transport_->set_notification_callback(
        post_once(transport_inbox_, [decode = decode_.get()] { decode->take_notices(); }));
  }
  loop_.start();
  service_.open(this);
}

}  // namespace pdkv::engine

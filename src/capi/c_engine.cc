// The C ABI's engine calls: creation with given or allocated pools, the
// pools, stats, and many-room polling.
#include <algorithm>

#include "capi/c_handles.h"

using pdkv::Status;
using pdkv::capi::c_call;
using pdkv::capi::require;

namespace {

pdkv::MemoryRegion to_region(const pdkv_region& r) {
  return pdkv::MemoryRegion{r.base, r.length, static_cast<pdkv::MemoryKind>(r.kind), r.device};
}

pdkv_region to_c(const pdkv::MemoryRegion& r) {
  return pdkv_region{r.base, r.length, static_cast<pdkv_memory_kind>(r.kind), r.device};
}

Status check_kind(const pdkv_region& r, const char* what) {
  if (r.kind < PDKV_MEMORY_HOST || r.kind > PDKV_MEMORY_HIP) {
    return Status::invalid_argument(std::string(what) + ": memory kind " +
                                    std::to_string(static_cast<int>(r.kind)) +
                                    " is none of host (0), cuda (1), hip (2)");
  }
  return Status::ok();
}

pdkv::Result<pdkv::EnginePools> to_pools(const pdkv_pools& c) {
  if ((c.num_kv > 0 && c.kv == nullptr) || (c.num_aux > 0 && c.aux == nullptr)) {
    return Status::invalid_argument("pools: a region array is NULL with a non-zero count");
  }
  pdkv::EnginePools pools;
  for (size_t i = 0; i < c.num_kv; ++i) {
    PDKV_RETURN_IF_ERROR(check_kind(c.kv[i], "pools.kv"));
    pools.kv.push_back(to_region(c.kv[i]));
  }
  for (size_t i = 0; i < c.num_aux; ++i) {
    PDKV_RETURN_IF_ERROR(check_kind(c.aux[i], "pools.aux"));
    pools.aux.push_back(to_region(c.aux[i]));
  }
  PDKV_RETURN_IF_ERROR(check_kind(c.state, "pools.state"));
  PDKV_RETURN_IF_ERROR(check_kind(c.staging, "pools.staging"));
  pools.state = to_region(c.state);
  pools.staging = to_region(c.staging);
  return pools;
}

// The regions of one pool, as a list (state and staging: one, when set).
std::vector<pdkv::MemoryRegion> pool_regions(const pdkv::EnginePools& pools, pdkv_pool_kind kind) {
  const auto single = [](const pdkv::MemoryRegion& r) {
    return r.length > 0 ? std::vector<pdkv::MemoryRegion>{r} : std::vector<pdkv::MemoryRegion>{};
  };
  switch (kind) {
    case PDKV_POOL_KV:
      return pools.kv;
    case PDKV_POOL_AUX:
      return pools.aux;
    case PDKV_POOL_STATE:
      return single(pools.state);
    case PDKV_POOL_STAGING:
      return single(pools.staging);
    default:  // refused by check_pool_kind before
      return {};
  }
}

Status check_pool_kind(pdkv_pool_kind kind) {
  if (kind < PDKV_POOL_KV || kind > PDKV_POOL_STAGING) {
    return Status::invalid_argument("pool kind " + std::to_string(static_cast<int>(kind)) +
                                    " is none of kv (0), aux (1), state (2), staging (3)");
  }
  return Status::ok();
}

}  // namespace

extern "C" {

pdkv_status pdkv_engine_create(const pdkv_config* config, const pdkv_pools* pools,
                               pdkv_engine** out) {
  return c_call(__func__, [&] {
    PDKV_RETURN_IF_ERROR(require(config, "config"));
    PDKV_RETURN_IF_ERROR(require(out, "out"));
    std::unique_ptr<pdkv::Engine> engine;
    if (pools != nullptr) {
      PDKV_ASSIGN_OR_RETURN(auto given, to_pools(*pools));
      PDKV_ASSIGN_OR_RETURN(engine, pdkv::Engine::create(config->config, std::move(given)));
    } else {
      PDKV_ASSIGN_OR_RETURN(engine, pdkv::Engine::create(config->config));
    }
    auto handle = std::make_unique<pdkv_engine>();
    handle->control_address = engine->control_address();
    handle->engine = std::move(engine);
    *out = handle.release();
    return Status::ok();
  });
}

void pdkv_engine_destroy(pdkv_engine* engine) { delete engine; }

pdkv_status pdkv_engine_region_count(const pdkv_engine* engine, pdkv_pool_kind pool,
                                     size_t* count) {
  return c_call(__func__, [&] {
    PDKV_RETURN_IF_ERROR(require(engine, "engine"));
    PDKV_RETURN_IF_ERROR(require(count, "count"));
    PDKV_RETURN_IF_ERROR(check_pool_kind(pool));
    *count = pool_regions(engine->engine->pools(), pool).size();
    return Status::ok();
  });
}

pdkv_status pdkv_engine_region(const pdkv_engine* engine, pdkv_pool_kind pool, size_t index,
                               pdkv_region* out) {
  return c_call(__func__, [&] {
    PDKV_RETURN_IF_ERROR(require(engine, "engine"));
    PDKV_RETURN_IF_ERROR(require(out, "out"));
    PDKV_RETURN_IF_ERROR(check_pool_kind(pool));
    const auto regions = pool_regions(engine->engine->pools(), pool);
    if (index >= regions.size()) {
      return Status::out_of_range("region " + std::to_string(index) + " of a pool of " +
                                  std::to_string(regions.size()));
    }
    *out = to_c(regions[index]);
    return Status::ok();
  });
}

const char* pdkv_engine_control_address(const pdkv_engine* engine) {
  if (engine == nullptr) {
    pdkv::capi::report(Status::invalid_argument("pdkv_engine_control_address: engine is NULL"));
    return nullptr;
  }
  return engine->control_address.c_str();
}

pdkv_status pdkv_engine_stats_get(const pdkv_engine* engine, pdkv_engine_stats* out) {
  return c_call(__func__, [&] {
    PDKV_RETURN_IF_ERROR(require(engine, "engine"));
    PDKV_RETURN_IF_ERROR(require(out, "out"));
    const pdkv::EngineStats s = engine->engine->stats();
    *out =
        pdkv_engine_stats{s.staged_routes, s.direct_routes, s.batches_in_flight, s.rooms,
                          s.peers,         s.loop_tasks,    s.room_steps,        s.engine_threads};
    return Status::ok();
  });
}

pdkv_status pdkv_engine_poll(const pdkv_engine* engine, const uint64_t* rooms, size_t count,
                             int32_t* states) {
  return c_call(__func__, [&] {
    PDKV_RETURN_IF_ERROR(require(engine, "engine"));
    if (count == 0) return Status::ok();
    PDKV_RETURN_IF_ERROR(require(rooms, "rooms"));
    PDKV_RETURN_IF_ERROR(require(states, "states"));
    const auto polled = engine->engine->poll({rooms, count});
    std::transform(polled.begin(), polled.end(), states,
                   [](pdkv::PollState s) { return static_cast<int32_t>(s); });
    return Status::ok();
  });
}

pdkv_status pdkv_engine_take_changed_rooms(pdkv_engine* engine, uint64_t* rooms, size_t capacity,
                                           size_t* count) {
  return c_call(__func__, [&] {
    PDKV_RETURN_IF_ERROR(require(engine, "engine"));
    PDKV_RETURN_IF_ERROR(require(count, "count"));
    if (capacity > 0) PDKV_RETURN_IF_ERROR(require(rooms, "rooms"));
    std::lock_guard lock(engine->changes_mu);
    for (pdkv::RoomId room : engine->engine->take_changed_rooms()) {
      // A room still waiting from an earlier call is listed once.
      if (std::find(engine->untaken_changes.begin(), engine->untaken_changes.end(), room) ==
          engine->untaken_changes.end()) {
        engine->untaken_changes.push_back(room);
      }
    }
    *count = std::min(capacity, engine->untaken_changes.size());
    std::copy_n(engine->untaken_changes.begin(), *count, rooms);
    engine->untaken_changes.erase(engine->untaken_changes.begin(),
                                  engine->untaken_changes.begin() + *count);
    return Status::ok();
  });
}

pdkv_status pdkv_engine_wait_for_changes(pdkv_engine* engine, int64_t timeout_ms,
                                         int32_t* changed) {
  return c_call(__func__, [&] {
    PDKV_RETURN_IF_ERROR(require(engine, "engine"));
    PDKV_RETURN_IF_ERROR(require(changed, "changed"));
    if (timeout_ms < 0) {
      return Status::invalid_argument("timeout_ms " + std::to_string(timeout_ms) + " < 0");
    }
    {
      std::lock_guard lock(engine->changes_mu);
      if (!engine->untaken_changes.empty()) {
        *changed = 1;
        return Status::ok();
      }
    }
    *changed = engine->engine->wait_for_changes(std::chrono::milliseconds(timeout_ms)) ? 1 : 0;
    return Status::ok();
  });
}

pdkv_status pdkv_engine_change_fd(const pdkv_engine* engine, int32_t* fd) {
  return c_call(__func__, [&] {
    PDKV_RETURN_IF_ERROR(require(engine, "engine"));
    PDKV_RETURN_IF_ERROR(require(fd, "fd"));
    *fd = engine->engine->change_fd();
    return Status::ok();
  });
}

}  // extern "C"

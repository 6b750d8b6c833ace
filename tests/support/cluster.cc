#include "support/cluster.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "support/kv_oracle.h"
#include "support/loopback_transport.h"

namespace pdkv::testing {
namespace {

MemoryRegion region(std::vector<std::byte>& bytes) {
  return {bytes.data(), bytes.size(), MemoryKind::kHost, 0};
}

struct RankGeometry {
  UnitRange heads, layers, channels;
};

RankGeometry geometry(const KvSpec& kv, const StateSpec& st, uint32_t tp, uint32_t tp_size,
                      uint32_t pp, uint32_t pp_size) {
  RankGeometry g;
  g.heads = AxisSharding::even(kv.total_heads, tp_size).value().owned(tp).value();
  g.layers = AxisSharding::even(kv.num_layers, pp_size).value().owned(pp).value();
  if (st.channels > 0)
    g.channels = AxisSharding::even(st.channels, tp_size).value().owned(tp).value();
  return g;
}

RankMemory allocate(const KvSpec& kv, const ClusterSpec& c, const RankGeometry& g) {
  RankMemory m;
  const uint64_t bytes = kv.num_pages * kv.page_bytes(g.heads.count);
  m.kv.assign(g.layers.count * kv.buffers_per_layer(), std::vector<std::byte>(bytes));
  for (uint32_t item : c.aux_items) m.aux.emplace_back(uint64_t{c.aux_slots} * item);
  m.state.resize(std::max<uint64_t>(
      1, uint64_t{c.state.num_slots} * g.layers.count * g.channels.count * c.state.channel_bytes));
  return m;
}

// visit(offset, value) for every state byte of `slots`; slot i of a room holds
// the values of (room + i), in [slot][local layer][local channel][byte].
template <typename F>
void for_each_state_byte(const RankGeometry& g, uint64_t cb, const std::vector<uint32_t>& slots,
                         uint64_t room, F&& visit) {
  for (size_t s = 0; s < slots.size(); ++s)
    for (uint32_t l = 0; l < g.layers.count; ++l)
      for (uint32_t ch = 0; ch < g.channels.count; ++ch)
        for (uint64_t b = 0; b < cb; ++b) {
          const uint64_t off =
              ((uint64_t{slots[s]} * g.layers.count + l) * g.channels.count + ch) * cb + b;
          visit(off, Cluster::state_byte(g.layers.first + l, g.channels.first + ch, b, room + s));
        }
}

}  // namespace

EnginePools RankMemory::pools() {
  EnginePools p;
  for (auto& b : kv) p.kv.push_back(region(b));
  for (auto& a : aux) p.aux.push_back(region(a));
  p.state = region(state);
  if (!staging.empty()) p.staging = region(staging);
  return p;
}

uint8_t Cluster::aux_byte(uint64_t room, uint32_t buffer, uint64_t i) {
  return mix_byte((room << 20) ^ (uint64_t{buffer} << 52) ^ i ^ 0xa0a0);
}

uint8_t Cluster::state_byte(uint32_t layer, uint32_t channel, uint64_t byte, uint64_t room) {
  return mix_byte((uint64_t{layer} << 40) ^ (uint64_t{channel} << 20) ^ byte ^ (room << 52) ^
                  0x5757);
}

std::unique_ptr<Cluster> Cluster::start(const ClusterSpec& spec) {
  auto c = std::unique_ptr<Cluster>(new Cluster);
  c->spec_ = spec;
  auto server = BootstrapServer::start("127.0.0.1:0", spec.security, spec.limits);
  EXPECT_TRUE(server.is_ok()) << server.status().to_string();
  if (!server.is_ok()) return nullptr;
  c->bootstrap_ = std::move(server).value();
  for (int side = 0; side < 2; ++side) {
    const bool prefill = side == 0;
    const uint32_t tp_size = prefill ? spec.prefill_tp : spec.decode_tp;
    const uint32_t pp_size = prefill ? spec.prefill_pp : spec.decode_pp;
    KvSpec kv = spec.kv;
    if (!prefill) kv.layout = spec.decode_layout;
    for (uint32_t pp = 0; pp < pp_size; ++pp) {
      for (uint32_t tp = 0; tp < tp_size; ++tp) {
        EngineConfig cfg;
        cfg.role = prefill ? Role::kPrefill : Role::kDecode;
        cfg.engine_id = prefill ? spec.prefill_id : spec.decode_id;
        cfg.tp_rank = tp;
        cfg.tp_size = tp_size;
        cfg.pp_rank = pp;
        cfg.pp_size = pp_size;
        cfg.kv = kv;
        cfg.aux_item_bytes = spec.aux_items;
        cfg.aux_slots = spec.aux_items.empty() ? 0 : spec.aux_slots;
        cfg.state = spec.state;
        cfg.backend = spec.backend;
        cfg.transport_options = prefill ? spec.prefill_transport : spec.decode_transport;
        if (prefill) cfg.faults = spec.prefill_faults;
        cfg.bootstrap_address = c->bootstrap_address();
        cfg.security = spec.security;
        cfg.limits = spec.limits;
        cfg.timeouts = prefill ? spec.timeouts : spec.decode_timeouts.value_or(spec.timeouts);
        auto& memory = prefill ? c->prefill_memory : c->decode_memory;
        memory.push_back(allocate(kv, spec, geometry(kv, spec.state, tp, tp_size, pp, pp_size)));
        cfg.staging = spec.staging;
        if (spec.staging != Staging::kOff) {
          // Generous: a whole pool's worth per destination, for any test here.
          uint64_t bytes = 0;
          for (const auto& b : memory.back().kv) bytes += b.size();
          cfg.staging_bytes = (prefill ? spec.prefill_staging_bytes : spec.decode_staging_bytes)
                                  .value_or(bytes * 8);
          memory.back().staging.resize(cfg.staging_bytes);
        }
        auto engine = Engine::create(cfg, memory.back().pools());
        EXPECT_TRUE(engine.is_ok()) << engine.status().to_string();
        if (!engine.is_ok()) return nullptr;
        (prefill ? c->prefill : c->decode).push_back(std::move(engine).value());
      }
    }
  }
  return c;
}

Cluster::~Cluster() {
  // Engines stop before the memory they registered goes away.
  decode.clear();
  prefill.clear();
}

std::string Cluster::bootstrap_address() const {
  return fmt::format("127.0.0.1:{}", bootstrap_->port());
}

void Cluster::fill(uint64_t room, const std::vector<uint64_t>& pages, uint32_t aux_slot,
                   const std::vector<uint32_t>& state_slots) {
  for (size_t r = 0; r < prefill.size(); ++r) {
    const auto& cfg = prefill[r]->config();
    const auto g = geometry(cfg.kv, cfg.state, cfg.tp_rank, cfg.tp_size, cfg.pp_rank, cfg.pp_size);
    RankMemory& m = prefill_memory[r];
    for_each_element(cfg.kv, g.heads, g.layers, pages, room,
                     [&](uint32_t buf, uint64_t off, uint8_t v) { m.kv[buf][off] = std::byte{v}; });
    // Only the last stage holds the output token: earlier ones hold other
    // bytes, so that aux from the wrong stage is seen.
    const bool last_stage = cfg.pp_rank + 1 == cfg.pp_size;
    for (size_t b = 0; b < spec_.aux_items.size(); ++b) {
      const uint64_t n = spec_.aux_items[b];
      for (uint64_t i = 0; i < n; ++i) {
        m.aux[b][aux_slot * n + i] =
            std::byte{aux_byte(last_stage ? room : room ^ 0xdead, uint32_t(b), i)};
      }
    }
    for_each_state_byte(g, spec_.state.channel_bytes, state_slots, room,
                        [&](uint64_t off, uint8_t v) { m.state[off] = std::byte{v}; });
  }
  for (size_t r = 0; r < decode.size(); ++r) {
    RankMemory& m = decode_memory[r];
    for (size_t b = 0; b < m.kv.size(); ++b)
      for (uint64_t o = 0; o < m.kv[b].size(); ++o)
        m.kv[b][o] = std::byte{untouched_byte(uint32_t(r), uint32_t(b), o)};
    for (size_t b = 0; b < m.aux.size(); ++b)
      for (uint64_t o = 0; o < m.aux[b].size(); ++o)
        m.aux[b][o] = std::byte{untouched_byte(uint32_t(r), 800 + uint32_t(b), o)};
    for (uint64_t o = 0; o < m.state.size(); ++o)
      m.state[o] = std::byte{untouched_byte(uint32_t(r), 901, o)};
  }
}

std::string Cluster::verify_untouched() const {
  loopback_fence();
  for (size_t r = 0; r < decode.size(); ++r) {
    const RankMemory& m = decode_memory[r];
    for (size_t b = 0; b < m.kv.size(); ++b) {
      for (uint64_t o = 0; o < m.kv[b].size(); ++o) {
        const uint8_t want = untouched_byte(uint32_t(r), uint32_t(b), o);
        if (std::to_integer<uint8_t>(m.kv[b][o]) != want) {
          return fmt::format("decode rank {} KV buffer {} byte {}: {} != untouched {}", r, b, o,
                             std::to_integer<int>(m.kv[b][o]), want);
        }
      }
    }
  }
  return "";
}

std::string Cluster::verify_pages(uint64_t room, const std::vector<uint64_t>& pages,
                                  uint32_t aux_slot) const {
  loopback_fence();
  for (size_t r = 0; r < decode.size(); ++r) {
    const auto& cfg = decode[r]->config();
    const auto g = geometry(cfg.kv, cfg.state, cfg.tp_rank, cfg.tp_size, cfg.pp_rank, cfg.pp_size);
    const RankMemory& m = decode_memory[r];
    std::string wrong;
    for_each_element(cfg.kv, g.heads, g.layers, pages, room,
                     [&](uint32_t buf, uint64_t off, uint8_t v) {
                       if (wrong.empty() && std::to_integer<uint8_t>(m.kv[buf][off]) != v) {
                         wrong = fmt::format("decode rank {} KV buffer {} byte {}: {} != {}", r,
                                             buf, off, std::to_integer<int>(m.kv[buf][off]), v);
                       }
                     });
    if (!wrong.empty()) return wrong;
    for (size_t b = 0; b < m.aux.size(); ++b) {
      const uint64_t n = spec_.aux_items[b];
      for (uint64_t i = 0; i < n; ++i) {
        const uint8_t want = aux_byte(room, uint32_t(b), i);
        if (std::to_integer<uint8_t>(m.aux[b][aux_slot * n + i]) != want) {
          return fmt::format("decode rank {} aux buffer {} slot {} byte {}", r, b, aux_slot, i);
        }
      }
    }
  }
  return "";
}

void Cluster::poison(size_t r, const std::vector<uint64_t>& pages, uint64_t room) {
  const auto& cfg = decode[r]->config();
  const auto g = geometry(cfg.kv, cfg.state, cfg.tp_rank, cfg.tp_size, cfg.pp_rank, cfg.pp_size);
  RankMemory& m = decode_memory[r];
  loopback_fence();
  for_each_element(
      cfg.kv, g.heads, g.layers, pages, room, [&](uint32_t buf, uint64_t off, uint8_t) {
        m.kv[buf][off] = std::byte{mix_byte((room << 32) ^ (uint64_t{buf} << 24) ^ off ^ 0x9015)};
      });
}

std::string Cluster::check_poison(size_t r, const std::vector<uint64_t>& pages,
                                  uint64_t room) const {
  const auto& cfg = decode[r]->config();
  const auto g = geometry(cfg.kv, cfg.state, cfg.tp_rank, cfg.tp_size, cfg.pp_rank, cfg.pp_size);
  const RankMemory& m = decode_memory[r];
  loopback_fence();
  std::string landed;
  for_each_element(
      cfg.kv, g.heads, g.layers, pages, room, [&](uint32_t buf, uint64_t off, uint8_t) {
        const uint8_t want = mix_byte((room << 32) ^ (uint64_t{buf} << 24) ^ off ^ 0x9015);
        if (landed.empty() && std::to_integer<uint8_t>(m.kv[buf][off]) != want) {
          landed = fmt::format("decode rank {} KV buffer {} byte {} changed after room {} failed",
                               r, buf, off, room);
        }
      });
  return landed;
}

std::string Cluster::verify(uint64_t room, const std::vector<uint64_t>& pages, uint32_t aux_slot,
                            const std::vector<uint32_t>& state_slots) const {
  loopback_fence();
  for (size_t r = 0; r < decode.size(); ++r) {
    const auto& cfg = decode[r]->config();
    const auto g = geometry(cfg.kv, cfg.state, cfg.tp_rank, cfg.tp_size, cfg.pp_rank, cfg.pp_size);
    const RankMemory& m = decode_memory[r];
    std::vector<std::vector<uint8_t>> expected(m.kv.size());
    for (size_t b = 0; b < m.kv.size(); ++b) {
      expected[b].resize(m.kv[b].size());
      for (uint64_t o = 0; o < expected[b].size(); ++o) {
        expected[b][o] = untouched_byte(uint32_t(r), uint32_t(b), o);
      }
    }
    for_each_element(cfg.kv, g.heads, g.layers, pages, room,
                     [&](uint32_t buf, uint64_t off, uint8_t v) { expected[buf][off] = v; });
    for (size_t b = 0; b < m.kv.size(); ++b) {
      for (uint64_t o = 0; o < expected[b].size(); ++o) {
        if (std::to_integer<uint8_t>(m.kv[b][o]) != expected[b][o]) {
          return fmt::format("decode rank {} (tp {} pp {}) KV buffer {} byte {}: {} != expected {}",
                             r, cfg.tp_rank, cfg.pp_rank, b, o, std::to_integer<int>(m.kv[b][o]),
                             expected[b][o]);
        }
      }
    }
    for (size_t b = 0; b < m.aux.size(); ++b) {
      const uint64_t n = spec_.aux_items[b];
      for (uint64_t o = 0; o < m.aux[b].size(); ++o) {
        const uint8_t want = o / n == aux_slot ? aux_byte(room, uint32_t(b), o % n)
                                               : untouched_byte(uint32_t(r), 800 + uint32_t(b), o);
        if (std::to_integer<uint8_t>(m.aux[b][o]) != want) {
          return fmt::format("decode rank {} aux buffer {} byte {}: {} != expected {}", r, b, o,
                             std::to_integer<int>(m.aux[b][o]), want);
        }
      }
    }
    std::vector<uint8_t> state(m.state.size());
    for (uint64_t o = 0; o < state.size(); ++o) state[o] = untouched_byte(uint32_t(r), 901, o);
    for_each_state_byte(g, spec_.state.channel_bytes, state_slots, room,
                        [&](uint64_t off, uint8_t v) { state[off] = v; });
    for (uint64_t o = 0; o < state.size(); ++o) {
      if (std::to_integer<uint8_t>(m.state[o]) != state[o]) {
        return fmt::format("decode rank {} state byte {}: {} != expected {}", r, o,
                           std::to_integer<int>(m.state[o]), state[o]);
      }
    }
  }
  return "";
}

}  // namespace pdkv::testing

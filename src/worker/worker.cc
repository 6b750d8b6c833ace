#include "worker/worker.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <thread>

#include "engine/pool_memory.h"
#include "gpu/gpu.h"
#include "worker/kv_pattern.h"

namespace pdkv::worker {
namespace {

using Clock = std::chrono::steady_clock;

uint8_t aux_byte(uint64_t room, uint64_t i) { return mix_byte((room << 24) ^ i ^ 0xa5a5); }

// Wall-clock time since the epoch, comparable across the processes of a run.
template <typename Unit>
int64_t since_epoch() {
  return std::chrono::duration_cast<Unit>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}
int64_t epoch_ms() { return since_epoch<std::chrono::milliseconds>(); }
int64_t epoch_us() { return since_epoch<std::chrono::microseconds>(); }

const char* kv_name(uint32_t kv, bool mla) { return mla ? "latent" : (kv == 0 ? "K" : "V"); }

// The KV pools as the simulated model sees them. Host pools are touched in
// place. Device pools (--device) are this worker's own allocations, with a
// host mirror: a room's pages are uploaded after the model writes them and
// downloaded before they are checked.
class KvPools {
 public:
  static Result<KvPools> create(const Shape& shape, const EngineConfig& cfg, uint32_t heads,
                                uint32_t rank) {
    KvPools p;
    p.kind_ = shape.device_kind();
    if (p.kind_ == MemoryKind::kHost) return p;  // the engine allocates them
    PDKV_ASSIGN_OR_RETURN(p.runtime_, gpu::runtime(p.kind_));
    p.device_ = static_cast<int>(rank % static_cast<uint32_t>(p.runtime_->device_count()));
    p.page_bytes_ = cfg.kv.page_bytes(heads);
    const uint64_t bytes = cfg.kv.num_pages * p.page_bytes_;
    for (uint32_t b = 0; b < shape.layers * cfg.kv.buffers_per_layer(); ++b) {
      PDKV_ASSIGN_OR_RETURN(void* memory, p.runtime_->allocate(p.device_, bytes));
      p.regions_.push_back({memory, bytes, p.kind_, p.device_});
      p.mirror_.emplace_back(shape.verify ? bytes : 0);
    }
    p.aux_.resize(std::max<uint64_t>(1, uint64_t{cfg.aux_slots} * cfg.aux_bytes));
    // Page-aligned: the engine pins it for the staging kernels.
    PDKV_ASSIGN_OR_RETURN(engine::HostMapping staging,
                          engine::HostMapping::map(std::max<uint64_t>(1, cfg.staging_bytes)));
    p.staging_.push_back(std::move(staging));
    return p;
  }
  KvPools() = default;
  KvPools(KvPools&&) = default;
  ~KvPools() {
    for (const MemoryRegion& r : regions_) runtime_->release(device_, r.base);
  }

  bool on_device() const { return kind_ != MemoryKind::kHost; }
  // For Engine::create: device KV pools, host aux and staging.
  EnginePools engine_pools() {
    EnginePools p;
    p.kv = regions_;
    p.aux = {aux_.data(), aux_.size(), MemoryKind::kHost, 0};
    p.staging = staging_.front().region();
    return p;
  }
  void bind(const EnginePools& pools) { pools_ = &pools; }

  std::byte& kv(uint32_t buffer, uint64_t offset) {
    return on_device() ? mirror_[buffer][offset]
                       : static_cast<std::byte*>(pools_->kv[buffer].base)[offset];
  }
  std::byte& aux(uint64_t offset) { return static_cast<std::byte*>(pools_->aux.base)[offset]; }

  // Mirror -> device (upload) or device -> mirror, for these pages of every
  // buffer; nothing to do for host pools.
  Status upload(std::span<const uint64_t> pages) { return move_pages(pages, true); }
  Status download(std::span<const uint64_t> pages) { return move_pages(pages, false); }

 private:
  Status move_pages(std::span<const uint64_t> pages, bool up) {
    if (!on_device()) return Status::ok();
    for (size_t b = 0; b < regions_.size(); ++b) {
      auto* device = static_cast<std::byte*>(regions_[b].base);
      for (uint64_t page : pages) {
        const uint64_t at = page * page_bytes_;
        PDKV_RETURN_IF_ERROR(up ? runtime_->copy(device + at, mirror_[b].data() + at, page_bytes_)
                                : runtime_->copy(mirror_[b].data() + at, device + at, page_bytes_));
      }
    }
    return Status::ok();
  }

  MemoryKind kind_ = MemoryKind::kHost;
  gpu::Runtime* runtime_ = nullptr;
  int device_ = 0;
  uint64_t page_bytes_ = 0;
  std::vector<MemoryRegion> regions_;
  std::vector<std::vector<std::byte>> mirror_;
  std::vector<std::byte> aux_;
  std::vector<engine::HostMapping> staging_;  // one, or none for host pools
  const EnginePools* pools_ = nullptr;
};

}  // namespace

Status Shape::validate() const {
  auto positive = [](const char* flag, uint64_t v) {
    return v > 0 ? Status::ok()
                 : Status::invalid_argument(fmt::format("{} is 0; it must be at least 1", flag));
  };
  PDKV_RETURN_IF_ERROR(positive("--requests", requests));
  PDKV_RETURN_IF_ERROR(positive("--tokens", tokens));
  PDKV_RETURN_IF_ERROR(positive("--chunks", chunks));
  PDKV_RETURN_IF_ERROR(positive("--window", window));
  PDKV_RETURN_IF_ERROR(positive("--prefill-tp", prefill_tp));
  PDKV_RETURN_IF_ERROR(positive("--decode-tp", decode_tp));
  if (warmup >= requests) {
    return Status::invalid_argument(
        fmt::format("--warmup {} leaves none of the {} requests to measure", warmup, requests));
  }
  if (chunks > pages_per_request()) {
    return Status::invalid_argument(
        fmt::format("--chunks {} exceeds the {} pages of a request", chunks, pages_per_request()));
  }
  if (staging != "auto" && staging != "off" && staging != "on" && staging != "naive") {
    return Status::invalid_argument(
        fmt::format("--staging '{}' is not on, off, auto or naive", staging));
  }
  const auto kind = parse_memory_kind(device);
  PDKV_RETURN_IF_ERROR(kind.status().with_context("--device"));
  if (*kind != MemoryKind::kHost) {
    PDKV_RETURN_IF_ERROR(
        gpu::runtime_with_device(*kind).status().with_context("--device " + device));
  }
  PDKV_ASSIGN_OR_RETURN(Layout l, parse_layout(layout));
  (void)l;
  PDKV_RETURN_IF_ERROR(kv_spec().validate());
  const uint32_t heads = mla ? 1 : kv_heads;
  PDKV_RETURN_IF_ERROR(AxisSharding::even(heads, prefill_tp, {"KV heads", "prefill TP"}).status());
  PDKV_RETURN_IF_ERROR(AxisSharding::even(heads, decode_tp, {"KV heads", "decode TP"}).status());
  const auto backends = transport_names();
  if (std::find(backends.begin(), backends.end(), backend) == backends.end()) {
    return Status::invalid_argument(fmt::format("no transport backend named '{}' (built: {})",
                                                backend, fmt::join(backends, ", ")));
  }
  PDKV_ASSIGN_OR_RETURN(TransportOptions options, transport_options());
  if (!options.empty()) {
    // The backend alone knows its options: let it judge them now, not in
    // every worker after start-up.
    auto probe = create_transport(backend, options);
    if (!probe.is_ok() && probe.status().code() == StatusCode::kInvalidArgument) {
      return probe.status();
    }
  }
  return Status::ok();
}

Result<TransportOptions> Shape::transport_options() const {
  TransportOptions options;
  for (const std::string& kv : backend_options) {
    const size_t eq = kv.find('=');
    if (eq == 0 || eq == std::string::npos) {
      return Status::invalid_argument(fmt::format("--backend-opt '{}' is not KEY=VALUE", kv));
    }
    options[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  if (rails > 0) options["rails"] = std::to_string(rails);
  if (!provider.empty()) options["provider"] = provider;
  return options;
}

KvSpec Shape::kv_spec() const {
  return KvSpec{mla ? 1 : kv_heads,
                head_dim,
                dtype_bytes,
                page_size,
                layers,
                window * pages_per_request(),
                parse_layout(layout).is_ok() ? parse_layout(layout).value() : Layout::kNhd,
                mla};
}

MemoryKind Shape::device_kind() const {
  const auto kind = parse_memory_kind(device);
  return kind.is_ok() ? *kind : MemoryKind::kHost;
}

std::vector<uint64_t> request_pages(const Shape& shape, Role role, uint64_t room) {
  const uint64_t n = shape.pages_per_request();
  const uint64_t slot = (room - 1) % shape.window;
  std::vector<uint64_t> pages(n);
  std::iota(pages.begin(), pages.end(), slot * n);
  std::shuffle(pages.begin(), pages.end(),
               std::mt19937_64(room * 2 + (role == Role::kDecode ? 1 : 0)));
  return pages;
}

Result<nlohmann::json> run_worker(const WorkerArgs& args,
                                  const std::function<void(uint64_t)>& progress,
                                  const std::function<void(const nlohmann::json&)>& summary) {
  const Shape& shape = args.shape;
  PDKV_RETURN_IF_ERROR(shape.validate());
  const bool prefill = args.role == Role::kPrefill;
  const uint32_t tp_size = prefill ? shape.prefill_tp : shape.decode_tp;
  if (args.tp_rank >= tp_size) {
    return Status::invalid_argument(fmt::format("--tp-rank {} is outside {} TP {}", args.tp_rank,
                                                prefill ? "prefill" : "decode", tp_size));
  }
  EngineConfig cfg;
  cfg.role = args.role;
  cfg.engine_id = prefill ? shape.prefill_engine : shape.decode_engine;
  cfg.tp_rank = args.tp_rank;
  cfg.tp_size = tp_size;
  cfg.kv = shape.kv_spec();
  cfg.aux_bytes = shape.aux_bytes;
  cfg.aux_slots = shape.aux_bytes > 0 ? shape.window : 0;
  cfg.backend = shape.backend;
  PDKV_ASSIGN_OR_RETURN(cfg.transport_options, shape.transport_options());
  cfg.bootstrap_address = args.bootstrap;
  cfg.staging = shape.staging == "on"      ? Staging::kOn
                : shape.staging == "off"   ? Staging::kOff
                : shape.staging == "naive" ? Staging::kNaive
                                           : Staging::kAuto;
  PDKV_ASSIGN_OR_RETURN(auto heads_axis,
                        AxisSharding::even(cfg.kv.total_heads, tp_size,
                                           {"KV heads", prefill ? "prefill TP" : "decode TP"}));
  const UnitRange heads = heads_axis.owned(args.tp_rank).value();
  const UnitRange layers{0, shape.layers};

  // Device pools travel through staging unless the transport registers
  // them (then the engine ignores the staging pool), so they get one.
  if ((cfg.staging != Staging::kOff && cfg.staging != Staging::kNaive) ||
      shape.device_kind() != MemoryKind::kHost) {
    // Room for a window of requests: a decode rank stages at most its own
    // share of a request; a prefill rank gathers its share once per
    // destination (up to D/P of them, more under GQA replication).
    const uint64_t share = uint64_t{shape.layers} * cfg.kv.buffers_per_layer() *
                           shape.pages_per_request() * cfg.kv.page_bytes(heads.count);
    const uint64_t fan_out =
        prefill ? std::max<uint64_t>(1, (shape.decode_tp + shape.prefill_tp - 1) / shape.prefill_tp)
                : 1;
    cfg.staging_bytes = shape.window * share * fan_out;
  }
  // Host pools: the engine allocates them, in the memory its transport moves
  // fastest, as a server that lets it choose would. Device pools are ours.
  PDKV_ASSIGN_OR_RETURN(KvPools pools, KvPools::create(shape, cfg, heads.count, args.tp_rank));
  PDKV_ASSIGN_OR_RETURN(auto engine, pools.on_device() ? Engine::create(cfg, pools.engine_pools())
                                                       : Engine::create(cfg));
  pools.bind(engine->pools());

  struct InFlight {
    std::unique_ptr<Sender> sender;
    std::unique_ptr<Receiver> receiver;
    Clock::time_point start;
  };
  std::map<uint64_t, InFlight> in_flight;  // by room
  nlohmann::json errors = nlohmann::json::array();
  std::vector<uint64_t> failed_rooms;
  std::vector<double> latencies;
  nlohmann::json events = nlohmann::json::array();  // [room, epoch µs]
  uint64_t next = 1, done = 0, succeeded = 0, bytes = 0;
  bool verified = true;
  const int64_t start_ms = epoch_ms();
  auto fail = [&](uint64_t room, const std::string& why) {
    failed_rooms.push_back(room);
    if (errors.size() < 8) errors.push_back(fmt::format("room {}: {}", room, why));
  };
  // Checks every byte of a finished room on this decode rank; "" when right.
  auto verify = [&](uint64_t room) -> std::string {
    const auto pages = request_pages(shape, args.role, room);
    if (const Status down = pools.download(pages); !down.is_ok()) return down.message();
    std::string mismatch;
    for_each_element(
        cfg.kv, heads, layers, pages, room, [&](uint32_t buf, uint64_t off, uint8_t want) {
          if (!mismatch.empty()) return;
          const uint8_t got = std::to_integer<uint8_t>(pools.kv(buf, off));
          if (got == want) return;
          // Name the element: invert the layout formula for this offset.
          const uint64_t hb = cfg.kv.head_bytes(), page_bytes = cfg.kv.page_bytes(heads.count);
          const uint64_t page = off / page_bytes, in_page = off % page_bytes;
          const uint64_t index = std::find(pages.begin(), pages.end(), page) - pages.begin();
          uint64_t slot, head;
          if (cfg.kv.mla || cfg.kv.layout == Layout::kNhd) {
            slot = in_page / (heads.count * hb);
            head = (in_page / hb) % heads.count;
          } else {
            head = in_page / (cfg.kv.page_size * hb);
            slot = (in_page / hb) % cfg.kv.page_size;
          }
          mismatch =
              fmt::format("layer {} {} head {} token {} byte {}: got {:#04x}, expected {:#04x}",
                          buf / cfg.kv.buffers_per_layer(),
                          kv_name(buf % cfg.kv.buffers_per_layer(), cfg.kv.mla), heads.first + head,
                          index * cfg.kv.page_size + slot, in_page % hb, got, want);
        });
    const uint64_t slot = (room - 1) % shape.window;
    for (uint64_t i = 0; i < shape.aux_bytes && mismatch.empty(); ++i) {
      const uint8_t got = std::to_integer<uint8_t>(pools.aux(slot * shape.aux_bytes + i));
      if (got != aux_byte(room, i)) {
        mismatch =
            fmt::format("aux byte {}: got {:#04x}, expected {:#04x}", i, got, aux_byte(room, i));
      }
    }
    return mismatch;
  };
  auto start_room = [&](uint64_t room) -> Status {
    const auto pages = request_pages(shape, args.role, room);
    const uint64_t slot = (room - 1) % shape.window;
    InFlight f;
    f.start = Clock::now();
    if (prefill) {
      if (shape.verify) {
        for_each_element(
            cfg.kv, heads, layers, pages, room,
            [&](uint32_t buf, uint64_t off, uint8_t v) { pools.kv(buf, off) = std::byte{v}; });
        PDKV_RETURN_IF_ERROR(pools.upload(pages));
      }
      for (uint64_t i = 0; i < shape.aux_bytes; ++i) {
        pools.aux(slot * shape.aux_bytes + i) = std::byte{aux_byte(room, i)};
      }
      PDKV_ASSIGN_OR_RETURN(f.sender, engine->sender(room, shape.decode_engine));
      PDKV_RETURN_IF_ERROR(f.sender->init(pages.size(), static_cast<uint32_t>(slot)));
      uint64_t sent = 0;
      for (uint32_t c = 1; c <= shape.chunks; ++c) {
        const uint64_t upto = pages.size() * c / shape.chunks;
        PDKV_RETURN_IF_ERROR(
            f.sender->send(std::span(pages).subspan(sent, upto - sent), c == shape.chunks));
        sent = upto;
      }
      events.push_back({room, epoch_us()});
    } else {
      PDKV_ASSIGN_OR_RETURN(f.receiver, engine->receiver(room, shape.prefill_engine));
      PDKV_RETURN_IF_ERROR(f.receiver->init());
      PDKV_RETURN_IF_ERROR(f.receiver->send_metadata(pages, static_cast<uint32_t>(slot)));
    }
    in_flight.emplace(room, std::move(f));
    return Status::ok();
  };

  while (done < shape.requests) {
    // A slot is reused only after its previous request ended on this rank.
    while (next <= shape.requests && in_flight.size() < shape.window &&
           (next <= shape.window || !in_flight.count(next - shape.window))) {
      const Status started = start_room(next);
      if (!started.is_ok()) {
        fail(next, started.message());
        ++done;
        progress(done);
      }
      ++next;
    }
    for (auto it = in_flight.begin(); it != in_flight.end();) {
      const uint64_t room = it->first;
      const PollState state = prefill ? it->second.sender->poll() : it->second.receiver->poll();
      if (state != PollState::kSuccess && state != PollState::kFailed) {
        ++it;
        continue;
      }
      if (state == PollState::kFailed) {
        fail(room,
             (prefill ? it->second.sender->failure() : it->second.receiver->failure()).message());
      } else if (!prefill) {
        events.push_back({room, epoch_us()});
        latencies.push_back(
            std::chrono::duration<double, std::milli>(Clock::now() - it->second.start).count());
        const std::string mismatch = shape.verify ? verify(room) : std::string();
        if (mismatch.empty()) {
          ++succeeded;
          bytes += uint64_t{shape.layers} * cfg.kv.buffers_per_layer() * shape.pages_per_request() *
                   cfg.kv.page_bytes(heads.count);
        } else {
          verified = false;
          fail(room, mismatch);
        }
      } else {
        ++succeeded;
      }
      it = in_flight.erase(it);
      ++done;
      progress(done);
    }
    // The API is poll-based; between polls, yield the core.
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  nlohmann::ordered_json out;
  out["role"] = prefill ? "prefill" : "decode";
  out["rank"] = args.tp_rank;
  out["requests"] = shape.requests;
  out["succeeded"] = succeeded;
  out["failed"] = shape.requests - succeeded;
  out["verified"] = shape.verify && verified && succeeded == shape.requests;
  out["bytes"] = bytes;
  out["start_ms"] = start_ms;
  out["end_ms"] = epoch_ms();
  out["latencies_ms"] = latencies;
  out["events_us"] = events;
  out["verify"] = shape.verify;
  out["failed_rooms"] = failed_rooms;
  out["staged_routes"] = engine->stats().staged_routes;
  out["direct_routes"] = engine->stats().direct_routes;
  out["errors"] = errors;
  // Reported before the engine shuts down: the outcome is known now.
  summary(nlohmann::json(out));
  return nlohmann::json(out);
}

}  // namespace pdkv::worker

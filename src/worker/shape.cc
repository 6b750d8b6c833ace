// A run's shape (worker.h): the flags every process of one run shares,
// checked and turned into the engine's settings.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "gpu/gpu.h"
#include "worker/worker.h"

namespace pdkv::worker {
namespace {
constexpr uint32_t kMaxDecodeEngines = 256;
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
  PDKV_RETURN_IF_ERROR(positive("--decode-engines", decode_engines));
  if (decode_engines > kMaxDecodeEngines) {
    return Status::invalid_argument(
        fmt::format("--decode-engines {} is more than {}", decode_engines, kMaxDecodeEngines));
  }
  for (uint32_t i = 0; i < decode_engines; ++i) {
    if (prefill_engine.empty() || decode_engine.empty() || prefill_engine == decode_engine_id(i)) {
      return Status::invalid_argument(
          fmt::format("engine ids '{}' (prefill) and '{}' (decode) must be distinct and not empty",
                      prefill_engine, decode_engine_id(i)));
    }
  }
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
  PDKV_RETURN_IF_ERROR(fault_spec().status());
  PDKV_RETURN_IF_ERROR(timeouts().status());
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

std::string Shape::decode_engine_id(uint32_t index) const {
  return decode_engines == 1 ? decode_engine : fmt::format("{}-{}", decode_engine, index);
}

RoomShare Shape::decode_share(uint32_t index) const { return RoomShare{index + 1, decode_engines}; }

Result<uint32_t> Shape::decode_engine_index(const std::string& id) const {
  for (uint32_t i = 0; i < decode_engines; ++i) {
    if (decode_engine_id(i) == id) return i;
  }
  return Status::invalid_argument(
      fmt::format("--engine-id '{}' is no decode engine of this run (--decode-engines {}: {}{})",
                  id, decode_engines, decode_engine_id(0),
                  decode_engines > 1 ? " ... " + decode_engine_id(decode_engines - 1) : ""));
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

Result<uint64_t> Shape::staging_bytes(Role role, uint32_t tp_rank) const {
  const KvSpec kv = kv_spec();
  PDKV_ASSIGN_OR_RETURN(const auto prefill_axis,
                        AxisSharding::even(kv.total_heads, prefill_tp, {"KV heads", "prefill TP"}));
  PDKV_ASSIGN_OR_RETURN(const auto decode_axis,
                        AxisSharding::even(kv.total_heads, decode_tp, {"KV heads", "decode TP"}));
  uint32_t heads = 0;
  if (role == Role::kDecode) {
    PDKV_ASSIGN_OR_RETURN(const UnitRange own, decode_axis.owned(tp_rank));
    heads = own.count;
  } else {
    // Sizing by D/P destinations of the rank's whole share instead asked
    // 20 GiB of a 24 GiB machine for 32k tokens at 2 -> 4.
    PDKV_ASSIGN_OR_RETURN(const auto map, transfer_map(prefill_axis, decode_axis));
    for (const Segment& s : segments_from(map, tp_rank)) heads += s.count;
  }
  return uint64_t{window} * layers * kv.buffers_per_layer() * pages_per_request() *
         kv.page_bytes(heads);
}

MemoryKind Shape::device_kind() const {
  const auto kind = parse_memory_kind(device);
  return kind.is_ok() ? *kind : MemoryKind::kHost;
}

std::vector<uint64_t> request_pages(const Shape& shape, Role role, uint64_t room, uint64_t slot) {
  const uint64_t n = shape.pages_per_request();
  std::vector<uint64_t> pages(n);
  std::iota(pages.begin(), pages.end(), slot * n);
  std::shuffle(pages.begin(), pages.end(),
               std::mt19937_64(room * 2 + (role == Role::kDecode ? 1 : 0)));
  return pages;
}

Result<FaultSpec> Shape::fault_spec() const { return parse_faults(faults); }

Result<Timeouts> Shape::timeouts() const {
  Timeouts t;
  for (const std::string& kv : engine_timeouts) {
    const size_t eq = kv.find('=');
    const std::string key = kv.substr(0, eq == std::string::npos ? kv.size() : eq);
    std::chrono::milliseconds* field = key == "bootstrap"   ? &t.bootstrap
                                       : key == "data"      ? &t.waiting_for_data
                                       : key == "transfer"  ? &t.transfer
                                       : key == "keepalive" ? &t.keepalive
                                       : key == "connect"   ? &t.connect
                                                            : nullptr;
    if (eq == std::string::npos || field == nullptr) {
      return Status::invalid_argument(fmt::format(
          "--engine-timeout '{}' is not KEY=MS with KEY one of bootstrap, data, transfer, "
          "keepalive, connect",
          kv));
    }
    PDKV_ASSIGN_OR_RETURN(const uint64_t ms, parse_option_number("--engine-timeout", key,
                                                                 kv.substr(eq + 1), 1, 3'600'000));
    *field = std::chrono::milliseconds(ms);
  }
  return t;
}

}  // namespace pdkv::worker

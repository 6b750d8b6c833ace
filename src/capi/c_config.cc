// pdkv_config: EngineConfig from KEY=VALUE settings. One table names every
// key and how its value is read; an unknown key or a bad value is refused
// naming both, and leaves the configuration as it was.
#include <fmt/format.h>

#include <charconv>
#include <functional>
#include <limits>
#include <map>
#include <string_view>

#include "capi/c_handles.h"

namespace pdkv::capi {
namespace {

using Setter = std::function<Status(EngineConfig&, const std::string& value)>;

Status bad_value(const std::string& key, const std::string& value, std::string_view expected) {
  return Status::invalid_argument(fmt::format("'{}' for {}: expected {}", value, key, expected));
}

template <typename Int>
Result<Int> parse_int(const std::string& key, const std::string& value) {
  Int parsed{};
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), parsed);
  if (value.empty() || error != std::errc() || end != value.data() + value.size()) {
    return bad_value(key, value,
                     fmt::format("an integer in [{}, {}]", std::numeric_limits<Int>::min(),
                                 std::numeric_limits<Int>::max()));
  }
  return parsed;
}

// "a,b,c" -> {"a", "b", "c"}; "" -> {}.
std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = std::min(text.find(separator, start), text.size());
    parts.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

// A setter for an integer reached through `at` (a field of the config or of one of its parts).
template <typename Int, typename At>
Setter integer_at(const std::string& key, At at) {
  return [key, at](EngineConfig& c, const std::string& v) -> Status {
    PDKV_ASSIGN_OR_RETURN(Int parsed, parse_int<Int>(key, v));
    at(c) = parsed;
    return Status::ok();
  };
}

template <typename Choice>
Setter choice(const std::string& key, std::map<std::string, Choice> choices,
              std::function<Choice&(EngineConfig&)> at) {
  return [key, choices, at](EngineConfig& c, const std::string& v) -> Status {
    const auto it = choices.find(v);
    if (it == choices.end()) {
      std::vector<std::string> names;
      for (const auto& [name, ignored] : choices) names.push_back(name);
      return bad_value(key, v, fmt::format("one of {}", fmt::join(names, "|")));
    }
    at(c) = it->second;
    return Status::ok();
  };
}

Setter text(std::function<std::string&(EngineConfig&)> at) {
  return [at](EngineConfig& c, const std::string& v) -> Status {
    at(c) = v;
    return Status::ok();
  };
}

Setter milliseconds(const std::string& key,
                    std::function<std::chrono::milliseconds&(EngineConfig&)> at) {
  return [key, at](EngineConfig& c, const std::string& v) -> Status {
    PDKV_ASSIGN_OR_RETURN(int64_t ms, parse_int<int64_t>(key, v));
    if (ms <= 0) return bad_value(key, v, "a positive number of milliseconds");
    at(c) = std::chrono::milliseconds(ms);
    return Status::ok();
  };
}

Status set_layers(EngineConfig& c, const std::string& v) {
  const auto parts = split(v, ':');
  if (parts.size() != 2) return bad_value("layers", v, "BEGIN:END");
  PDKV_ASSIGN_OR_RETURN(uint32_t begin, parse_int<uint32_t>("layers", parts[0]));
  PDKV_ASSIGN_OR_RETURN(uint32_t end, parse_int<uint32_t>("layers", parts[1]));
  if (end <= begin) return bad_value("layers", v, "BEGIN:END with BEGIN < END");
  c.layers = UnitRange{begin, end - begin};
  return Status::ok();
}

Status set_aux_item_bytes(EngineConfig& c, const std::string& v) {
  std::vector<uint32_t> sizes;
  for (const std::string& part : split(v, ',')) {
    PDKV_ASSIGN_OR_RETURN(uint32_t bytes, parse_int<uint32_t>("aux_item_bytes", part));
    if (bytes == 0) return bad_value("aux_item_bytes", v, "positive sizes, B,B,...");
    sizes.push_back(bytes);
  }
  c.aux_item_bytes = std::move(sizes);
  return Status::ok();
}

Status set_transport_options(EngineConfig& c, const std::string& v) {
  TransportOptions options;
  for (const std::string& pair : split(v, ',')) {
    const size_t eq = pair.find('=');
    if (eq == 0 || eq == std::string::npos) {
      return bad_value("transport_options", v, fmt::format("KEY=VALUE pairs ('{}' is not)", pair));
    }
    options[pair.substr(0, eq)] = pair.substr(eq + 1);
  }
  c.transport_options = std::move(options);
  return Status::ok();
}

Status set_faults(EngineConfig& c, const std::string& v) {
  PDKV_ASSIGN_OR_RETURN(c.faults, parse_faults(split(v, ',')));
  return Status::ok();
}

// A setter that reads the file a value names into a field of the config's Security.
Setter file_into(Result<std::string> (*read)(const std::string&), std::string Security::*field) {
  return [read, field](EngineConfig& c, const std::string& v) -> Status {
    PDKV_ASSIGN_OR_RETURN(c.security.*field, read(v));
    return Status::ok();
  };
}

Status set_mla(EngineConfig& c, const std::string& v) {
  if (v != "0" && v != "1") return bad_value("mla", v, "0 or 1");
  c.kv.mla = v == "1";
  return Status::ok();
}

// PDKV_FIELD("key", type, field): the key's integer setter for config.field.
#define PDKV_FIELD(key, type, path)                                             \
  {                                                                             \
    key, integer_at<type>(key, [](EngineConfig& c) -> type& { return c.path; }) \
  }

const std::map<std::string, Setter>& setters() {
  static const std::map<std::string, Setter> table = {
      {"role", choice<Role>("role", {{"prefill", Role::kPrefill}, {"decode", Role::kDecode}},
                            [](EngineConfig& c) -> Role& { return c.role; })},
      {"engine_id", text([](EngineConfig& c) -> std::string& { return c.engine_id; })},
      PDKV_FIELD("dp_rank", uint32_t, dp_rank),
      PDKV_FIELD("dp_size", uint32_t, dp_size),
      PDKV_FIELD("tp_rank", uint32_t, tp_rank),
      PDKV_FIELD("tp_size", uint32_t, tp_size),
      PDKV_FIELD("pp_rank", uint32_t, pp_rank),
      PDKV_FIELD("pp_size", uint32_t, pp_size),
      {"layers", set_layers},
      PDKV_FIELD("kv_heads", uint32_t, kv.total_heads),
      PDKV_FIELD("head_dim", uint32_t, kv.head_dim),
      PDKV_FIELD("dtype_bytes", uint32_t, kv.dtype_bytes),
      PDKV_FIELD("page_size", uint32_t, kv.page_size),
      PDKV_FIELD("num_layers", uint32_t, kv.num_layers),
      PDKV_FIELD("num_pages", uint64_t, kv.num_pages),
      {"layout", choice<Layout>("layout", {{"nhd", Layout::kNhd}, {"hnd", Layout::kHnd}},
                                [](EngineConfig& c) -> Layout& { return c.kv.layout; })},
      {"mla", set_mla},
      {"aux_item_bytes", set_aux_item_bytes},
      PDKV_FIELD("aux_slots", uint32_t, aux_slots),
      PDKV_FIELD("state_channels", uint32_t, state.channels),
      PDKV_FIELD("state_channel_bytes", uint32_t, state.channel_bytes),
      PDKV_FIELD("state_slots", uint32_t, state.num_slots),
      {"staging", choice<Staging>("staging",
                                  {{"off", Staging::kOff},
                                   {"on", Staging::kOn},
                                   {"auto", Staging::kAuto},
                                   {"naive", Staging::kNaive}},
                                  [](EngineConfig& c) -> Staging& { return c.staging; })},
      PDKV_FIELD("staging_bytes", uint64_t, staging_bytes),
      {"backend", text([](EngineConfig& c) -> std::string& { return c.backend; })},
      {"transport_options", set_transport_options},
      {"bootstrap_address",
       text([](EngineConfig& c) -> std::string& { return c.bootstrap_address; })},
      {"control_host", text([](EngineConfig& c) -> std::string& { return c.control_host; })},
      {"timeout_bootstrap_ms",
       milliseconds(
           "timeout_bootstrap_ms", [](EngineConfig & c) -> auto& { return c.timeouts.bootstrap; })},
      {"timeout_waiting_for_data_ms",
       milliseconds(
           "timeout_waiting_for_data_ms",
           [](EngineConfig & c) -> auto& { return c.timeouts.waiting_for_data; })},
      {"timeout_transfer_ms",
       milliseconds(
           "timeout_transfer_ms", [](EngineConfig & c) -> auto& { return c.timeouts.transfer; })},
      {"timeout_keepalive_ms",
       milliseconds(
           "timeout_keepalive_ms", [](EngineConfig & c) -> auto& { return c.timeouts.keepalive; })},
      {"timeout_connect_ms",
       milliseconds(
           "timeout_connect_ms", [](EngineConfig & c) -> auto& { return c.timeouts.connect; })},
      {"faults", set_faults},
      {"secret_file", file_into(read_secret_file, &Security::secret)},
      {"tls_cert", file_into(read_pem_file, &Security::tls_cert)},
      {"tls_key", file_into(read_pem_file, &Security::tls_key)},
      {"tls_ca", file_into(read_pem_file, &Security::tls_ca)},
  };
  return table;
}

#undef PDKV_FIELD

}  // namespace

Status set_config_key(EngineConfig& config, const std::string& key, const std::string& value) {
  const auto& table = setters();
  const auto it = table.find(key);
  if (it == table.end()) {
    std::vector<std::string> keys;
    for (const auto& [name, ignored] : table) keys.push_back(name);
    return Status::invalid_argument(
        fmt::format("unknown key '{}' (known: {})", key, fmt::join(keys, ", ")));
  }
  // Parse into a copy, so that a refused value leaves the configuration whole.
  EngineConfig updated = config;
  PDKV_RETURN_IF_ERROR(it->second(updated, value));
  config = std::move(updated);
  return Status::ok();
}

}  // namespace pdkv::capi

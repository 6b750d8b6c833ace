// The C ABI's library-wide calls: errors, names, versions, transports, the
// configuration handle and the bootstrap service.
#include <spdlog/cfg/env.h>

#include "capi/c_handles.h"

#ifndef PDKV_VERSION_STRING
#error "PDKV_VERSION_STRING is set by the build (project version)"
#endif

namespace pdkv::capi {
namespace {
thread_local std::string last_error;

// A server that loads the library sets pdkv's log levels as the pdkv tool's
// users do: SPDLOG_LEVEL=warn, or per component (SPDLOG_LEVEL=engine=debug).
[[maybe_unused]] const bool log_levels_from_env = (spdlog::cfg::load_env_levels(), true);
}  // namespace

pdkv_status report(const Status& status) {
  if (!status.is_ok()) last_error = status.message();
  return static_cast<pdkv_status>(status.code());
}

Status require(const void* pointer, const char* name) {
  if (pointer == nullptr) return Status::invalid_argument(std::string(name) + " is NULL");
  return Status::ok();
}

}  // namespace pdkv::capi

using pdkv::Status;
using pdkv::capi::c_call;
using pdkv::capi::require;

// The numbers of the C codes are those of StatusCode and PollState: held here.
static_assert(PDKV_INTERNAL == static_cast<int>(pdkv::StatusCode::kInternal));
static_assert(PDKV_RESOURCE_EXHAUSTED == static_cast<int>(pdkv::StatusCode::kResourceExhausted));
static_assert(PDKV_ABORTED == static_cast<int>(pdkv::StatusCode::kAborted));
static_assert(PDKV_POLL_SUCCESS == static_cast<int>(pdkv::PollState::kSuccess));
static_assert(PDKV_POLL_FAILED == static_cast<int>(pdkv::PollState::kFailed));
static_assert(PDKV_MEMORY_HIP == static_cast<int>(pdkv::MemoryKind::kHip));

extern "C" {

const char* pdkv_version(void) { return PDKV_VERSION_STRING; }
int pdkv_abi_version(void) { return PDKV_ABI_VERSION; }

const char* pdkv_status_name(pdkv_status status) {
  if (status < PDKV_OK || status > PDKV_INTERNAL) return "unknown";
  return pdkv::status_code_name(static_cast<pdkv::StatusCode>(status));
}

const char* pdkv_poll_state_name(pdkv_poll_state state) {
  if (state < PDKV_POLL_FAILED || state > PDKV_POLL_SUCCESS) return "unknown";
  return pdkv::poll_state_name(static_cast<pdkv::PollState>(state));
}

const char* pdkv_last_error(void) { return pdkv::capi::last_error.c_str(); }

// Transports register at load time and never change: their names are kept
// once, for the caller's pointers.
static const std::vector<std::string>& transports() {
  static const std::vector<std::string> names = pdkv::transport_names();
  return names;
}

size_t pdkv_transport_count(void) { return transports().size(); }

const char* pdkv_transport_name(size_t index) {
  return index < transports().size() ? transports()[index].c_str() : nullptr;
}

pdkv_status pdkv_config_create(pdkv_config** out) {
  return c_call(__func__, [&] {
    PDKV_RETURN_IF_ERROR(require(out, "out"));
    *out = new pdkv_config();
    return Status::ok();
  });
}

void pdkv_config_destroy(pdkv_config* config) { delete config; }

pdkv_status pdkv_config_set(pdkv_config* config, const char* key, const char* value) {
  return c_call(__func__, [&] {
    PDKV_RETURN_IF_ERROR(require(config, "config"));
    PDKV_RETURN_IF_ERROR(require(key, "key"));
    PDKV_RETURN_IF_ERROR(require(value, "value"));
    return pdkv::capi::set_config_key(config->config, key, value);
  });
}

namespace {

// Both ways of starting the service: plain, or as a configuration's security says.
Status start_bootstrap(const char* address, const pdkv::Security& security,
                       const pdkv::Limits& limits, pdkv_bootstrap_server** out) {
  PDKV_RETURN_IF_ERROR(require(address, "address"));
  PDKV_RETURN_IF_ERROR(require(out, "out"));
  PDKV_ASSIGN_OR_RETURN(auto server, pdkv::BootstrapServer::start(address, security, limits));
  *out = new pdkv_bootstrap_server{std::move(server)};
  return Status::ok();
}

}  // namespace

pdkv_status pdkv_bootstrap_server_start(const char* address, pdkv_bootstrap_server** out) {
  return c_call(__func__, [&] { return start_bootstrap(address, {}, {}, out); });
}

pdkv_status pdkv_bootstrap_server_start_secured(const char* address, const pdkv_config* config,
                                                pdkv_bootstrap_server** out) {
  return c_call(__func__, [&] {
    PDKV_RETURN_IF_ERROR(require(address, "address"));  // named first, as before
    PDKV_RETURN_IF_ERROR(require(config, "config"));
    return start_bootstrap(address, config->config.security, config->config.limits, out);
  });
}

pdkv_status pdkv_bootstrap_server_port(const pdkv_bootstrap_server* server, int32_t* port) {
  return c_call(__func__, [&] {
    PDKV_RETURN_IF_ERROR(require(server, "server"));
    PDKV_RETURN_IF_ERROR(require(port, "port"));
    *port = server->server->port();
    return Status::ok();
  });
}

pdkv_status pdkv_bootstrap_server_wait(pdkv_bootstrap_server* server) {
  return c_call(__func__, [&] {
    PDKV_RETURN_IF_ERROR(require(server, "server"));
    server->server->wait();
    return Status::ok();
  });
}

pdkv_status pdkv_bootstrap_server_shutdown(pdkv_bootstrap_server* server) {
  return c_call(__func__, [&] {
    PDKV_RETURN_IF_ERROR(require(server, "server"));
    server->server->shutdown();
    return Status::ok();
  });
}

void pdkv_bootstrap_server_destroy(pdkv_bootstrap_server* server) { delete server; }

}  // extern "C"

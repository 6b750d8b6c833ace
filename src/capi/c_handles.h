// The C ABI's handles and its one error convention (pdkv/pdkv.h).
//
// Each opaque C handle is a struct around the C++ object it stands for. Every
// exported function runs its body through c_call(): a non-ok Status becomes
// the returned code and this thread's last error; an exception becomes
// PDKV_INTERNAL, so that none crosses the C boundary.
#pragma once

#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "pdkv/bootstrap.h"
#include "pdkv/engine.h"
#include "pdkv/pdkv.h"

struct pdkv_config {
  pdkv::EngineConfig config;
};

struct pdkv_engine {
  std::unique_ptr<pdkv::Engine> engine;
  std::string control_address;
  // Changed rooms taken from the engine but not yet handed to the caller
  // (its array was full): the next pdkv_engine_take_changed_rooms gives them first.
  std::mutex changes_mu;
  std::deque<pdkv::RoomId> untaken_changes;
};

// A room's handle, either role: the calls both roles have are written once
// (c_rooms.cc) over `room`.
struct pdkv_sender {
  std::unique_ptr<pdkv::Sender> room;
};

struct pdkv_receiver {
  std::unique_ptr<pdkv::Receiver> room;
};

struct pdkv_bootstrap_server {
  std::unique_ptr<pdkv::BootstrapServer> server;
};

namespace pdkv::capi {

// Records `status` as this thread's last error (when not ok) and returns its code.
pdkv_status report(const Status& status);

// Refuses a NULL pointer argument, naming it.
Status require(const void* pointer, const char* name);

// Runs `body` (returning Status) with exceptions turned into PDKV_INTERNAL;
// a failure's message is prefixed with `context` (the function's name), or
// left as it is with nullptr.
template <typename Body>
pdkv_status c_call(const char* context, Body&& body) noexcept {
  const auto in_context = [context](const Status& s) {
    return context != nullptr ? s.with_context(context) : s;
  };
  try {
    return report(in_context(body()));
  } catch (const std::exception& e) {
    return report(in_context(Status::internal(e.what())));
  } catch (...) {
    return report(in_context(Status::internal("unknown exception")));
  }
}

// Parses one configuration setting into `config` (c_config.cc).
Status set_config_key(EngineConfig& config, const std::string& key, const std::string& value);

}  // namespace pdkv::capi

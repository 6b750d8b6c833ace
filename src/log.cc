#include "log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <map>
#include <mutex>

namespace pdkv {

// The loggers are kept here as well as in spdlog's registry, and this map
// is never destroyed: an engine's threads may still log while the process
// exits (exit() with an engine alive), after spdlog's registry, a static,
// has gone. A logger found here touches no registry. One made for the
// first time goes through the registry, which gives it its level from
// load_env_levels() (SPDLOG_LEVEL, per logger name or for all).
std::shared_ptr<spdlog::logger> logger(const std::string& component) {
  static auto* mu = new std::mutex;
  static auto* made = new std::map<std::string, std::shared_ptr<spdlog::logger>, std::less<>>;
  std::lock_guard lock(*mu);
  if (auto it = made->find(component); it != made->end()) return it->second;
  auto created = spdlog::get(component);
  if (!created) {
    created = spdlog::stderr_color_mt(component);
    created->set_pattern("[%H:%M:%S.%e] [%n] [%l] %v");
  }
  made->emplace(component, created);
  return created;
}

}  // namespace pdkv

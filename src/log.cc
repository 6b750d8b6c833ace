#include "log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <mutex>

namespace pdkv {

std::shared_ptr<spdlog::logger> logger(const std::string& component) {
  static std::mutex mu;
  std::lock_guard lock(mu);
  if (auto existing = spdlog::get(component)) return existing;
  auto created = spdlog::stderr_color_mt(component);
  // Loggers made after load_env_levels() take its level too.
  created->set_level(spdlog::get_level());
  created->set_pattern("[%H:%M:%S.%e] [%n] [%l] %v");
  return created;
}

}  // namespace pdkv

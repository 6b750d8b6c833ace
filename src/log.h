// One spdlog logger per component ("bootstrap", "engine", ...), all on stderr,
// created on first use and kept to the end of the process, past spdlog's
// registry (log.cc).
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <string>

namespace pdkv {

std::shared_ptr<spdlog::logger> logger(const std::string& component);

}  // namespace pdkv

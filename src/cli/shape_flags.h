// The flags every process of a run shares (DESIGN §6), registered once for
// `pdkv prefill`, `pdkv decode` and `pdkv run`.
#pragma once

#include <CLI/CLI.hpp>

#include "worker/worker.h"

namespace pdkv::cli {

void add_shape_flags(CLI::App& cmd, worker::Shape& shape);
// The same flags as arguments, to start a worker with the router's shape.
std::vector<std::string> shape_arguments(const worker::Shape& shape);

}  // namespace pdkv::cli

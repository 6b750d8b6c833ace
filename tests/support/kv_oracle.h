// The tests' oracle is the workers' pattern (src/worker/kv_pattern.h): it is
// derived from the layout definitions, independently of the planner.
#pragma once

#include "worker/kv_pattern.h"

namespace pdkv::testing {
using worker::element_byte;
using worker::for_each_element;
using worker::mix_byte;
using worker::oracle_offset;
using worker::untouched_byte;
}  // namespace pdkv::testing

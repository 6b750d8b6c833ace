// The tests' oracle is the workers' pattern (src/worker/kv_pattern.h): it is
// derived from the layout definitions, independently of the planner.
#pragma once

#include <vector>

#include "pdkv/plan.h"
#include "worker/kv_pattern.h"

namespace pdkv::testing {

// What decode rank `rank`'s buffers (of `sizes` bytes each) must hold once a
// room moved `pages` to it: the untouched pattern everywhere, the elements
// the oracle gives in those pages.
inline std::vector<std::vector<uint8_t>> expected_image(uint32_t rank, const RankShard& shard,
                                                        const std::vector<size_t>& sizes,
                                                        const std::vector<uint64_t>& pages) {
  std::vector<std::vector<uint8_t>> expected(sizes.size());
  for (uint32_t b = 0; b < sizes.size(); ++b) {
    expected[b].resize(sizes[b]);
    for (uint64_t o = 0; o < sizes[b]; ++o) expected[b][o] = worker::untouched_byte(rank, b, o);
  }
  worker::for_each_element(shard.spec, shard.heads, shard.layers, pages, 0,
                           [&](uint32_t b, uint64_t o, uint8_t v) { expected[b][o] = v; });
  return expected;
}

using worker::element_byte;
using worker::for_each_element;
using worker::mix_byte;
using worker::oracle_offset;
using worker::untouched_byte;
}  // namespace pdkv::testing

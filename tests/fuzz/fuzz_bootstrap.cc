// Bootstrap registration and lookup: a sequence of records, each an op byte,
// a 16-bit length and that many bytes of a RegisterRankRequest or a
// TopologyRequest, applied to one Registry with small limits. A topology it
// answers must be whole: every (pp, tp) of the engine once, in order.
#include <cstdint>
#include <string>

#include "bootstrap/registry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pdkv::Limits limits;
  limits.ranks_per_engine = 64;
  limits.engines = 8;
  pdkv::bootstrap::Registry registry(limits);
  size_t at = 0;
  while (size - at >= 3) {
    const uint8_t op = data[at];
    const size_t length = std::min<size_t>(data[at + 1] | data[at + 2] << 8, size - at - 3);
    const char* bytes = reinterpret_cast<const char*>(data + at + 3);
    at += 3 + length;
    if (op % 2 == 0) {
      pdkv::proto::RegisterRankRequest request;
      if (!request.ParseFromArray(bytes, static_cast<int>(length))) continue;
      (void)registry.register_rank(request.rank(), request.renewal());
      continue;
    }
    pdkv::proto::TopologyRequest request;
    if (!request.ParseFromArray(bytes, static_cast<int>(length))) continue;
    auto ranks = registry.topology(request.engine_id(), request.dp_rank());
    if (!ranks.is_ok()) continue;
    const auto& first = ranks->front();
    if (ranks->size() != uint64_t{first.tp_size()} * first.pp_size()) __builtin_trap();
    for (size_t i = 0; i < ranks->size(); ++i) {
      const auto& r = (*ranks)[i];
      if (r.pp_rank() != i / first.tp_size() || r.tp_rank() != i % first.tp_size() ||
          r.engine_id() != request.engine_id()) {
        __builtin_trap();
      }
    }
  }
  return 0;
}

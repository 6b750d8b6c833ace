// Each backend's descriptor parser, on bytes a peer (or an attacker that got
// past authentication) could hand over: the first byte picks the backend.
// Parsing must refuse or succeed, never crash; what mooncake accepts encodes
// back to bytes it accepts again, equal.
#include <cstdint>
#include <string_view>
#include <vector>

#include "io_engine.h"
#include "nixl_transport.h"
#include "segment.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view blob(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0: {
      namespace mc = pdkv::backends::mooncake;
      auto d = mc::SegmentDescriptor::decode(blob);
      if (!d.is_ok()) return 0;
      const std::string again = d->encode();
      auto twice = mc::SegmentDescriptor::decode(again);
      if (!twice.is_ok() || twice->encode() != again) __builtin_trap();
      return 0;
    }
    case 1: {
      pdkv::backends::mori::EngineDesc engine;
      std::vector<pdkv::backends::mori::MemoryDesc> memory;
      (void)pdkv::backends::mori::decode(blob, engine, memory);
      return 0;
    }
    default: {
      auto parsed = pdkv::backends::nixl::parse_descriptor(blob);
      if (parsed.is_ok() && parsed->regions.size() > blob.size()) __builtin_trap();
      return 0;
    }
  }
}

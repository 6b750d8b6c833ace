// The mori engine descriptor on the wire (encode/decode of io_engine.h):
// what a peer needs to reach this engine and its registered memory.
#include <fmt/format.h>

#include "byte_codec.h"
#include "io_engine.h"
#include "shared_pool.h"

namespace pdkv::backends::mori {
namespace {

// 2: the inbox key; 3: the process's start time and each memory's memfd
// and its inode; 4: messages between engines carry their kind
// (io_engine_impl.h, MessageKind), and whether it keeps inbound statuses;
// 5: its doorbell and that eventfd's id (peer_doorbell.h).
constexpr std::string_view kMagic = "pdkv-mori-5";
constexpr uint64_t kMaxEntries = 1 << 20;

}  // namespace

std::string encode(const EngineDesc& engine, std::span<const MemoryDesc> memory) {
  ByteWriter w;
  w.bytes(kMagic);
  w.bytes(engine.key);
  w.u64(engine.nonce);
  w.bytes(engine.host_identity);
  w.u64(engine.start_time);
  w.u64(engine.inbox_key);
  w.u64(engine.keeps_inbound ? 1 : 0);
  w.u64(fd_to_wire(engine.doorbell));
  w.u64(engine.doorbell_id);
  w.u64(engine.endpoints.size());
  for (const auto& e : engine.endpoints) {
    w.bytes(e.provider);
    w.bytes(e.address);
  }
  w.u64(memory.size());
  for (const auto& m : memory) {
    w.u64(m.id);
    w.u64(m.base);
    w.u64(m.length);
    w.u64(fd_to_wire(m.memfd));
    w.u64(m.memfd_inode);
    w.u64(m.keys.size());
    for (uint64_t k : m.keys) w.u64(k);
  }
  return w.take();
}

Status decode(std::string_view blob, EngineDesc& engine, std::vector<MemoryDesc>& memory) {
  ByteReader r(blob);
  std::string_view magic, key, host;
  uint64_t nonce = 0, start_time = 0, inbox_key = 0, keeps_inbound = 0, doorbell = 0,
           doorbell_id = 0, endpoints = 0, regions = 0;
  if (!r.bytes(magic) || magic != kMagic) {
    return Status::invalid_argument(
        fmt::format("not a mori engine descriptor ({} bytes): bad magic", blob.size()));
  }
  if (!r.bytes(key) || !r.u64(nonce) || nonce > UINT32_MAX || !r.bytes(host) ||
      !r.u64(start_time) || !r.u64(inbox_key) || !r.u64(keeps_inbound) || keeps_inbound > 1 ||
      !r.u64(doorbell) || !r.u64(doorbell_id) || !r.u64(endpoints) || endpoints == 0 ||
      endpoints > 16) {
    return Status::invalid_argument("mori descriptor truncated in its header");
  }
  const Result<int32_t> doorbell_fd = fd_from_wire(doorbell, "doorbell");
  if (!doorbell_fd.is_ok()) {
    return Status::invalid_argument(
        fmt::format("mori descriptor: {}", doorbell_fd.status().message()));
  }
  engine =
      EngineDesc{std::string(key), static_cast<uint32_t>(nonce), std::string(host), start_time, {},
                 inbox_key,        keeps_inbound == 1,           *doorbell_fd,      doorbell_id};
  for (uint64_t i = 0; i < endpoints; ++i) {
    std::string_view provider, address;
    if (!r.bytes(provider) || !r.bytes(address)) {
      return Status::invalid_argument("mori descriptor truncated in its endpoints");
    }
    engine.endpoints.push_back({std::string(provider), std::string(address)});
  }
  if (!r.u64(regions) || regions > kMaxEntries) {
    return Status::invalid_argument("mori descriptor truncated before its memory");
  }
  memory.clear();
  for (uint64_t i = 0; i < regions; ++i) {
    MemoryDesc m;
    m.engine_key = engine.key;
    uint64_t id = 0, memfd = 0, keys = 0;
    if (!r.u64(id) || !r.u64(m.base) || !r.u64(m.length) || !r.u64(memfd) ||
        !r.u64(m.memfd_inode) || !r.u64(keys) || keys != endpoints) {
      return Status::invalid_argument("mori descriptor truncated in its memory");
    }
    auto fd = fd_from_wire(memfd, "memfd");
    if (!fd.is_ok()) {
      return Status::invalid_argument(
          fmt::format("mori descriptor: memory {}: {}", id, fd.status().message()));
    }
    m.id = static_cast<uint32_t>(id);
    m.memfd = *fd;
    m.keys.resize(keys);
    for (auto& k : m.keys) {
      if (!r.u64(k)) return Status::invalid_argument("mori descriptor truncated in its keys");
    }
    memory.push_back(std::move(m));
  }
  if (!r.done()) return Status::invalid_argument("mori descriptor has trailing bytes");
  return Status::ok();
}

}  // namespace pdkv::backends::mori

// A mooncake segment: one per process, named by its address. Its descriptor
// is what a peer needs to reach it: the addresses it listens on (one per
// rail), the session secret a connection must present, its registered
// buffers (with the memfds of those in shared memory), and who it is on
// this host (for the same-host path).
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pdkv/status.h"
#include "shared_pool.h"

namespace pdkv::backends::mooncake {

struct SegmentDescriptor {
  // Virtual addresses in the segment's process, with the memfd of those in
  // shared memory (shared_pool.h).
  using Buffer = SharedBuffer;
  std::string name;           // "ip:port" of its first rail
  std::string host_identity;  // equal on both sides => process_vm_* can reach `pid`
  uint64_t pid = 0;
  uint64_t start_time = 0;  // of `pid` (clock ticks since boot): tells a reused pid apart
  std::string secret;
  std::vector<std::string> rails;  // "ip:port" it listens on
  std::vector<Buffer> buffers;     // in registration order

  std::string encode() const;
  // Never trusts its input: anything short or malformed is kInvalidArgument.
  static Result<SegmentDescriptor> decode(std::string_view blob);
  // The buffer holding all of [addr, addr + length), or nullptr.
  const Buffer* find(uint64_t addr, uint64_t length) const;
};

// The buffer of `buffers` holding all of [addr, addr + length), or nullptr.
const SegmentDescriptor::Buffer* find_buffer(std::span<const SegmentDescriptor::Buffer> buffers,
                                             uint64_t addr, uint64_t length);

// Finds the buffer that holds an address range by binary search: submitting
// a batch looks up every request (a 2 -> 4 request of llama3-8b is 65,536
// of them) among 60-odd pools. The buffers' own order is left alone, since
// a region's number is its place in the descriptor.
class BufferIndex {
 public:
  BufferIndex() = default;
  explicit BufferIndex(std::span<const SegmentDescriptor::Buffer> buffers);
  // As find_buffer: the buffer holding all of [addr, addr + length), or nullptr.
  const SegmentDescriptor::Buffer* find(uint64_t addr, uint64_t length) const;

 private:
  std::vector<SegmentDescriptor::Buffer> by_base_;
};

// 32 bytes from the kernel's random source.
Result<std::string> random_secret();

// "ip:port" (IPv4, or [IPv6]:port) as a socket address.
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
};
// `port_required` false accepts a bare "ip" (port 0).
Result<SocketAddress> parse_address(std::string_view text, bool port_required);
std::string format_address(const SocketAddress& address);

}  // namespace pdkv::backends::mooncake

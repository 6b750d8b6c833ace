#include "segment.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/stat.h>

#include <algorithm>
#include <charconv>
#include <climits>

#include "byte_codec.h"
#include "host_identity.h"
#include "wire.h"

namespace pdkv::backends::mooncake {
namespace {

constexpr std::string_view kMagic = "pdkv-mooncake-3";  // 3: each memfd's inode
constexpr uint64_t kMaxEntries = 1 << 20;

}  // namespace

std::string SegmentDescriptor::encode() const {
  ByteWriter w;
  w.bytes(kMagic);
  w.bytes(name);
  w.bytes(host_identity);
  w.u64(pid);
  w.u64(start_time);
  w.bytes(secret);
  w.u64(rails.size());
  for (const auto& r : rails) w.bytes(r);
  w.u64(buffers.size());
  for (const auto& b : buffers) {
    w.u64(b.base);
    w.u64(b.length);
    w.u64(fd_to_wire(b.memfd));
    w.u64(b.memfd_inode);
  }
  return w.take();
}

Result<SegmentDescriptor> SegmentDescriptor::decode(std::string_view blob) {
  ByteReader r(blob);
  SegmentDescriptor d;
  std::string_view magic, name, host, secret;
  uint64_t rails = 0, buffers = 0;
  if (!r.bytes(magic) || magic != kMagic) {
    return Status::invalid_argument(
        fmt::format("not a mooncake segment descriptor ({} bytes): bad magic", blob.size()));
  }
  if (!r.bytes(name) || !r.bytes(host) || !r.u64(d.pid) || !r.u64(d.start_time) ||
      !r.bytes(secret) || secret.size() != wire::kSecretBytes || !r.u64(rails) || rails == 0 ||
      rails > kMaxEntries || rails > r.left() / 8) {
    return Status::invalid_argument("mooncake segment descriptor truncated in its header");
  }
  d.name = name;
  d.host_identity = host;
  d.secret = secret;
  for (uint64_t i = 0; i < rails; ++i) {
    std::string_view rail;
    if (!r.bytes(rail))
      return Status::invalid_argument("mooncake descriptor truncated in its rails");
    d.rails.emplace_back(rail);
  }
  if (!r.u64(buffers) || buffers > kMaxEntries || buffers > r.left() / 32) {
    return Status::invalid_argument("mooncake descriptor truncated before its buffers");
  }
  d.buffers.resize(buffers);
  for (auto& b : d.buffers) {
    uint64_t memfd = 0;
    if (!r.u64(b.base) || !r.u64(b.length) || !r.u64(memfd) || !r.u64(b.memfd_inode) ||
        b.base + b.length < b.base) {
      return Status::invalid_argument("mooncake descriptor truncated in its buffers");
    }
    auto fd = fd_from_wire(memfd, "memfd");
    if (!fd.is_ok())
      return Status::invalid_argument("mooncake descriptor: buffer " + fd.status().message());
    b.memfd = *fd;
  }
  if (!r.done()) return Status::invalid_argument("mooncake descriptor has trailing bytes");
  return d;
}

const SegmentDescriptor::Buffer* SegmentDescriptor::find(uint64_t addr, uint64_t length) const {
  return find_buffer(buffers, addr, length);
}

const SegmentDescriptor::Buffer* find_buffer(std::span<const SegmentDescriptor::Buffer> buffers,
                                             uint64_t addr, uint64_t length) {
  for (const auto& b : buffers) {
    if (b.holds(addr, length)) return &b;
  }
  return nullptr;
}

BufferIndex::BufferIndex(std::span<const SegmentDescriptor::Buffer> buffers)
    : by_base_(buffers.begin(), buffers.end()) {
  std::stable_sort(by_base_.begin(), by_base_.end(),
                   [](const auto& a, const auto& b) { return a.base < b.base; });
}

const SegmentDescriptor::Buffer* BufferIndex::find(uint64_t addr, uint64_t length) const {
  // The buffer with the greatest base at or below `addr` first; only a miss
  // looks at them all, so that buffers that overlap still find their bytes.
  const auto* nearest = last_at_or_below<SegmentDescriptor::Buffer>(
      by_base_, addr, [](const SegmentDescriptor::Buffer& b) { return b.base; });
  if (nearest != nullptr && find_buffer({nearest, 1}, addr, length) != nullptr) return nearest;
  return find_buffer(by_base_, addr, length);
}

Result<std::string> random_secret() {
  std::string secret(wire::kSecretBytes, '\0');
  if (getrandom(secret.data(), secret.size(), 0) != static_cast<ssize_t>(secret.size())) {
    return Status::internal("getrandom failed: no session secret");
  }
  return secret;
}

Result<SocketAddress> parse_address(std::string_view text, bool port_required) {
  std::string host(text);
  uint64_t port = 0;
  bool has_port = false;
  if (!host.empty() && host.front() == '[') {  // [v6]:port
    const size_t close = host.find(']');
    if (close == std::string::npos) {
      return Status::invalid_argument(fmt::format("address '{}': missing ']'", text));
    }
    if (close + 1 < host.size()) {
      if (host[close + 1] != ':') {
        return Status::invalid_argument(fmt::format("address '{}': expected ':' after ']'", text));
      }
      has_port = true;
      const std::string p = host.substr(close + 2);
      auto [ptr, ec] = std::from_chars(p.data(), p.data() + p.size(), port);
      if (ec != std::errc() || ptr != p.data() + p.size() || p.empty() || port > 65535) {
        return Status::invalid_argument(fmt::format("address '{}': bad port '{}'", text, p));
      }
    }
    host = host.substr(1, close - 1);
  } else if (const size_t colon = host.rfind(':');
             colon != std::string::npos && host.find(':') == colon) {  // v4:port
    has_port = true;
    const std::string p = host.substr(colon + 1);
    auto [ptr, ec] = std::from_chars(p.data(), p.data() + p.size(), port);
    if (ec != std::errc() || ptr != p.data() + p.size() || p.empty() || port > 65535) {
      return Status::invalid_argument(fmt::format("address '{}': bad port '{}'", text, p));
    }
    host = host.substr(0, colon);
  }
  if (port_required && !has_port) {
    return Status::invalid_argument(fmt::format("address '{}' has no port", text));
  }
  SocketAddress a;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&a.storage);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&a.storage);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    a.length = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    a.length = sizeof(sockaddr_in6);
  } else {
    return Status::invalid_argument(
        fmt::format("address '{}': '{}' is not a numeric IPv4 or IPv6 address", text, host));
  }
  return a;
}

std::string format_address(const SocketAddress& address) {
  char host[INET6_ADDRSTRLEN] = {};
  if (address.storage.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&address.storage);
    inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof host);
    return fmt::format("[{}]:{}", host, ntohs(v6->sin6_port));
  }
  const auto* v4 = reinterpret_cast<const sockaddr_in*>(&address.storage);
  inet_ntop(AF_INET, &v4->sin_addr, host, sizeof host);
  return fmt::format("{}:{}", host, ntohs(v4->sin_port));
}

}  // namespace pdkv::backends::mooncake

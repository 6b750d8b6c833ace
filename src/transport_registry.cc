#include <fmt/format.h>

#include <algorithm>
#include <mutex>

#include "pdkv/transport.h"

namespace pdkv {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, TransportFactory, std::less<>> factories;
};

// A function-local static: backends register during static initialisation,
// possibly before any global of this file is constructed.
Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

const char* memory_kind_name(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHost:
      return "host";
    case MemoryKind::kCuda:
      return "cuda";
    case MemoryKind::kHip:
      return "hip";
  }
  return "unknown";
}

Result<MemoryKind> parse_memory_kind(std::string_view name) {
  for (MemoryKind kind : {MemoryKind::kHost, MemoryKind::kCuda, MemoryKind::kHip}) {
    if (name == memory_kind_name(kind)) return kind;
  }
  return Status::invalid_argument(fmt::format("'{}' is not host, cuda or hip", name));
}

bool register_transport(const std::string& name, TransportFactory factory) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  return r.factories.emplace(name, std::move(factory)).second;
}

Result<std::unique_ptr<Transport>> create_transport(std::string_view name,
                                                    const TransportOptions& options) {
  TransportFactory factory;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    auto it = r.factories.find(name);
    if (it == r.factories.end()) {
      std::vector<std::string> known;
      for (const auto& [n, f] : r.factories) known.push_back(n);
      return Status::not_found(
          fmt::format("no transport backend named '{}' (built: {})", name,
                      known.empty() ? "none" : fmt::format("{}", fmt::join(known, ", "))));
    }
    factory = it->second;
  }
  return factory(options);
}

std::vector<std::string> transport_names() {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  std::vector<std::string> names;
  for (const auto& [n, f] : r.factories) names.push_back(n);
  return names;
}

}  // namespace pdkv

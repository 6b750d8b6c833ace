// First-fit allocation of slots in a rank's registered staging region.
// Not thread-safe: the engine calls it under its lock.
#pragma once

#include <cstdint>
#include <iterator>
#include <map>
#include <optional>

namespace pdkv::engine {

class StagingPool {
 public:
  explicit StagingPool(uint64_t bytes = 0) {
    if (bytes > 0) free_[0] = bytes;
  }
  std::optional<uint64_t> allocate(uint64_t bytes) {
    if (bytes == 0) return std::nullopt;
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < bytes) continue;
      const uint64_t offset = it->first, left = it->second - bytes;
      free_.erase(it);
      if (left > 0) free_[offset + bytes] = left;
      used_[offset] = bytes;
      return offset;
    }
    return std::nullopt;
  }
  void release(uint64_t offset) {
    auto it = used_.find(offset);
    if (it == used_.end()) return;
    uint64_t start = offset, size = it->second;
    used_.erase(it);
    // Merge with the free neighbours on both sides.
    auto next = free_.lower_bound(start);
    if (next != free_.end() && start + size == next->first) {
      size += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == start) {
        start = prev->first;
        size += prev->second;
        free_.erase(prev);
      }
    }
    free_[start] = size;
  }

 private:
  std::map<uint64_t, uint64_t> free_, used_;  // offset -> size
};

}  // namespace pdkv::engine

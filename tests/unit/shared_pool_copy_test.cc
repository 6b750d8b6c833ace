// copy_into_peer (src/shared_pool.h), the copy into a peer's mapped pool:
// byte for byte what a plain byte loop writes, at every destination offset
// within a cache line, several source alignments, and every length around
// its thresholds (the head up to a line, whole lines, the 1 KiB from which
// it streams), and nothing around it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "shared_pool.h"

namespace pdkv {
namespace {

constexpr size_t kGuard = 128;  // bytes either side that must stay untouched
constexpr size_t kMax = 100000;

TEST(CopyIntoPeer, WritesExactlyTheBytesAtEveryAlignmentAndLength) {
  std::vector<size_t> lengths = {0, 1, 15, 16, 17, 63, 64, 65, 1000, 4096, 32768 + 45, kMax};
  for (size_t head = 0; head < 64; head += 7) {  // around the head a 64-byte line needs
    for (size_t extra : {size_t{0}, size_t{1}, size_t{63}, size_t{64}}) {
      lengths.push_back(1023 + head + extra);
    }
  }
  alignas(64) static char src[kMax + 64];
  alignas(64) static char dst[kMax + 64 + 2 * kGuard];
  alignas(64) static char want[sizeof dst];
  for (size_t i = 0; i < sizeof src; ++i) src[i] = static_cast<char>(i * 131 + (i >> 9) + 1);
  for (size_t length : lengths) {
    for (size_t from : {0, 1, 8, 15}) {
      for (size_t to = 0; to < 64; ++to) {
        const size_t span = kGuard + to + length + kGuard;  // what may change, and its guards
        std::fill(dst, dst + span, '\x5a');
        std::fill(want, want + span, '\x5a');
        for (size_t i = 0; i < length; ++i) want[kGuard + to + i] = src[from + i];
        copy_into_peer(dst + kGuard + to, src + from, length);
        ASSERT_EQ(std::memcmp(dst, want, span), 0)
            << length << " bytes from +" << from << " to +" << to;
      }
    }
  }
}

}  // namespace
}  // namespace pdkv

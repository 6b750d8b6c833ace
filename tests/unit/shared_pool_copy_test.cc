// copy_into_peer (src/shared_pool.h), the copy into a peer's mapped pool:
// byte for byte what a plain byte loop writes, at every alignment of source
// and destination and every length around its thresholds (16-byte heads,
// 64-byte lines, the 1 KiB from which it streams), and nothing around it.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "shared_pool.h"

namespace pdkv {
namespace {

constexpr size_t kGuard = 80;  // bytes either side that must stay untouched

TEST(CopyIntoPeer, WritesExactlyTheBytesAtEveryAlignmentAndLength) {
  std::vector<size_t> lengths = {0,    1,    15,   16,   17,   63,   64,    65,         1000,
                                 1023, 1024, 1025, 1087, 1088, 4096, 32768, 32768 + 45, 100000};
  std::vector<char> src(100000 + 64), dst(100000 + 64 + 2 * kGuard), want(dst.size());
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 131 + (i >> 9) + 1);
  for (size_t length : lengths) {
    for (size_t from : {0, 1, 8, 15}) {
      for (size_t to : {0, 3, 16, 33}) {
        std::fill(dst.begin(), dst.end(), '\x5a');
        want = dst;
        for (size_t i = 0; i < length; ++i) want[kGuard + to + i] = src[from + i];
        copy_into_peer(dst.data() + kGuard + to, src.data() + from, length);
        ASSERT_EQ(dst, want) << length << " bytes from +" << from << " to +" << to;
      }
    }
  }
}

}  // namespace
}  // namespace pdkv

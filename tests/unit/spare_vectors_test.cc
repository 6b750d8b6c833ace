// SpareVectors: a list given back comes out of the next take() with its
// storage (the same buffer, by address), emptied; the count and the bytes
// kept are the bounds the header states, checked by hand.
#include "spare_vectors.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace pdkv {
namespace {

TEST(SpareVectors, ATakenListHasTheStorageOfTheOneGivenBackEmptied) {
  SpareVectors<uint64_t> spares;
  EXPECT_EQ(spares.take().capacity(), 0u);  // nothing kept yet

  std::vector<uint64_t> list(1000, 7);
  const uint64_t* storage = list.data();
  spares.give_back(std::move(list));

  std::vector<uint64_t> again = spares.take();
  EXPECT_TRUE(again.empty());
  EXPECT_GE(again.capacity(), 1000u);
  EXPECT_EQ(again.data(), storage);
  EXPECT_EQ(spares.take().capacity(), 0u);  // it was the only one
}

TEST(SpareVectors, ALeaseGivesItsListBackAsItsScopeEnds) {
  SpareVectors<uint64_t> spares;
  const uint64_t* storage = nullptr;
  {
    SpareVectors<uint64_t>::Lease lease(spares);
    lease->assign(500, 1);
    storage = lease->data();
  }
  SpareVectors<uint64_t>::Lease next(spares);
  EXPECT_TRUE(next->empty());
  EXPECT_EQ(next->data(), storage);
}

TEST(SpareVectors, KeepsAtMostFourListsAndAtMost64MiBInAll) {
  SpareVectors<uint64_t> spares;
  for (int i = 0; i < 6; ++i) spares.give_back(std::vector<uint64_t>(10));
  int kept = 0;
  while (spares.take().capacity() > 0) ++kept;
  EXPECT_EQ(kept, 4);

  // 64 MiB is kept, one element more is not.
  constexpr size_t kAtBound = (size_t{64} << 20) / sizeof(uint64_t);
  std::vector<uint64_t> at_bound;
  at_bound.reserve(kAtBound);
  spares.give_back(std::move(at_bound));
  EXPECT_GE(spares.take().capacity(), kAtBound);
  std::vector<uint64_t> over;
  over.reserve(kAtBound + 1);
  spares.give_back(std::move(over));
  EXPECT_EQ(spares.take().capacity(), 0u);

  // 40 MiB kept, then 40 MiB more would pass 64 in all: dropped. Taking
  // the first frees its share again.
  constexpr size_t k40MiB = (size_t{40} << 20) / sizeof(uint64_t);
  std::vector<uint64_t> first, second, third;
  first.reserve(k40MiB);
  second.reserve(k40MiB);
  third.reserve(k40MiB);
  spares.give_back(std::move(first));
  spares.give_back(std::move(second));
  EXPECT_GE(spares.take().capacity(), k40MiB);
  EXPECT_EQ(spares.take().capacity(), 0u);
  spares.give_back(std::move(third));
  EXPECT_GE(spares.take().capacity(), k40MiB);
}

}  // namespace
}  // namespace pdkv

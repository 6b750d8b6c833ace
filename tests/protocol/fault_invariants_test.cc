// The engine's invariants under injected transport faults (pdkv/faults.h),
// over every backend of the build and the loopback transport. Many rooms run
// side by side while batches fail part-way, stall, arrive late and
// connections are refused; in every run:
//   - no room reaches Success unless every byte of it is there (checked byte
//     for byte);
//   - every failed room names a reason, at both ends;
//   - nothing lands in a room's pages after the decode side reported it
//     failed (its pages are poisoned then, and checked once no batch of any
//     prefill rank is in flight any more);
//   - every room ends within its timeouts, and nothing crashes.
#include <gtest/gtest.h>

#include "support/rooms.h"

namespace pdkv {
namespace {

using namespace std::chrono_literals;
using testing::Cluster;
using testing::ClusterSpec;
using testing::first_pages;
using testing::poll_until;

struct Run {
  std::string name;
  std::string backend;
  Staging staging;
  std::vector<std::string> faults;
  bool some_fail = true, some_succeed = true;  // what this mix must show
};
void PrintTo(const Run& r, std::ostream* os) { *os << r.name; }

std::vector<Run> runs() {
  // One fault at a time over loopback (so that each is surely felt), then
  // all of them over every backend.
  // Delays keep some bytes on their way when a room fails: the window in
  // which a late write would land in pages already given back.
  const std::vector<std::string> mixed = {"fail_batch=0.1", "stall_batch=0.05", "delay_us=20000",
                                          "fail_connect=0.05", "seed=11"};
  std::vector<Run> out = {
      {"loopback_fail_batch",
       "loopback",
       Staging::kOff,
       {"fail_batch=0.15", "delay_us=20000", "seed=3"}},
      {"loopback_stall_batch_staged", "loopback", Staging::kOn, {"stall_batch=0.08", "seed=4"}},
      {"loopback_delay", "loopback", Staging::kOff, {"delay_us=50000"}, false, true},
      {"loopback_fail_connect", "loopback", Staging::kOff, {"fail_connect=1"}, true, false},
      {"mooncake_mixed", "mooncake", Staging::kAuto, mixed}};
#ifdef PDKV_WITH_NIXL
  out.push_back({"nixl_mixed", "nixl", Staging::kOff, mixed});
#endif
#ifdef PDKV_WITH_MORI
  out.push_back({"mori_mixed_staged", "mori", Staging::kOn, mixed});
#endif
  return out;
}

class FaultInvariants : public ::testing::TestWithParam<Run> {};

TEST_P(FaultInvariants, HoldUnderFailedStalledLateBatchesAndRefusedConnections) {
  constexpr RoomId kRooms = 24;
  constexpr uint64_t kPages = 3;
  ClusterSpec spec = testing::shape(8, 4, 2);  // two sources per decode rank
  spec.backend = GetParam().backend;
  spec.staging = GetParam().staging;
  spec.kv.num_pages = kRooms * kPages;  // every room its own pages: none is reused
  spec.aux_items = {8};
  spec.aux_slots = kRooms;
  spec.prefill_faults = parse_faults(GetParam().faults).value();
  spec.timeouts.transfer = 1s;
  spec.timeouts.waiting_for_data = 8s;
  auto c = Cluster::start(spec);
  ASSERT_NE(c, nullptr);

  std::vector<testing::ClusterRoom> rooms;
  for (RoomId id = 1; id <= kRooms; ++id) {
    const auto pages = first_pages(kPages, (id - 1) * kPages);
    c->fill(id, pages, uint32_t(id - 1), {});  // (the decode pools are reset each time: fine)
  }
  for (RoomId id = 1; id <= kRooms; ++id) {
    const auto pages = first_pages(kPages, (id - 1) * kPages);
    testing::ClusterRoom r;
    for (auto& e : c->decode) {
      r.receivers.push_back(std::move(e->receiver(id, "prefill")).value());
      ASSERT_TRUE(r.receivers.back()->init().is_ok());
      ASSERT_TRUE(r.receivers.back()->send_metadata(pages, uint32_t(id - 1)).is_ok());
    }
    for (auto& e : c->prefill) {
      r.senders.push_back(std::move(e->sender(id)).value());
      ASSERT_TRUE(r.senders.back()->init(kPages, uint32_t(id - 1)).is_ok());
      // Two chunks: more batches, more faults.
      ASSERT_TRUE(r.senders.back()->send(std::span(pages).first(1), false).is_ok());
      ASSERT_TRUE(r.senders.back()->send(std::span(pages).subspan(1), true).is_ok());
    }
    rooms.push_back(std::move(r));
  }
  // Every room ends within its timeouts (data 8 s, transfer 1 s twice). A
  // decode rank's pages are poisoned the moment it reports the room failed:
  // from then on, nothing may land there.
  std::vector<std::vector<bool>> poisoned(kRooms, std::vector<bool>(c->decode.size()));
  auto poison_failed = [&] {
    for (RoomId id = 1; id <= kRooms; ++id) {
      for (size_t d = 0; d < c->decode.size(); ++d) {
        if (poisoned[id - 1][d] || rooms[id - 1].receivers[d]->poll() != PollState::kFailed)
          continue;
        c->poison(d, first_pages(kPages, (id - 1) * kPages), id);
        poisoned[id - 1][d] = true;
      }
    }
  };
  ASSERT_TRUE(poll_until(
      [&] {
        poison_failed();
        for (auto& r : rooms)
          if (!r.ended()) return false;
        return true;
      },
      30s));
  poison_failed();
  size_t succeeded = 0, failed = 0;
  for (RoomId id = 1; id <= kRooms; ++id) {
    testing::ClusterRoom& r = rooms[id - 1];
    const auto pages = first_pages(kPages, (id - 1) * kPages);
    bool decode_failed = false, prefill_failed = false;
    for (size_t d = 0; d < r.receivers.size(); ++d) {
      if (r.receivers[d]->poll() != PollState::kFailed) continue;
      decode_failed = true;
      EXPECT_FALSE(r.receivers[d]->failure().message().empty()) << "room " << id;
    }
    std::string reasons;
    for (auto& s : r.senders) {
      if (s->poll() != PollState::kFailed) continue;
      prefill_failed = true;
      EXPECT_FALSE(s->failure().message().empty()) << "room " << id;
      reasons += "\n  prefill: " + s->failure().message();
    }
    for (auto& rx : r.receivers) reasons += "\n  decode: " + rx->failure().to_string();
    EXPECT_EQ(decode_failed, prefill_failed)
        << "room " << id << " failed at one end only" << reasons;
    if (decode_failed) {
      ++failed;
    } else {
      ++succeeded;
      EXPECT_EQ(c->verify_pages(id, pages, uint32_t(id - 1)), "") << "room " << id;
    }
  }
  // Once no prefill rank has a batch in flight, nothing more can land.
  ASSERT_TRUE(poll_until([&] {
    for (auto& e : c->prefill)
      if (e->stats().batches_in_flight > 0) return false;
    return true;
  }));
  for (RoomId id = 1; id <= kRooms; ++id) {
    for (size_t d = 0; d < rooms[id - 1].receivers.size(); ++d) {
      if (rooms[id - 1].receivers[d]->poll() != PollState::kFailed) continue;
      EXPECT_EQ(c->check_poison(d, first_pages(kPages, (id - 1) * kPages), id), "");
    }
  }
  // The faults were felt, and did not stop everything (as the mix says).
  EXPECT_EQ(failed > 0, GetParam().some_fail) << failed << " rooms failed";
  EXPECT_EQ(succeeded > 0, GetParam().some_succeed) << succeeded << " rooms succeeded";
  std::printf("%s: %zu rooms succeeded, %zu failed\n", GetParam().name.c_str(), succeeded, failed);
}

INSTANTIATE_TEST_SUITE_P(Backends, FaultInvariants, ::testing::ValuesIn(runs()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace pdkv

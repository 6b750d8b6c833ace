// mori's same-host pools (io_engine.h, shared_pool.h): memory an engine
// allocates is a sealed memfd its descriptor names; an initiator that
// reaches it over shm maps it and copies a transfer's bodies (and reads)
// with memcpy, and tells the target that a write landed by message. Ordinary
// memory, another provider, or shared_pools=off leave every byte to the
// provider, and so does a pool whose process's start time is not the one
// its descriptor gave (a reused pid). Byte checks use patterns computed here; the copied byte
// counts are worked out by hand from the writes each test makes.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "io_engine.h"
#include "mori_test_support.h"
#include "support/poll.h"

namespace pdkv::backends::mori {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kBytes = 3 * kMiB;
constexpr uint64_t kReadBytes = 65536;

IoEngineConfig config(const std::string& key, const std::string& provider, bool shared_pools) {
  IoEngineConfig c = mori::config(key, provider);  // the shared one (mori_test_support.h)
  c.shared_pools = shared_pools;
  return c;
}

bool finished(IoEngine& e, TransferId id) {
  const TransferStatus st = wait(e, id);
  EXPECT_EQ(st.state, TransferState::kSuccess) << st.error.to_string();
  return st.state == TransferState::kSuccess;
}

std::vector<char> pattern(uint64_t bytes) {
  std::vector<char> v(bytes);
  for (uint64_t i = 0; i < bytes; ++i) v[i] = static_cast<char>(i * 29 + (i >> 13) + 3);
  return v;
}

// `src` (ordinary memory) written to the target's `dst` in four writes,
// the last of them 4 KiB, then the first 64 KiB of `dst` read back into
// src + kBytes. Returns the initiator's copied bytes.
// `reused_pid`: the target's descriptor gives another start time for its
// process, as a pid reused by a later process would show.
uint64_t write_then_read(const std::string& provider, bool initiator_pools, bool target_pools,
                         bool dst_from_pool, bool reused_pid = false) {
  std::vector<char> src = pattern(kBytes);
  src.resize(kBytes + kReadBytes, 0);
  std::vector<char> ordinary(kBytes, 0);
  auto initiator = IoEngine::create(config("initiator", provider, initiator_pools)).value();
  auto target = IoEngine::create(config("target", provider, target_pools)).value();
  char* dst = ordinary.data();
  if (dst_from_pool) dst = static_cast<char*>(target->allocate(kBytes).value());
  const MemoryDesc mine = initiator->register_memory(src.data(), src.size()).value();
  const MemoryDesc theirs = target->register_memory(dst, kBytes).value();
  EXPECT_EQ(mine.memfd, -1);  // not allocated by the engine
  EXPECT_EQ(theirs.memfd >= 0, dst_from_pool);
  target->release_to_peers();
  EngineDesc target_desc = target->desc();
  if (reused_pid) target_desc.start_time += 1;
  EXPECT_TRUE(initiator->register_remote_engine(target_desc, {&theirs, 1}).is_ok());
  EXPECT_TRUE(target->register_remote_engine(initiator->desc()).is_ok());
  auto session = initiator->create_session(mine, theirs).value();

  const std::vector<uint64_t> offsets = {0, kMiB, 2 * kMiB, kBytes - 4096},
                              sizes = {kMiB, kMiB, kMiB - 4096, 4096};
  const TransferId write = initiator->allocate_transfer_id();
  EXPECT_TRUE(session.batch_write(offsets, offsets, sizes, write).is_ok());
  if (!finished(*initiator, write)) return UINT64_MAX;
  EXPECT_TRUE(landed(*target, write));
  EXPECT_EQ(std::memcmp(dst, src.data(), kBytes), 0);
  EXPECT_TRUE(target->take_messages().empty());  // a landed message is no notice
  EXPECT_EQ(target->dropped_messages(), 0u);

  const TransferId read = initiator->allocate_transfer_id();
  const std::vector<uint64_t> at_end = {kBytes}, at_start = {0}, read_size = {kReadBytes};
  EXPECT_TRUE(session.batch_read(at_end, at_start, read_size, read).is_ok());
  if (!finished(*initiator, read)) return UINT64_MAX;
  EXPECT_EQ(std::memcmp(src.data() + kBytes, src.data(), kReadBytes), 0);
  return initiator->copied_bytes();
}

// An initiator that copies `src` into a target's pool of its size, over
// shm, each engine registered with the other.
struct CopyingPair {
  std::unique_ptr<IoEngine> initiator, target;
  char* pool = nullptr;
  IoEngine::Session session;
};
CopyingPair copying_pair(std::vector<char>& src, bool target_keeps_inbound = true) {
  CopyingPair c;
  c.initiator = IoEngine::create(config("initiator", "shm", true)).value();
  IoEngineConfig target = config("target", "shm", true);
  target.keep_inbound = target_keeps_inbound;
  c.target = IoEngine::create(target).value();
  c.pool = static_cast<char*>(c.target->allocate(src.size()).value());
  const MemoryDesc mine = c.initiator->register_memory(src.data(), src.size()).value();
  const MemoryDesc theirs = c.target->register_memory(c.pool, src.size()).value();
  c.target->release_to_peers();
  EXPECT_TRUE(c.initiator->register_remote_engine(c.target->desc(), {&theirs, 1}).is_ok());
  EXPECT_TRUE(c.target->register_remote_engine(c.initiator->desc()).is_ok());
  c.session = c.initiator->create_session(mine, theirs).value();
  return c;
}

TEST(MoriSharedPool, APoolOnThisHostIsCopiedIntoAndOutOf) {
  // Every body copied (3 MiB, no signal through shm), the read copied.
  EXPECT_EQ(write_then_read("shm", true, true, true), kBytes + kReadBytes);
  EXPECT_EQ(write_then_read("auto", true, true, true), kBytes + kReadBytes);
}

// Each copied write's id reaches the target in a landed message, up to
// kMaxLandedIds (128) a message: 300 one-page writes at once need several.
// A notice sent after them all (send_after) comes too, as a notice.
TEST(MoriSharedPool, EveryCopiedWriteIsHeardToHaveLanded) {
  constexpr size_t kWrites = 300;
  constexpr uint64_t kPage = 4096;
  std::vector<char> src = pattern(kWrites * kPage);
  auto [initiator, target, pool, session] = copying_pair(src);
  std::vector<TransferId> ids;
  for (size_t i = 0; i < kWrites; ++i) {
    const std::vector<uint64_t> at = {i * kPage}, size = {kPage};
    ids.push_back(initiator->allocate_transfer_id());
    ASSERT_TRUE(session.batch_write(at, at, size, ids.back()).is_ok());
  }
  ASSERT_TRUE(initiator->send_after("target", ids, "all of them").is_ok());
  for (TransferId id : ids) ASSERT_TRUE(finished(*initiator, id));
  EXPECT_EQ(initiator->copied_bytes(), kWrites * kPage);
  std::vector<std::string> notices;
  ASSERT_TRUE(testing::poll_until(
      [&] {
        for (auto& m : target->take_messages()) notices.push_back(std::move(m));
        return !notices.empty();
      },
      10s));
  EXPECT_EQ(notices, std::vector<std::string>{"all of them"});
  size_t landed = 0;  // popped in order, within 10 s for them all
  testing::poll_until(
      [&] {
        while (landed < kWrites && target->pop_inbound_transfer_status("initiator", ids[landed])) {
          ++landed;
        }
        return landed == kWrites;
      },
      10s);
  EXPECT_EQ(landed, kWrites);
  EXPECT_EQ(target->dropped_messages(), 0u);
  target->acquire_inbound_writes();
  EXPECT_EQ(std::memcmp(pool, src.data(), src.size()), 0);
}

TEST(MoriSharedPool, OtherMemoryProvidersAndSharedPoolsOffLeaveEveryByteToTheProvider) {
  EXPECT_EQ(write_then_read("shm", true, true, false), 0u);         // ordinary memory
  EXPECT_EQ(write_then_read("tcp;ofi_rxm", true, true, true), 0u);  // not over shm
  EXPECT_EQ(write_then_read("shm", false, true, true), 0u);         // the initiator's off
  EXPECT_EQ(write_then_read("shm", true, true, true, true), 0u);    // not that process
  auto off = IoEngine::create(config("off", "shm", false)).value();
  const auto refused = off->allocate(4096);
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("shared_pools=off"), std::string::npos)
      << refused.status().message();
}

// The transport's engines keep no inbound statuses (they never pop them),
// and their descriptors say so: a copied write to one lands, and its
// notice comes, but nothing of it is kept.
TEST(MoriSharedPool, AnEngineThatKeepsNoInboundStatusesKeepsNone) {
  std::vector<char> src = pattern(4096);
  auto [initiator, target, pool, session] = copying_pair(src, /*target_keeps_inbound=*/false);
  const std::vector<uint64_t> at = {0}, size = {4096};
  const TransferId id = initiator->allocate_transfer_id();
  ASSERT_TRUE(session.batch_write(at, at, size, id).is_ok());
  ASSERT_TRUE(initiator->send_after("target", {&id, 1}, "done").is_ok());
  ASSERT_TRUE(finished(*initiator, id));
  ASSERT_TRUE(testing::poll_until([&] { return !target->take_messages().empty(); }, 10s));
  EXPECT_FALSE(target->pop_inbound_transfer_status("initiator", id));
  EXPECT_EQ(target->dropped_messages(), 0u);
  target->acquire_inbound_writes();
  EXPECT_EQ(std::memcmp(pool, src.data(), 4096), 0);
}

// A failed transfer is over only once no copy of it can land any more: a
// burst copying into a peer's pool is settled before the transfer is
// reported, however long it takes. Here one burst of 256 copies of 64 MiB
// (16 GiB: more than a second on this VM, longer than the 1 s a drain
// waits for a provider that returns nothing) is failed while it copies.
TEST(MoriSharedPool, AFailedTransferIsReportedOnlyOnceItsCopiesAreDone) {
  constexpr uint64_t kBlock = 64 * kMiB;
  constexpr size_t kCopies = 256;  // one burst (kPostBurst)
  std::vector<char> src(kBlock, 7);
  auto initiator = IoEngine::create(config("initiator", "shm", true)).value();
  auto target = IoEngine::create(config("target", "shm", true)).value();
  auto* pool = static_cast<char*>(target->allocate(kBlock).value());
  const MemoryDesc mine = initiator->register_memory(src.data(), src.size()).value();
  const MemoryDesc theirs = target->register_memory(pool, kBlock).value();
  target->release_to_peers();
  ASSERT_TRUE(initiator->register_remote_engine(target->desc(), {&theirs, 1}).is_ok());
  auto session = initiator->create_session(mine, theirs).value();
  // The same block again and again, then 4 KiB (the next burst's).
  std::vector<uint64_t> offsets(kCopies + 1, 0), sizes(kCopies, kBlock);
  sizes.push_back(4096);
  const TransferId id = initiator->allocate_transfer_id();
  ASSERT_TRUE(session.batch_write(offsets, offsets, sizes, id).is_ok());
  // The first copy has begun once the pool's first byte is no longer 0.
  ASSERT_TRUE(testing::poll_until(
      [&] { return std::atomic_ref<char>(pool[0]).load(std::memory_order_relaxed) != 0; }, 20s));
  initiator->cancel_transfer(id, Status::aborted("the test failed it"));
  TransferStatus st;
  ASSERT_TRUE(testing::poll_until(
      [&] { return (st = initiator->transfer_status(id)).state != TransferState::kInProgress; },
      60s));
  EXPECT_EQ(st.state, TransferState::kFailed);
  EXPECT_EQ(initiator->copied_bytes(), kCopies * kBlock);  // every copy was over before
}

// What the decode side's staging choice asks: a source copies into this
// engine's pools when both sides have them, it comes over shm, and this
// process may take files from the source's (the probe of the ptrace
// permission the source needs over this one: here a source whose process
// is not the one described, or whose descriptor names no file to take,
// stands in for a kernel that refuses, which root on this VM never meets).
TEST(MoriSharedPool, ASourceCopiesOnlyWithPoolsOnBothSidesOverShm) {
  auto here = IoEngine::create(config("here", "auto", true)).value();
  auto source = IoEngine::create(config("source", "auto", true)).value();
  std::vector<char> ordinary(4096);
  const MemoryDesc plain = source->register_memory(ordinary.data(), 4096).value();
  const MemoryDesc pooled = source->register_memory(source->allocate(4096).value(), 4096).value();
  EXPECT_FALSE(here->copies_from(source->desc(), {&pooled, 1}));  // none of ours is shared yet
  (void)here->register_memory(here->allocate(8192).value(), 8192).value();
  EXPECT_TRUE(here->copies_from(source->desc(), {&pooled, 1}));
  EXPECT_FALSE(here->copies_from(source->desc(), {&plain, 1}));
  EngineDesc elsewhere = source->desc();
  elsewhere.host_identity = "another host";
  EXPECT_FALSE(here->copies_from(elsewhere, {&pooled, 1}));
  EngineDesc reborn = source->desc();
  reborn.start_time += 1;
  EXPECT_FALSE(here->copies_from(reborn, {&pooled, 1}));
  EngineDesc nothing_to_take = source->desc();
  nothing_to_take.key = "nothing to take";
  nothing_to_take.doorbell = -1;
  MemoryDesc closed = pooled;
  closed.memfd = 1 << 20;  // above any open file's number
  EXPECT_FALSE(here->copies_from(nothing_to_take, {&closed, 1}));
  EXPECT_TRUE(here->copies_from(source->desc(), {&pooled, 1}));  // remembered per engine
}

TEST(MoriSharedPool, TheDescriptorCarriesEachMemorysMemfd) {
  auto e = IoEngine::create(config("e", "shm", true)).value();
  MemoryDesc shared{"e", 0, 0x10000, 4096, {0x1234}, 7, 99};
  MemoryDesc plain{"e", 1, 0x20000, 8192, {0x5678}, -1};
  std::string blob = encode(e->desc(), std::vector<MemoryDesc>{shared, plain});
  EngineDesc desc;
  std::vector<MemoryDesc> memory;
  ASSERT_TRUE(decode(blob, desc, memory).is_ok());
  ASSERT_EQ(memory.size(), 2u);
  EXPECT_EQ(memory[0].memfd, 7);
  EXPECT_EQ(memory[0].memfd_inode, 99u);
  EXPECT_EQ(memory[1].memfd, -1);

  // A number no file descriptor can have is refused, by name: the memfd
  // field follows the first memory's base and length.
  const uint64_t base_and_length[2] = {0x10000, 4096};
  const size_t at = blob.find(std::string(reinterpret_cast<const char*>(base_and_length), 16));
  ASSERT_NE(at, std::string::npos);
  const uint64_t huge = uint64_t{1} << 40;
  std::memcpy(blob.data() + at + 16, &huge, 8);
  const Status refused = decode(blob, desc, memory);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("memfd 1099511627776"), std::string::npos) << refused.message();
}

}  // namespace
}  // namespace pdkv::backends::mori

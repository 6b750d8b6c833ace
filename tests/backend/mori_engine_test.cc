// The mori IO engine's own API (io_engine.h): inbound transfer status on the
// target, provider choice, a dead peer failing in time, and descriptors that
// cannot be trusted. Byte checks use patterns computed here.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>

#include "io_engine.h"
#include "mori_test_support.h"
#include "support/child_process.h"
#include "support/poll.h"

namespace pdkv::backends::mori {
namespace {

using namespace std::chrono_literals;

class MoriEngine : public ::testing::TestWithParam<std::string> {};

// An initiator and a target over one provider, each with its buffer
// registered (`src`, `dst`: they outlive the engines), each knowing the
// other, and a session from `src` to `dst`.
struct Pair {
  std::unique_ptr<IoEngine> initiator, target;
  IoEngine::Session session;
};
Pair connect(const std::string& provider, std::vector<char>& src, std::vector<char>& dst) {
  Pair p;
  p.initiator = IoEngine::create(config("initiator", provider)).value();
  p.target = IoEngine::create(config("target", provider)).value();
  const MemoryDesc mine = p.initiator->register_memory(src.data(), src.size()).value();
  const MemoryDesc theirs = p.target->register_memory(dst.data(), dst.size()).value();
  p.target->release_to_peers();  // the zero fill comes before the peer's writes
  EXPECT_TRUE(p.initiator->register_remote_engine(p.target->desc()).is_ok());
  EXPECT_TRUE(p.target->register_remote_engine(p.initiator->desc()).is_ok());
  p.session = p.initiator->create_session(mine, theirs).value();
  return p;
}

TEST_P(MoriEngine, TheTargetLearnsThatAWholeTransferLanded) {
  std::vector<char> src(1 << 20), dst(1 << 20, 0);  // outlive the engines
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 11 + 7);
  auto [initiator, target, session] = connect(GetParam(), src, dst);
  EXPECT_EQ(initiator->provider_for("target").value(), GetParam());

  const TransferId id = initiator->allocate_transfer_id();
  const std::vector<uint64_t> local = {0, 4096, 300000}, remote = {100, 9000, 500000},
                              sizes = {4096, 1, 200000};
  ASSERT_TRUE(session.batch_write(local, remote, sizes, id).is_ok());
  const TransferStatus st = wait(*initiator, id);
  ASSERT_EQ(st.state, TransferState::kSuccess) << st.error.to_string();
  ASSERT_TRUE(landed(*target, id));
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(std::memcmp(dst.data() + remote[i], src.data() + local[i], sizes[i]), 0) << i;
  }
  EXPECT_EQ(dst[99], 0);                                               // nothing else written
  EXPECT_FALSE(target->pop_inbound_transfer_status("initiator", id));  // consumed
  EXPECT_FALSE(target->pop_inbound_transfer_status("someone else", id));
  // An id is used once; reported transfers are forgotten.
  EXPECT_EQ(session.batch_write(local, remote, sizes, id).code(), StatusCode::kOk);
  EXPECT_EQ(wait(*initiator, id).state, TransferState::kSuccess);
  EXPECT_EQ(initiator->transfer_status(id).error.code(), StatusCode::kNotFound);
  // Out of the buffers: refused before anything is posted.
  const std::vector<uint64_t> far = {(1 << 20) - 10};
  const std::vector<uint64_t> ten = {11};
  EXPECT_EQ(
      session.batch_write(far, std::vector<uint64_t>{0}, ten, initiator->allocate_transfer_id())
          .code(),
      StatusCode::kOutOfRange);
}

// The peer's process is gone before the transfer: it fails, with a reason,
// within the configured timeout (or is refused at once), never hangs.
// Keys are drawn at random (64 bits where the provider takes our keys): a
// peer that knows the engine but not the buffer's descriptor guesses the
// small integers a counter would have given, and writes nothing.
// Thousands of small writes (as the naive mode posts), the target asking
// all the while: the moment it learns the transfer landed, every byte is
// there, whether the signal followed them at once (tcp keeps writes in
// order) or waited for their completions (shm).
TEST_P(MoriEngine, TheTargetLearnsOfManyWritesOnlyOnceEveryByteLanded) {
  constexpr size_t kWrites = 8192, kSize = 512, kBytes = kWrites * kSize;
  std::vector<char> src(kBytes), dst(2 * kBytes, 0);  // outlive the engines
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 13 + 5);
  auto [initiator, target, session] = connect(GetParam(), src, dst);
  // Every other slot of the destination, last write first.
  std::vector<uint64_t> local, remote, sizes;
  for (size_t i = kWrites; i-- > 0;) {
    local.push_back(i * kSize);
    remote.push_back(2 * i * kSize);
    sizes.push_back(kSize);
  }
  const TransferId id = initiator->allocate_transfer_id();
  ASSERT_TRUE(session.batch_write(local, remote, sizes, id).is_ok());
  ASSERT_TRUE(landed(*target, id));
  size_t wrong = 0;
  for (size_t i = 0; i < kWrites; ++i) {
    wrong += std::memcmp(dst.data() + 2 * i * kSize, src.data() + i * kSize, kSize) != 0;
  }
  EXPECT_EQ(wrong, 0u) << "writes missing when the target was told the transfer landed";
  const TransferStatus st = wait(*initiator, id);
  EXPECT_EQ(st.state, TransferState::kSuccess) << st.error.to_string();
}

TEST_P(MoriEngine, AGuessedKeyDoesNotWrite) {
  std::vector<char> src(4096, 'x'), dst(1 << 16, 0);  // outlive the engines
  auto target = IoEngine::create(config("target", GetParam())).value();
  std::vector<MemoryDesc> theirs;
  for (int i = 0; i < 4; ++i) {
    theirs.push_back(target->register_memory(dst.data(), dst.size()).value());
  }
  target->release_to_peers();
  for (const MemoryDesc& d : theirs) {
    for (uint64_t key : d.keys) EXPECT_GT(key, uint64_t{1} << 20) << "a guessable key";
  }
  // A failed write may cost the initiator its connection: one initiator per guess.
  for (uint64_t guess = 0; guess < 2; ++guess) {
    auto initiator =
        IoEngine::create(config("initiator-" + std::to_string(guess), GetParam(), 2s)).value();
    const MemoryDesc mine = initiator->register_memory(src.data(), src.size()).value();
    ASSERT_TRUE(initiator->register_remote_engine(target->desc()).is_ok());
    ASSERT_TRUE(target->register_remote_engine(initiator->desc()).is_ok());
    MemoryDesc forged = theirs[0];
    for (auto& key : forged.keys) key = guess;
    auto session = initiator->create_session(mine, forged);
    ASSERT_TRUE(session.is_ok()) << session.status().to_string();
    const TransferId id = initiator->allocate_transfer_id();
    const std::vector<uint64_t> at = {0}, size = {src.size()};
    if (!session->batch_write(at, at, size, id).is_ok()) continue;  // refused at once: fine
    EXPECT_EQ(wait(*initiator, id).state, TransferState::kFailed) << "key " << guess;
  }
  target->acquire_inbound_writes();
  EXPECT_TRUE(std::all_of(dst.begin(), dst.end(), [](char c) { return c == 0; }));
}

TEST_P(MoriEngine, ADeadPeerFailsInTime) {
  testing::ChildProcess peer(
      {PDKV_BACKEND_PEER, "mori", std::to_string(1 << 20), "provider=" + GetParam()});
  const std::string blob = testing::from_hex(peer.read_line());
  ASSERT_FALSE(blob.empty());
  peer.kill_now();
  EngineDesc remote;
  std::vector<MemoryDesc> memory;
  ASSERT_TRUE(decode(blob, remote, memory).is_ok());
  std::vector<char> src(1 << 20);
  auto engine = IoEngine::create(config("survivor", GetParam(), 1500ms)).value();
  const MemoryDesc mine = engine->register_memory(src.data(), src.size()).value();
  const auto start = std::chrono::steady_clock::now();
  const Status registered = engine->register_remote_engine(remote);
  if (!registered.is_ok()) {  // shm maps the peer's queue at once: gone is gone
    EXPECT_NE(registered.message().find(remote.key), std::string::npos) << registered.message();
    return;
  }
  auto session = engine->create_session(mine, memory.at(0)).value();
  const TransferId id = engine->allocate_transfer_id();
  const std::vector<uint64_t> zero = {0}, size = {1 << 20};
  const Status posted = session.batch_write(zero, zero, size, id);
  if (posted.is_ok()) {
    const TransferStatus st = wait(*engine, id);
    EXPECT_EQ(st.state, TransferState::kFailed);
    EXPECT_FALSE(st.error.message().empty());
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1500ms + 1s);
}

// Messages (send_after) go once every transfer they follow succeeded, and
// never when one of them failed: a notification says the bytes are there.
TEST_P(MoriEngine, AMessageGoesOnlyAfterItsTransfersSucceeded) {
  constexpr size_t kBig = 64 << 20;                // far from done when it is cancelled
  std::vector<char> src(kBig, 'm'), dst(kBig, 0);  // outlive the engines
  auto [initiator, target, session] = connect(GetParam(), src, dst);
  ASSERT_TRUE(initiator->can_message() && target->can_message()) << GetParam();
  auto announced = std::make_shared<std::atomic<int>>(0);
  target->set_message_callback([announced] { ++*announced; });
  const auto write = [&](uint64_t at, uint64_t size) {
    const TransferId id = initiator->allocate_transfer_id();
    const std::vector<uint64_t> offset = {at}, length = {size};
    EXPECT_TRUE(session.batch_write(offset, offset, length, id).is_ok());
    return id;
  };
  // One that follows a transfer cancelled before it could end: dropped.
  const std::vector<TransferId> doomed = {write(0, 4096), write(8192, kBig - 8192)};
  ASSERT_TRUE(initiator->send_after("target", doomed, "dropped").is_ok());
  initiator->cancel_transfer(doomed[1], Status::aborted("cancelled by the test"));
  EXPECT_EQ(wait(*initiator, doomed[1]).state, TransferState::kFailed);
  // One that follows a transfer that succeeds; once it arrived, one that
  // follows none, sent at once (behind a "dropped" sent wrongly, as one
  // peer's messages arrive in the order they were sent).
  std::vector<std::string> got;
  const auto take_until = [&](size_t count) {
    return testing::poll_until(
        [&] {
          for (auto& m : target->take_messages()) got.push_back(std::move(m));
          return got.size() >= count;
        },
        20s);
  };
  const std::vector<TransferId> fine = {write(4096, 4096)};
  ASSERT_TRUE(initiator->send_after("target", fine, "sent").is_ok());
  ASSERT_TRUE(take_until(1));
  target->acquire_inbound_writes();
  EXPECT_EQ(std::memcmp(dst.data() + 4096, src.data() + 4096, 4096), 0);  // there before "sent"
  ASSERT_TRUE(initiator->send_after("target", {}, "last").is_ok());
  ASSERT_TRUE(take_until(2)) << got.size() << " messages";
  EXPECT_EQ(got, (std::vector<std::string>{"sent", "last"}));
  EXPECT_GT(announced->load(), 0);
  EXPECT_EQ(
      initiator->send_after("target", {}, std::string(IoEngine::kMaxMessageBytes + 1, 'x')).code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(initiator->send_after("nobody", {}, "x").code(), StatusCode::kNotFound);
}

// A message must begin with the target's inbox key, which only its
// descriptor gives out (with the memory keys): one that does not is
// dropped, whoever can reach the endpoint's address.
TEST_P(MoriEngine, AMessageWithoutTheInboxKeyIsDropped) {
  std::vector<char> src(4096), dst(4096);  // outlive the engines
  auto [initiator, target, session] = connect(GetParam(), src, dst);
  auto forger = IoEngine::create(config("forger", GetParam())).value();
  EngineDesc guessed = target->desc();
  ASSERT_NE(guessed.inbox_key, 0u);
  guessed.inbox_key ^= 1;
  ASSERT_TRUE(forger->register_remote_engine(guessed).is_ok());
  ASSERT_TRUE(target->register_remote_engine(forger->desc()).is_ok());
  ASSERT_TRUE(forger->send_after("target", {}, "forged").is_ok());
  ASSERT_TRUE(testing::poll_until([&] { return target->dropped_messages() == 1; }, 20s));
  EXPECT_TRUE(target->take_messages().empty());
  ASSERT_TRUE(initiator->send_after("target", {}, "genuine").is_ok());
  std::vector<std::string> got;
  ASSERT_TRUE(testing::poll_until([&] { return !(got = target->take_messages()).empty(); }, 20s));
  EXPECT_EQ(got, std::vector<std::string>{"genuine"});
}

// One transfer over two buffer pairs (a KV batch touches a K and a V
// buffer per layer): the target is told once that it landed, and by then
// every byte of both pairs is there. A piece out of its buffers, or naming
// another engine or a buffer not registered here, refuses the whole
// transfer: it never exists, and nothing of it lands, not even once a later
// transfer to the same peer (posted after it, in order) has.
TEST_P(MoriEngine, ATransferOverTwoBufferPairsLandsWholeOrIsRefusedWhole) {
  constexpr size_t kBytes = 1 << 18, kWrites = 64, kSize = 512;
  std::vector<char> src_a(kBytes), src_b(kBytes), dst_a(kBytes, 0), dst_b(kBytes, 0);
  for (size_t i = 0; i < kBytes; ++i) {
    src_a[i] = static_cast<char>(i * 7 + 1);
    src_b[i] = static_cast<char>(i * 5 + 3);
  }
  auto initiator = IoEngine::create(config("initiator", GetParam())).value();
  auto target = IoEngine::create(config("target", GetParam())).value();
  const MemoryDesc a = initiator->register_memory(src_a.data(), kBytes).value();
  const MemoryDesc b = initiator->register_memory(src_b.data(), kBytes).value();
  const MemoryDesc to_a = target->register_memory(dst_a.data(), kBytes).value();
  const MemoryDesc to_b = target->register_memory(dst_b.data(), kBytes).value();
  target->release_to_peers();
  ASSERT_TRUE(initiator->register_remote_engine(target->desc()).is_ok());
  ASSERT_TRUE(target->register_remote_engine(initiator->desc()).is_ok());
  // a -> to_b and b -> to_a, crossed, every other slot, last write first;
  // the refused transfers aim at the slots between.
  std::vector<uint64_t> at, to, between, sizes;
  for (size_t i = kWrites; i-- > 0;) {
    at.push_back(i * kSize);
    to.push_back(2 * i * kSize);
    between.push_back(2 * i * kSize + kSize);
    sizes.push_back(kSize);
  }
  const auto between_untouched = [&] {
    const std::vector<char> zeros(kSize, 0);
    size_t written = 0;
    for (uint64_t slot : between) {
      written += std::memcmp(dst_a.data() + slot, zeros.data(), kSize) != 0;
      written += std::memcmp(dst_b.data() + slot, zeros.data(), kSize) != 0;
    }
    return written == 0;
  };
  const std::vector<IoEngine::Piece> crossed = {{&a, &to_b, at, to, sizes},
                                                {&b, &to_a, at, to, sizes}};
  const TransferId id = initiator->allocate_transfer_id();
  ASSERT_TRUE(initiator->batch_write(crossed, id).is_ok());
  ASSERT_TRUE(landed(*target, id));
  size_t wrong = 0;
  for (size_t i = 0; i < kWrites; ++i) {
    wrong += std::memcmp(dst_b.data() + 2 * i * kSize, src_a.data() + i * kSize, kSize) != 0;
    wrong += std::memcmp(dst_a.data() + 2 * i * kSize, src_b.data() + i * kSize, kSize) != 0;
  }
  EXPECT_EQ(wrong, 0u) << "writes missing when the target was told the transfer landed";
  EXPECT_TRUE(between_untouched()) << "the transfer wrote outside its slots";
  EXPECT_EQ(wait(*initiator, id).state, TransferState::kSuccess);

  const std::vector<uint64_t> far = {kBytes - 10}, zero = {0}, eleven = {11};
  MemoryDesc strangers = to_a;
  strangers.engine_key = "someone else";
  MemoryDesc not_ours = b;
  not_ours.id = 99;
  MemoryDesc moved = b;  // the registered buffer's id, another place
  moved.base += kBytes;
  struct Refused {
    std::vector<IoEngine::Piece> pieces;
    StatusCode code;
    std::string names;
  };
  const std::vector<Refused> refused = {
      {{{&a, &to_b, at, between, sizes}, {&b, &to_a, far, zero, eleven}},
       StatusCode::kOutOfRange,
       "piece 1 op 0: 11 bytes at local 262134"},
      {{{&a, &to_b, at, between, sizes}, {&b, &strangers, at, between, sizes}},
       StatusCode::kInvalidArgument,
       "engine 'someone else', where piece 0 names 'target'"},
      {{{&a, &to_b, at, between, sizes}, {&not_ours, &to_a, at, between, sizes}},
       StatusCode::kInvalidArgument,
       "memory 99 of engine 'initiator' is not registered here"},
      {{{&a, &to_b, at, between, sizes}, {&moved, &to_a, at, between, sizes}},
       StatusCode::kInvalidArgument,
       fmt::format("memory 1 of engine 'initiator' is not registered here as {} bytes at {:#x}",
                   kBytes, moved.base)},
      {{}, StatusCode::kInvalidArgument, "no buffers"},
  };
  for (const Refused& r : refused) {
    const TransferId never = initiator->allocate_transfer_id();
    const Status st = initiator->batch_write(r.pieces, never);
    EXPECT_EQ(st.code(), r.code) << st.to_string();
    EXPECT_NE(st.message().find(r.names), std::string::npos) << st.message();
    EXPECT_EQ(initiator->transfer_status(never).error.code(), StatusCode::kNotFound)
        << r.names << ": the refused transfer exists";
  }
  const std::vector<uint64_t> last = {kBytes - kSize}, one_slot = {kSize};
  const std::vector<IoEngine::Piece> later = {{&a, &to_a, zero, last, one_slot}};
  const TransferId after = initiator->allocate_transfer_id();
  ASSERT_TRUE(initiator->batch_write(later, after).is_ok());
  ASSERT_TRUE(landed(*target, after));
  EXPECT_EQ(std::memcmp(dst_a.data() + kBytes - kSize, src_a.data(), kSize), 0);
  EXPECT_TRUE(between_untouched()) << "a refused transfer wrote";
}

INSTANTIATE_TEST_SUITE_P(Providers, MoriEngine, ::testing::Values("shm", "tcp;ofi_rxm"),
                         [](const auto& info) {
                           return info.param == "shm" ? std::string("shm") : std::string("tcp");
                         });

// A byte of a buffer the provider may be writing into now: a peek, not a
// synchronisation (the provider's side is plain stores, which
// ThreadSanitizer would take for a race with any read of ours).
__attribute__((no_sanitize("thread"))) char peek(const char* byte) {
  return *static_cast<const volatile char*>(byte);
}

// A source's connection closed by the fence while the target is part-way
// through its write: libfabric 1.17's tcp reports a half-received write that
// carries remote CQ data with no context, and rxm's error handler
// dereferences it (a SIGSEGV in fi_av_remove, seen twice in the fault
// campaign). The signal is therefore a write of no bytes of its own over
// tcp;ofi_rxm (IoEngine::Impl::signal_after): here one 64 MiB write is
// fenced while it arrives, and its transfer still ends.
TEST(MoriEngineTcp, AFenceWhileATransferArrivesIsNoCrash) {
  std::vector<char> src(64 << 20, 5), dst(64 << 20, 0);
  auto [initiator, target, session] = connect("tcp;ofi_rxm", src, dst);
  ASSERT_TRUE(target->can_fence());
  const TransferId id = initiator->allocate_transfer_id();
  const std::vector<uint64_t> at_start = {0}, sizes = {src.size()};
  ASSERT_TRUE(session.batch_write(at_start, at_start, sizes, id).is_ok());
  // Part-way in: its first bytes are here (and, at 64 MiB, hardly its last).
  ASSERT_TRUE(testing::poll_until([&] { return peek(&dst[0]) != 0; }, 20s));
  EXPECT_TRUE(target->fence_peer(initiator->desc()));
  EXPECT_NE(wait(*initiator, id).state, TransferState::kInProgress);
}

TEST(MoriEngineAuto, ShmOnThisHostTcpToAnother) {
  auto a = IoEngine::create(config("a", "auto")).value();
  auto b = IoEngine::create(config("b", "auto")).value();
  ASSERT_TRUE(a->register_remote_engine(b->desc()).is_ok());
  EXPECT_EQ(a->provider_for("b").value(), "shm");
  EngineDesc elsewhere = b->desc();
  elsewhere.key = "b-elsewhere";
  elsewhere.host_identity = "another host";
  ASSERT_TRUE(a->register_remote_engine(elsewhere).is_ok());
  EXPECT_EQ(a->provider_for("b-elsewhere").value(), "tcp;ofi_rxm");
  // Only shm in common, on another host: refused, naming both sides.
  EngineDesc shm_only = elsewhere;
  shm_only.key = "c";
  shm_only.endpoints = {elsewhere.endpoints.front()};
  ASSERT_EQ(shm_only.endpoints.front().provider, "shm");
  const Status refused = a->register_remote_engine(shm_only);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("shares no usable provider"), std::string::npos)
      << refused.message();
}

// A killed process leaves its shm regions in /dev/shm, named after its pid
// and holding it. A later process that gets the same pid finds them when it
// opens its own: libfabric takes such a region for a live process's (that
// pid is alive: it is this one) and refuses with EBUSY, unless the stale
// region of the endpoint's own name is removed first. Reproduced here with
// copies of this process's first region under the names its next endpoints
// will take.
TEST(MoriEngineShm, OpensOverARegionAKilledProcessOfItsPidLeft) {
  const std::string prefix = std::to_string(::getpid()) + ":" + std::to_string(::getuid()) + ":";
  auto first = IoEngine::create(config("first", "shm")).value();
  int newest = -1;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0)
      newest = std::max(newest, std::stoi(name.substr(prefix.size())));
  }
  ASSERT_GE(newest, 0) << "no shm region of this process in /dev/shm";
  const std::string live = "/dev/shm/" + prefix + std::to_string(newest);
  std::vector<std::string> stale;
  for (int next = newest + 1; next <= newest + 4; ++next) {
    stale.push_back("/dev/shm/" + prefix + std::to_string(next));
    std::filesystem::copy_file(live, stale.back());
  }
  auto second = IoEngine::create(config("second", "shm"));
  EXPECT_TRUE(second.is_ok()) << second.status().to_string();
  second = Status::aborted("closed");  // the engines go before the copies left over
  first.reset();
  for (const std::string& f : stale) std::filesystem::remove(f);
}

// The engine's transfer timeout (transport option transfer_timeout_ms) is
// how long a transfer may take, unless the backend's own timeout_ms says
// otherwise, whichever comes first in the options.
TEST(MoriOptions, TheTransferTimeoutIsTheEnginesUnlessSet) {
  EXPECT_EQ(config_from({}).value().transfer_timeout, 30s);
  EXPECT_EQ(config_from({{"transfer_timeout_ms", "123000"}}).value().transfer_timeout, 123s);
  EXPECT_EQ(config_from({{"transfer_timeout_ms", "123000"}, {"timeout_ms", "300"}})
                .value()
                .transfer_timeout,
            300ms);
  const auto zero = config_from({{"transfer_timeout_ms", "0"}});
  ASSERT_FALSE(zero.is_ok());
  EXPECT_NE(zero.status().message().find("transfer_timeout_ms"), std::string::npos)
      << zero.status().to_string();
}

TEST(MoriEngineAuto, BrokenDescriptorsAreRefusedNotCrashes) {
  auto e = IoEngine::create(config("e", "auto")).value();
  std::vector<char> buffer(4096);
  const MemoryDesc md = e->register_memory(buffer.data(), buffer.size()).value();
  const std::string good = encode(e->desc(), std::vector<MemoryDesc>{md});
  EngineDesc desc;
  std::vector<MemoryDesc> memory;
  ASSERT_TRUE(decode(good, desc, memory).is_ok());
  EXPECT_EQ(memory.at(0).length, 4096u);
  for (size_t n = 0; n < good.size(); ++n) {
    ASSERT_EQ(decode(good.substr(0, n), desc, memory).code(), StatusCode::kInvalidArgument) << n;
  }
  std::mt19937 rng(9);
  for (int i = 0; i < 200; ++i) {
    std::string noise(rng() % 300, '\0');
    for (auto& c : noise) c = static_cast<char>(rng());
    EXPECT_EQ(decode(noise, desc, memory).code(), StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace pdkv::backends::mori

// Several engines in one process over loopback: every transferred byte is
// checked against the oracle, for the heterogeneous-TP cases of DESIGN §3.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <numeric>
#include <random>

#include "support/cluster.h"
#include "support/loopback_transport.h"

namespace pdkv {
namespace {

using testing::Cluster;
using testing::ClusterSpec;
using testing::first_pages;
using testing::poll_until;
using testing::shape;
using namespace std::chrono_literals;

struct Case {
  std::string name;
  ClusterSpec spec;
  int chunks = 1;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<uint64_t> pages_of(uint64_t count, uint64_t pool, uint32_t seed) {
  std::vector<uint64_t> all(pool);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), std::mt19937(seed));
  all.resize(count);
  return all;
}

class Transfer : public ::testing::TestWithParam<Case> {};

TEST_P(Transfer, EveryByteArrives) {
  const Case& c = GetParam();
  auto cluster = Cluster::start(c.spec);
  ASSERT_NE(cluster, nullptr);
  const RoomId room = 4242;
  const uint64_t n = 5;
  const auto src_pages = pages_of(n, c.spec.kv.num_pages, 3);
  const auto dst_pages = pages_of(n, c.spec.kv.num_pages, 17);
  const std::vector<uint32_t> src_state =
      c.spec.state.channels ? std::vector<uint32_t>{2, 0} : std::vector<uint32_t>{};
  const std::vector<uint32_t> dst_state =
      c.spec.state.channels ? std::vector<uint32_t>{1, 3} : std::vector<uint32_t>{};
  cluster->fill(room, src_pages, 1, src_state);

  std::vector<std::unique_ptr<Receiver>> receivers;
  for (auto& e : cluster->decode) {
    receivers.push_back(std::move(e->receiver(room, c.spec.prefill_id)).value());
    ASSERT_TRUE(receivers.back()->init().is_ok());
    ASSERT_TRUE(receivers.back()->send_metadata(dst_pages, 2, dst_state).is_ok());
  }
  std::vector<std::unique_ptr<Sender>> senders;
  for (auto& e : cluster->prefill) {
    senders.push_back(std::move(e->sender(room, c.spec.decode_id)).value());
    ASSERT_TRUE(senders.back()->init(n, 1, src_state).is_ok());
    // Chunked prefill: the request's pages arrive in `chunks` sends.
    uint64_t sent = 0;
    for (int k = 1; k <= c.chunks; ++k) {
      const uint64_t upto = n * k / c.chunks;
      ASSERT_TRUE(senders.back()
                      ->send(std::span(src_pages).subspan(sent, upto - sent), k == c.chunks)
                      .is_ok());
      sent = upto;
    }
  }
  auto all_done = [&] {
    for (auto& r : receivers)
      if (r->poll() != PollState::kSuccess && r->poll() != PollState::kFailed) return false;
    for (auto& s : senders)
      if (s->poll() != PollState::kSuccess && s->poll() != PollState::kFailed) return false;
    return true;
  };
  ASSERT_TRUE(poll_until(all_done));
  for (auto& r : receivers) EXPECT_EQ(r->poll(), PollState::kSuccess) << r->failure().to_string();
  for (auto& s : senders) EXPECT_EQ(s->poll(), PollState::kSuccess) << s->failure().to_string();
  EXPECT_EQ(cluster->verify(room, dst_pages, 2, dst_state), "");
  // Staging on: every route went through it, on both sides.
  uint64_t staged = 0, direct = 0;
  for (auto& e : cluster->prefill) {
    staged += e->stats().staged_routes;
    direct += e->stats().direct_routes;
  }
  if (c.spec.staging == Staging::kOn) {
    EXPECT_GT(staged, 0u);
    EXPECT_EQ(direct, 0u);
  } else if (c.spec.staging == Staging::kOff) {
    EXPECT_EQ(staged, 0u);
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  out.push_back({"h8_tp4_to_2", shape(8, 4, 2)});
  out.push_back({"h8_tp2_to_4", shape(8, 2, 4)});
  out.push_back({"h2_tp1_to_4_gqa", shape(2, 1, 4)});
  out.push_back({"h2_tp4_to_1_idle_sources", shape(2, 4, 1)});
  out.push_back({"h8_tp2_to_2_equal", shape(8, 2, 2)});
  auto mla = [](uint32_t p, uint32_t d) {
    ClusterSpec s = shape(1, p, d);
    s.kv.mla = true;
    return s;
  };
  out.push_back({"mla_tp4_to_2", mla(4, 2)});
  out.push_back({"mla_tp2_to_4", mla(2, 4)});
  ClusterSpec hnd = shape(8, 2, 4);
  hnd.kv.layout = Layout::kHnd;
  hnd.decode_layout = Layout::kHnd;
  out.push_back({"hnd_h8_tp2_to_4", hnd});
  ClusterSpec mixed = shape(8, 4, 2);
  mixed.decode_layout = Layout::kHnd;
  out.push_back({"nhd_to_hnd_h8_tp4_to_2", mixed});
  ClusterSpec pp = shape(8, 2, 4);
  pp.prefill_pp = 2;
  out.push_back({"pp2_to_pp1_h8_tp2_to_4", pp});
  ClusterSpec pp_d = shape(4, 1, 2);
  pp_d.decode_pp = 2;
  out.push_back({"pp1_to_pp2_h4_tp1_to_2", pp_d});
  out.push_back({"chunked_h8_tp2_to_4", shape(8, 2, 4), 3});
  // Aux from the last prefill stage, even to a decode stage fed by stage 0.
  ClusterSpec pp_aux = shape(8, 2, 2);
  pp_aux.prefill_pp = 2;
  pp_aux.decode_pp = 2;
  pp_aux.aux_items = {16, 4};
  out.push_back({"aux_pp2_to_pp2_h8_tp2_to_2", pp_aux});
  ClusterSpec extras = shape(8, 4, 2);
  extras.aux_items = {24, 8, 4};  // several aux buffers, each its own item length
  extras.state = StateSpec{4, 6, 4};
  out.push_back({"aux_state_h8_tp4_to_2", extras, 2});
  ClusterSpec extras_gqa = shape(2, 1, 4);
  extras_gqa.aux_items = {8};
  extras_gqa.state = StateSpec{2, 3, 4};  // 2 channels over TP 4: replicated like heads
  out.push_back({"aux_state_h2_tp1_to_4", extras_gqa});
  // Staging: gathered at the source, one block, scattered at the destination.
  for (auto [name, p, d, heads] : {std::tuple{"staging_h8_tp4_to_2", 4u, 2u, 8u},
                                   std::tuple{"staging_h8_tp2_to_4", 2u, 4u, 8u},
                                   std::tuple{"staging_h2_tp1_to_4_gqa", 1u, 4u, 2u}}) {
    ClusterSpec st = shape(heads, p, d);
    st.staging = Staging::kOn;
    out.push_back({name, st, 2});
  }
  ClusterSpec st_mla = shape(1, 2, 4);
  st_mla.kv.mla = true;
  st_mla.staging = Staging::kOn;
  out.push_back({"staging_mla_tp2_to_4", st_mla});
  ClusterSpec st_hnd = shape(8, 2, 4);
  st_hnd.kv.layout = Layout::kHnd;
  st_hnd.decode_layout = Layout::kHnd;
  st_hnd.staging = Staging::kAuto;  // tiny fragments here: auto stages
  st_hnd.aux_items = {8, 12};
  st_hnd.state = StateSpec{4, 6, 4};
  out.push_back({"staging_auto_hnd_aux_state_h8_tp2_to_4", st_hnd});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Engines, Transfer, ::testing::ValuesIn(cases()));

// A source hears that its success report was taken before the decode rank
// scatters what it staged: the scatter of a long request takes seconds and
// must not run out the source's call. The hook holds the decode engine's
// loop where it makes the reported bytes visible, before the scatter, until
// the Sender reached Success (30 s at most, longer than the Sender is given),
// which only the decode rank's answer can bring about. The hook sees every
// engine's calls; only the decode engine makes any. The success travels by
// the call alone here (no notice over the data plane, whose success has no
// answer to wait for and would be held by the hook instead).
TEST(StagedReport, TheSourceHearsItWasTakenBeforeTheScatter) {
  ClusterSpec spec = shape(8, 1, 1);
  spec.staging = Staging::kOn;
  spec.prefill_transport = spec.decode_transport = {{"notifications", "0"}};
  std::atomic<bool> sender_succeeded{false};
  std::atomic<int> held{0}, answered_while_held{0};
  auto cluster = Cluster::start(spec);
  ASSERT_NE(cluster, nullptr);
  struct HookReset {
    ~HookReset() { testing::set_acquire_hook({}); }
  } reset;
  testing::set_acquire_hook([&] {
    ++held;
    if (poll_until([&] { return sender_succeeded.load(); }, 30s)) ++answered_while_held;
  });
  const RoomId room = 99;
  const uint64_t n = 4;
  const auto src_pages = pages_of(n, spec.kv.num_pages, 5);
  const auto dst_pages = pages_of(n, spec.kv.num_pages, 9);
  cluster->fill(room, src_pages, 1, {});
  auto receiver = std::move(cluster->decode[0]->receiver(room, spec.prefill_id)).value();
  ASSERT_TRUE(receiver->init().is_ok());
  ASSERT_TRUE(receiver->send_metadata(dst_pages, 2, {}).is_ok());
  auto sender = std::move(cluster->prefill[0]->sender(room, spec.decode_id)).value();
  ASSERT_TRUE(sender->init(n, 1, {}).is_ok());
  ASSERT_TRUE(sender->send(src_pages, true).is_ok());

  ASSERT_TRUE(poll_until([&] { return sender->poll() == PollState::kSuccess; }, 20s))
      << sender->failure().to_string();
  sender_succeeded = true;
  ASSERT_TRUE(poll_until([&] { return receiver->poll() == PollState::kSuccess; }))
      << receiver->failure().to_string();
  EXPECT_EQ(held.load(), 1);
  EXPECT_EQ(answered_while_held.load(), 1) << "the answer waited for the scatter";
  EXPECT_EQ(cluster->verify(room, dst_pages, 2, {}), "");
  uint64_t staged = 0;
  for (auto& e : cluster->prefill) staged += e->stats().staged_routes;
  EXPECT_EQ(staged, 1u);
}

}  // namespace
}  // namespace pdkv

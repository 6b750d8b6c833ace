// Engine::create without pools: the engine sizes them from its configuration
// and allocates them (here from ordinary memory: the loopback transport
// offers none of its own). Expected sizes are worked out by hand below.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "pdkv/bootstrap.h"
#include "pdkv/engine.h"

namespace pdkv {
namespace {

bool all_zero(const MemoryRegion& r) {
  const auto* p = static_cast<const uint8_t*>(r.base);
  return std::all_of(p, p + r.length, [](uint8_t b) { return b == 0; });
}

TEST(EnginePools, SizedFromTheConfigurationZeroedAndDisjoint) {
  auto bootstrap = BootstrapServer::start("127.0.0.1:0");
  ASSERT_TRUE(bootstrap.is_ok()) << bootstrap.status().to_string();
  EngineConfig cfg;
  cfg.role = Role::kDecode;
  cfg.engine_id = "decode";
  cfg.tp_rank = 1;
  cfg.tp_size = 2;
  // 8 heads x 4 elements x 2 B, 4 tokens a page, 4 layers, 16 pages.
  cfg.kv = KvSpec{8, 4, 2, 4, 4, 16, Layout::kHnd, false};
  cfg.aux_item_bytes = {16, 8};  // two aux buffers, as SGLang has several
  cfg.aux_slots = 4;
  cfg.state = StateSpec{8, 4, 2};  // 8 channels of 4 B, 2 slots
  cfg.staging = Staging::kOn;
  cfg.staging_bytes = 4096;
  cfg.backend = "loopback";
  cfg.bootstrap_address = "127.0.0.1:" + std::to_string((*bootstrap)->port());
  auto engine = Engine::create(cfg);
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  const EnginePools& pools = (*engine)->pools();

  // TP 2 of 8 heads: 4 heads here. A page: 4 tokens x 4 heads x 4 x 2 B =
  // 128 B; a buffer: 16 pages = 2048 B; 4 layers x (K, V) = 8 buffers.
  ASSERT_EQ(pools.kv.size(), 8u);
  for (const MemoryRegion& r : pools.kv) EXPECT_EQ(r.length, 2048u);
  ASSERT_EQ(pools.aux.size(), 2u);
  EXPECT_EQ(pools.aux[0].length, 64u);  // 4 slots x 16 B
  EXPECT_EQ(pools.aux[1].length, 32u);  // 4 slots x 8 B
  // 2 slots x 4 layers x 4 local channels (8 / TP 2) x 4 B.
  EXPECT_EQ(pools.state.length, 128u);
  EXPECT_EQ(pools.staging.length, 4096u);

  std::vector<MemoryRegion> all = pools.kv;
  all.insert(all.end(), pools.aux.begin(), pools.aux.end());
  all.push_back(pools.state);
  all.push_back(pools.staging);
  std::sort(all.begin(), all.end(),
            [](const MemoryRegion& a, const MemoryRegion& b) { return a.base < b.base; });
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(all[i].kind, MemoryKind::kHost);
    EXPECT_TRUE(all_zero(all[i])) << "region " << i;
    if (i > 0) {
      EXPECT_LE(static_cast<const char*>(all[i - 1].base) + all[i - 1].length,
                static_cast<const char*>(all[i].base))
          << "regions " << i - 1 << " and " << i << " overlap";
    }
  }
}

TEST(EnginePools, NoAuxStateOrStagingMeansNoSuchRegion) {
  auto bootstrap = BootstrapServer::start("127.0.0.1:0");
  ASSERT_TRUE(bootstrap.is_ok()) << bootstrap.status().to_string();
  EngineConfig cfg;
  cfg.engine_id = "prefill";
  cfg.kv = KvSpec{1, 576, 2, 16, 2, 8, Layout::kNhd, true};  // MLA: one latent
  cfg.staging = Staging::kOff;
  cfg.backend = "loopback";
  cfg.bootstrap_address = "127.0.0.1:" + std::to_string((*bootstrap)->port());
  auto engine = Engine::create(cfg);
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  const EnginePools& pools = (*engine)->pools();
  ASSERT_EQ(pools.kv.size(), 2u);  // 2 layers x 1 latent
  for (const MemoryRegion& r : pools.kv) EXPECT_EQ(r.length, 8u * 16 * 576 * 2);
  EXPECT_TRUE(pools.aux.empty());
  EXPECT_EQ(pools.state.base, nullptr);
  EXPECT_EQ(pools.staging.base, nullptr);
}

}  // namespace
}  // namespace pdkv

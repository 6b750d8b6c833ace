// The staging kernels against the host gather()/scatter() (the reference,
// checked on its own by the planner tests): random page lists and pool
// bytes, every layout pair, heterogeneous TP and MLA; byte exact, whole
// buffers compared, so a stray write fails too. Skips, saying so, when the
// build has no GPU runtime or the machine no device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "engine/pool_memory.h"
#include "gpu/gpu.h"
#include "pdkv/plan.h"
#include "support/route_case.h"

namespace pdkv {
namespace {

using testing::RouteCase;

class StagingKernel : public ::testing::TestWithParam<std::tuple<MemoryKind, RouteCase>> {
 protected:
  void SetUp() override {
    auto rt = gpu::runtime(std::get<0>(GetParam()));
    if (!rt.is_ok()) GTEST_SKIP() << "no GPU runtime in this build: " << rt.status().message();
    if ((*rt)->device_count() == 0) {
      GTEST_SKIP() << "no " << memory_kind_name(std::get<0>(GetParam()))
                   << " device on this machine: GPU staging kernels not run";
    }
    runtime_ = *rt;
    stager_ = runtime_->stager(0).value();
  }

  void TearDown() override {
    for (void* p : device_) runtime_->release(0, p);
  }

  // A device buffer holding `bytes`.
  MemoryRegion upload(const std::vector<std::byte>& bytes) {
    void* p = runtime_->allocate(0, bytes.size()).value();
    device_.push_back(p);
    EXPECT_TRUE(runtime_->copy(p, bytes.data(), bytes.size()).is_ok());
    return {p, bytes.size(), std::get<0>(GetParam()), 0};
  }
  std::vector<std::byte> download(const MemoryRegion& r) {
    std::vector<std::byte> out(r.length);
    EXPECT_TRUE(runtime_->copy(out.data(), r.base, r.length).is_ok());
    return out;
  }

  gpu::Runtime* runtime_ = nullptr;
  std::unique_ptr<gpu::Stager> stager_;
  std::vector<void*> device_;
};

std::vector<std::byte> random_bytes(std::mt19937_64& rng, uint64_t n) {
  std::vector<std::byte> v(n);
  for (auto& b : v) b = std::byte(rng() & 0xff);
  return v;
}

TEST_P(StagingKernel, GatherAndScatterMatchTheHostByteForByte) {
  const RouteCase& c = std::get<1>(GetParam());
  std::mt19937_64 rng(0x5eed ^ c.heads ^ (c.src_tp << 8) ^ (c.dst_tp << 16));
  // 128 elements x 2 B per head (MLA: a 576-wide latent), 16 tokens a page,
  // 3 layers, 40 pages.
  const auto r = testing::route_shards(c, c.mla ? 576 : 128, 16, 3, 40);
  const RankShard& src = r.src;
  const RankShard& dst = r.dst;

  // 23 request pages scattered over both pools, some runs consecutive.
  std::vector<uint64_t> src_pages(40), dst_pages(40);
  std::iota(src_pages.begin(), src_pages.end(), 0);
  std::iota(dst_pages.begin(), dst_pages.end(), 0);
  std::shuffle(src_pages.begin(), src_pages.end(), rng);
  std::shuffle(dst_pages.begin(), dst_pages.end(), rng);
  src_pages.resize(23);
  dst_pages.resize(23);
  std::sort(src_pages.begin(), src_pages.begin() + 8);  // a few consecutive runs
  std::sort(dst_pages.begin(), dst_pages.begin() + 8);

  Planner planner;
  const TransferPlan plan = planner.plan(src, dst, r.route, src_pages, dst_pages).value();
  ASSERT_GT(plan.bytes(), 0u);
  const uint32_t buffers = 3 * src.spec.buffers_per_layer();

  std::vector<std::vector<std::byte>> src_host, dst_host;
  std::vector<MemoryRegion> src_dev, dst_dev;
  for (uint32_t b = 0; b < buffers; ++b) {
    src_host.push_back(random_bytes(rng, 40 * src.spec.page_bytes(src.heads.count)));
    dst_host.push_back(random_bytes(rng, 40 * dst.spec.page_bytes(dst.heads.count)));
    src_dev.push_back(upload(src_host.back()));
    dst_dev.push_back(upload(dst_host.back()));
  }

  // Reference: the host gather.
  std::vector<std::byte> want(plan.bytes());
  std::vector<std::span<const std::byte>> src_spans(src_host.begin(), src_host.end());
  ASSERT_TRUE(gather(plan, src_spans, want).is_ok());

  // Kernel gather into pinned host memory (page-aligned, as the engine's) ...
  const auto pinned_memory = engine::HostMapping::map(plan.bytes() + 64).value();
  const std::span<std::byte> pinned(static_cast<std::byte*>(pinned_memory.region().base),
                                    plan.bytes() + 64);
  std::fill(pinned.begin(), pinned.end(), std::byte{0xEE});
  void* alias = runtime_->pin(pinned.data(), pinned.size()).value();
  auto ticket = stager_->gather(plan, src_dev, static_cast<std::byte*>(alias) + 32, plan.bytes());
  ASSERT_TRUE(ticket.is_ok()) << ticket.status().to_string();
  ASSERT_TRUE(stager_->wait(*ticket).is_ok());
  EXPECT_EQ(std::memcmp(pinned.data() + 32, want.data(), want.size()), 0);
  EXPECT_EQ(pinned[31], std::byte{0xEE});
  EXPECT_EQ(pinned[32 + want.size()], std::byte{0xEE});
  runtime_->unpin(pinned.data());

  // ... and into device memory.
  std::vector<std::byte> zeros(plan.bytes());
  const MemoryRegion staging_dev = upload(zeros);
  ticket = stager_->gather(plan, src_dev, staging_dev.base, staging_dev.length);
  ASSERT_TRUE(ticket.is_ok()) << ticket.status().to_string();
  ASSERT_TRUE(stager_->wait(*ticket).is_ok());
  EXPECT_TRUE(download(staging_dev) == want);

  // Scatter random staged bytes; every byte of every destination buffer
  // must equal the host scatter's result.
  const std::vector<std::byte> staged = random_bytes(rng, plan.bytes());
  const MemoryRegion staged_dev = upload(staged);
  std::vector<std::span<std::byte>> dst_spans(dst_host.begin(), dst_host.end());
  ASSERT_TRUE(scatter(plan, staged, dst_spans).is_ok());
  ticket = stager_->scatter(plan, staged_dev.base, staged_dev.length, dst_dev);
  ASSERT_TRUE(ticket.is_ok()) << ticket.status().to_string();
  EXPECT_TRUE(stager_->wait(*ticket).is_ok());
  for (uint32_t b = 0; b < buffers; ++b) {
    EXPECT_TRUE(download(dst_dev[b]) == dst_host[b]) << "destination buffer " << b;
  }

  // Bounds are checked before anything is enqueued.
  auto refused = stager_->gather(plan, src_dev, staging_dev.base, plan.bytes() - 1);
  EXPECT_EQ(refused.status().code(), StatusCode::kOutOfRange);
}

INSTANTIATE_TEST_SUITE_P(Cuda, StagingKernel,
                         ::testing::Combine(::testing::Values(MemoryKind::kCuda),
                                            ::testing::ValuesIn(testing::kRouteCases)),
                         [](const auto& info) { return std::get<1>(info.param).name; });
INSTANTIATE_TEST_SUITE_P(Hip, StagingKernel,
                         ::testing::Combine(::testing::Values(MemoryKind::kHip),
                                            ::testing::ValuesIn(testing::kRouteCases)),
                         [](const auto& info) { return std::get<1>(info.param).name; });

}  // namespace
}  // namespace pdkv

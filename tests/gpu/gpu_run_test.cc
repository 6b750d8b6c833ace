// `pdkv run --device cuda|hip`: prefill and decode ranks with KV pools in
// device memory on one GPU, every byte verified by the decode workers. The
// transports here cannot register device memory, so every route goes
// through the staging kernels and pinned host staging. Skips, saying so,
// without a device.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "gpu/gpu.h"
#include "support/run_command.h"

namespace pdkv {
namespace {

struct GpuRun {
  const char* device;
  MemoryKind kind;
  const char* backend;
  const char* shape;  // TP pair and heads
};

void PrintTo(const GpuRun& r, std::ostream* os) { *os << r.device << "/" << r.backend; }

class DeviceRun : public ::testing::TestWithParam<GpuRun> {};

TEST_P(DeviceRun, EveryRequestVerified) {
  const GpuRun& r = GetParam();
  auto rt = gpu::runtime(r.kind);
  if (!rt.is_ok()) GTEST_SKIP() << "no GPU runtime in this build: " << rt.status().message();
  if ((*rt)->device_count() == 0) {
    GTEST_SKIP() << "no " << r.device << " device on this machine: pdkv run --device not run";
  }
  const auto out = testing::run_command(std::string(PDKV_BIN) + " run --device " + r.device +
                                        " --backend " + r.backend + " " + r.shape +
                                        " --requests 12 --tokens 200 --chunks 3 --layers 4 --json");
  ASSERT_EQ(out.exit_code, 0) << out.err;
  const auto j = nlohmann::json::parse(out.out);
  EXPECT_EQ(j["verified"], true) << out.out;
  EXPECT_EQ(j["failed"], 0) << out.out;
  EXPECT_GT(j["staged_routes"].get<uint64_t>(), 0u) << "device pools must travel staged";
  EXPECT_EQ(j["direct_routes"].get<uint64_t>(), 0u) << out.out;
}

// Without a device (or without the toolkit in the build) --device cuda is
// refused with status 2 and a line that says which.
TEST(DeviceFlag, RefusedClearlyWithoutADevice) {
  auto rt = gpu::runtime(MemoryKind::kCuda);
  if (rt.is_ok() && (*rt)->device_count() > 0) {
    GTEST_SKIP() << "a CUDA device is present: the refusal cannot be seen here";
  }
  const auto out = testing::run_command(std::string(PDKV_BIN) + " run --device cuda");
  EXPECT_EQ(out.exit_code, 2) << out.err;
  const std::string why = rt.is_ok() ? "--device cuda: no CUDA device found"
                                     : "pdkv was built without CUDA (PDKV_WITH_CUDA=OFF";
  EXPECT_NE(out.err.find(why), std::string::npos) << out.err;
  const auto bad = testing::run_command(std::string(PDKV_BIN) + " run --device tpu");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("tpu"), std::string::npos) << bad.err;
}

// The pairs of scripts/gpu-check.sh: TP 1 -> 4 over 2 KV heads (replicated
// heads) and 4 -> 2 over 8; both layouts.
const GpuRun kRuns[] = {
    {"cuda", MemoryKind::kCuda, "mooncake", "--prefill-tp 1 --decode-tp 4 --kv-heads 2"},
    {"cuda", MemoryKind::kCuda, "nixl", "--prefill-tp 4 --decode-tp 2 --kv-heads 8 --layout hnd"},
    {"cuda", MemoryKind::kCuda, "mooncake", "--prefill-tp 2 --decode-tp 1 --mla"},
    {"hip", MemoryKind::kHip, "mooncake", "--prefill-tp 1 --decode-tp 4 --kv-heads 2"},
};

INSTANTIATE_TEST_SUITE_P(Gpu, DeviceRun, ::testing::ValuesIn(kRuns), [](const auto& info) {
  return std::string(info.param.device) + "_" + info.param.backend + "_" +
         std::to_string(info.index);
});

}  // namespace
}  // namespace pdkv

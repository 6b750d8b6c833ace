// A component's logger (src/log.h) stays the same object for the life of
// the process, whatever becomes of spdlog's registry: exit() destroys that
// registry while an engine's threads may still log (the control fuzzer's
// gRPC threads crashed in spdlog's registry as the process ended).
#include "log.h"

#include <gtest/gtest.h>

namespace pdkv {
namespace {

TEST(Logger, AComponentKeepsItsLoggerWhenSpdlogsRegistryForgetsIt) {
  const auto first = logger("log-test");
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(logger("log-test"), first);
  spdlog::drop("log-test");  // what the registry's end at exit amounts to for a lookup
  EXPECT_EQ(spdlog::get("log-test"), nullptr);
  EXPECT_EQ(logger("log-test"), first);  // found without the registry
  logger("log-test")->debug("still usable");
}

}  // namespace
}  // namespace pdkv

// The C ABI (pdkv/pdkv.h) as a C caller meets it, linked against libpdkv.so
// alone: refusals that name what was wrong, the configuration keys, many-room
// polling and the change list, and handles that outlive their engine.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "pdkv/pdkv.h"

namespace {

std::string last_error() { return pdkv_last_error(); }

struct ConfigDeleter {
  void operator()(pdkv_config* c) const { pdkv_config_destroy(c); }
};
using Config = std::unique_ptr<pdkv_config, ConfigDeleter>;

Config config_for(const char* role, const char* id, const std::string& bootstrap) {
  pdkv_config* raw = nullptr;
  EXPECT_EQ(pdkv_config_create(&raw), PDKV_OK);
  Config config(raw);
  const std::vector<std::pair<const char*, std::string>> settings = {
      {"role", role},          {"engine_id", id},
      {"backend", "mooncake"}, {"kv_heads", "2"},
      {"head_dim", "4"},       {"dtype_bytes", "2"},
      {"page_size", "2"},      {"num_layers", "1"},
      {"num_pages", "8"},      {"aux_item_bytes", "8,16"},
      {"aux_slots", "4"},      {"bootstrap_address", bootstrap}};
  for (const auto& [key, value] : settings) {
    EXPECT_EQ(pdkv_config_set(config.get(), key, value.c_str()), PDKV_OK)
        << key << ": " << last_error();
  }
  return config;
}

class CApi : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(pdkv_bootstrap_server_start("127.0.0.1:0", &server_), PDKV_OK) << last_error();
    int32_t port = 0;
    ASSERT_EQ(pdkv_bootstrap_server_port(server_, &port), PDKV_OK);
    bootstrap_ = "127.0.0.1:" + std::to_string(port);
  }
  void TearDown() override { pdkv_bootstrap_server_destroy(server_); }

  pdkv_engine* start(const char* role, const char* id) {
    pdkv_engine* engine = nullptr;
    EXPECT_EQ(pdkv_engine_create(config_for(role, id, bootstrap_).get(), nullptr, &engine), PDKV_OK)
        << last_error();
    return engine;
  }

  pdkv_bootstrap_server* server_ = nullptr;
  std::string bootstrap_;
};

TEST(CApiNames, CodesAndStatesHaveTheNamesOfTheCppApi) {
  EXPECT_STREQ(pdkv_status_name(PDKV_OK), "ok");
  EXPECT_STREQ(pdkv_status_name(PDKV_ABORTED), "aborted");
  EXPECT_STREQ(pdkv_status_name(PDKV_INTERNAL), "internal");
  EXPECT_STREQ(pdkv_status_name(static_cast<pdkv_status>(42)), "unknown");
  EXPECT_STREQ(pdkv_poll_state_name(PDKV_POLL_WAITING_FOR_INPUT), "WaitingForInput");
  EXPECT_STREQ(pdkv_version(), "0.1.0");
  EXPECT_EQ(pdkv_abi_version(), 0);
}

TEST(CApiNames, TransportsOfTheBuildAreListed) {
  std::vector<std::string> names;
  for (size_t i = 0; i < pdkv_transport_count(); ++i) names.push_back(pdkv_transport_name(i));
  EXPECT_NE(std::find(names.begin(), names.end(), "mooncake"), names.end());
  EXPECT_EQ(pdkv_transport_name(pdkv_transport_count()), nullptr);
}

TEST(CApiRefusals, NullHandlesAndOutPointersAreRefusedByName) {
  pdkv_poll_state state;
  EXPECT_EQ(pdkv_sender_poll(nullptr, &state), PDKV_INVALID_ARGUMENT);
  EXPECT_EQ(last_error(), "pdkv_sender_poll: sender is NULL");
  EXPECT_EQ(pdkv_receiver_init(nullptr), PDKV_INVALID_ARGUMENT);
  EXPECT_EQ(last_error(), "pdkv_receiver_init: receiver is NULL");
  EXPECT_EQ(pdkv_engine_poll(nullptr, nullptr, 0, nullptr), PDKV_INVALID_ARGUMENT);
  EXPECT_EQ(pdkv_config_create(nullptr), PDKV_INVALID_ARGUMENT);
  EXPECT_EQ(last_error(), "pdkv_config_create: out is NULL");
  EXPECT_EQ(pdkv_sender_failure(nullptr), PDKV_INVALID_ARGUMENT);
  EXPECT_EQ(pdkv_engine_control_address(nullptr), nullptr);
  pdkv_engine_destroy(nullptr);  // accepted, ignored
  pdkv_sender_destroy(nullptr);
}

TEST(CApiRefusals, ConfigurationNamesTheUnknownKeyAndTheBadValue) {
  Config config = config_for("prefill", "p", "127.0.0.1:1");
  EXPECT_EQ(pdkv_config_set(config.get(), "tp_sise", "2"), PDKV_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("unknown key 'tp_sise'"), std::string::npos) << last_error();
  EXPECT_EQ(pdkv_config_set(config.get(), "tp_size", "two"), PDKV_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("'two' for tp_size"), std::string::npos) << last_error();
  EXPECT_EQ(pdkv_config_set(config.get(), "layout", "nchw"), PDKV_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("one of hnd|nhd"), std::string::npos) << last_error();
  EXPECT_EQ(pdkv_config_set(config.get(), "transport_options", "rails=2,oops"),
            PDKV_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("'oops' is not"), std::string::npos) << last_error();
  EXPECT_EQ(pdkv_config_set(config.get(), "timeout_connect_ms", "0"), PDKV_INVALID_ARGUMENT);
  EXPECT_EQ(pdkv_config_set(config.get(), "faults", "fail_batch=2"), PDKV_INVALID_ARGUMENT);
  EXPECT_EQ(pdkv_config_set(config.get(), "tp_size", "4294967296"), PDKV_INVALID_ARGUMENT);
  EXPECT_EQ(pdkv_config_set(config.get(), "secret_file", "/nonexistent/secret"),
            PDKV_INVALID_ARGUMENT);
  EXPECT_EQ(last_error(),
            "pdkv_config_set: secret file '/nonexistent/secret': No such file or directory");
  EXPECT_EQ(pdkv_config_set(config.get(), "tls_ca", "/nonexistent/ca.pem"), PDKV_INVALID_ARGUMENT);
}

// A bootstrap service started with a secret serves only calls signed with it:
// an engine without the secret is refused at registration.
TEST(CApiSecurity, ASecuredBootstrapRefusesAnEngineWithoutTheSecret) {
  char path[] = "/tmp/pdkv-capi-secret-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  const std::string secret = "a-cluster-secret-of-32-bytes....\n";
  ASSERT_EQ(write(fd, secret.data(), secret.size()), static_cast<ssize_t>(secret.size()));
  close(fd);
  Config with = config_for("prefill", "p", "127.0.0.1:1");
  ASSERT_EQ(pdkv_config_set(with.get(), "secret_file", path), PDKV_OK) << last_error();
  pdkv_bootstrap_server* server = nullptr;
  ASSERT_EQ(pdkv_bootstrap_server_start_secured("127.0.0.1:0", with.get(), &server), PDKV_OK)
      << last_error();
  int32_t port = 0;
  ASSERT_EQ(pdkv_bootstrap_server_port(server, &port), PDKV_OK);
  Config without = config_for("prefill", "p", "127.0.0.1:" + std::to_string(port));
  pdkv_engine* engine = nullptr;
  EXPECT_EQ(pdkv_engine_create(without.get(), nullptr, &engine), PDKV_UNAUTHENTICATED);
  EXPECT_NE(last_error().find("carries no credentials"), std::string::npos) << last_error();
  pdkv_bootstrap_server_destroy(server);
  unlink(path);
}

TEST_F(CApi, AnEngineRefusedAtCreationSaysWhy) {
  Config config = config_for("prefill", "p", bootstrap_);
  ASSERT_EQ(pdkv_config_set(config.get(), "backend", "carrier-pigeon"), PDKV_OK);
  pdkv_engine* engine = nullptr;
  EXPECT_NE(pdkv_engine_create(config.get(), nullptr, &engine), PDKV_OK);
  EXPECT_EQ(engine, nullptr);
  EXPECT_NE(last_error().find("carrier-pigeon"), std::string::npos) << last_error();
}

TEST_F(CApi, GivenPoolsAreTheOnesTheEngineReportsAndChecks) {
  Config config = config_for("decode", "d", bootstrap_);
  // One layer, K and V: 8 pages of 2 tokens * 2 heads * 4 dims * 2 bytes = 32 bytes.
  std::vector<unsigned char> k(256), v(256), aux0(32), aux1(64);
  const pdkv_region kv[] = {{k.data(), k.size(), PDKV_MEMORY_HOST, 0},
                            {v.data(), v.size(), PDKV_MEMORY_HOST, 0}};
  const pdkv_region aux[] = {{aux0.data(), aux0.size(), PDKV_MEMORY_HOST, 0},
                             {aux1.data(), aux1.size(), PDKV_MEMORY_HOST, 0}};
  pdkv_pools pools{kv, 2, aux, 2, {}, {}};
  pdkv_engine* engine = nullptr;
  ASSERT_EQ(pdkv_engine_create(config.get(), &pools, &engine), PDKV_OK) << last_error();
  pdkv_region region;
  ASSERT_EQ(pdkv_engine_region(engine, PDKV_POOL_KV, 1, &region), PDKV_OK);
  EXPECT_EQ(region.base, v.data());
  size_t count = 0;
  ASSERT_EQ(pdkv_engine_region_count(engine, PDKV_POOL_AUX, &count), PDKV_OK);
  EXPECT_EQ(count, 2u);
  ASSERT_EQ(pdkv_engine_region_count(engine, PDKV_POOL_STATE, &count), PDKV_OK);
  EXPECT_EQ(count, 0u);
  EXPECT_EQ(pdkv_engine_region(engine, PDKV_POOL_KV, 2, &region), PDKV_OUT_OF_RANGE);
  EXPECT_EQ(pdkv_engine_region(engine, static_cast<pdkv_pool_kind>(7), 0, &region),
            PDKV_INVALID_ARGUMENT);
  pdkv_engine_destroy(engine);

  // A pool too short for the configuration is refused, naming the buffer.
  const pdkv_region short_kv[] = {{k.data(), 100, PDKV_MEMORY_HOST, 0},
                                  {v.data(), v.size(), PDKV_MEMORY_HOST, 0}};
  pools.kv = short_kv;
  EXPECT_NE(pdkv_engine_create(config.get(), &pools, &engine), PDKV_OK);
  EXPECT_NE(last_error().find("100"), std::string::npos) << last_error();
}

TEST_F(CApi, ChangedRoomsArriveEachOnceThroughASmallArray) {
  pdkv_engine* prefill = start("prefill", "p");
  pdkv_engine* decode = start("decode", "d");
  ASSERT_NE(prefill, nullptr);
  ASSERT_NE(decode, nullptr);
  std::vector<pdkv_receiver*> receivers(3);
  for (uint64_t room = 0; room < 3; ++room) {
    ASSERT_EQ(pdkv_engine_receiver(decode, 10 + room, "p", 0, &receivers[room]), PDKV_OK);
    ASSERT_EQ(pdkv_receiver_init(receivers[room]), PDKV_OK);
  }
  // Each room leaves Bootstrapping; take them one at a time until all three came.
  std::vector<uint64_t> seen;
  while (seen.size() < 3) {
    int32_t changed = 0;
    ASSERT_EQ(pdkv_engine_wait_for_changes(decode, 10'000, &changed), PDKV_OK);
    ASSERT_EQ(changed, 1) << "no room changed within 10 s";
    uint64_t room = 0;
    size_t count = 0;
    ASSERT_EQ(pdkv_engine_take_changed_rooms(decode, &room, 1, &count), PDKV_OK);
    if (count == 1 && std::find(seen.begin(), seen.end(), room) == seen.end()) {
      seen.push_back(room);
    }
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<uint64_t>{10, 11, 12}));

  const uint64_t rooms[] = {10, 11, 12, 99};
  int32_t states[4] = {-1, -1, -1, -1};
  ASSERT_EQ(pdkv_engine_poll(decode, rooms, 4, states), PDKV_OK);
  EXPECT_EQ(states[0], PDKV_POLL_WAITING_FOR_INPUT);
  EXPECT_EQ(states[2], PDKV_POLL_WAITING_FOR_INPUT);
  EXPECT_EQ(states[3], PDKV_POLL_FAILED);  // no room 99 here
  for (pdkv_receiver* r : receivers) pdkv_receiver_destroy(r);
  pdkv_engine_destroy(decode);
  pdkv_engine_destroy(prefill);
}

TEST_F(CApi, ASenderOutlivesItsEngineAndReportsTheShutdown) {
  pdkv_engine* prefill = start("prefill", "p");
  ASSERT_NE(prefill, nullptr);
  pdkv_sender* sender = nullptr;
  ASSERT_EQ(pdkv_engine_sender(prefill, 7, nullptr, 0, &sender), PDKV_OK);
  EXPECT_EQ(pdkv_engine_sender(prefill, 7, nullptr, 0, &sender), PDKV_ALREADY_EXISTS);
  pdkv_engine_destroy(prefill);
  pdkv_poll_state state = PDKV_POLL_SUCCESS;
  ASSERT_EQ(pdkv_sender_poll(sender, &state), PDKV_OK);
  EXPECT_EQ(state, PDKV_POLL_FAILED);
  EXPECT_NE(pdkv_sender_failure(sender), PDKV_OK);
  EXPECT_NE(last_error().find("shut down"), std::string::npos) << last_error();
  const uint64_t pages[] = {0};
  EXPECT_NE(pdkv_sender_send(sender, pages, 1, 1), PDKV_OK);
  pdkv_sender_destroy(sender);
}

// Waits (10 s at most) until a room of `engine` changed, and takes the changes.
void take_next_changes(pdkv_engine* engine, const char* awaited) {
  int32_t changed = 0;
  ASSERT_EQ(pdkv_engine_wait_for_changes(engine, 10'000, &changed), PDKV_OK);
  ASSERT_EQ(changed, 1) << awaited << " did not arrive within 10 s";
  size_t count = 0;
  uint64_t taken[4];
  ASSERT_EQ(pdkv_engine_take_changed_rooms(engine, taken, 4, &count), PDKV_OK);
}

TEST_F(CApi, ARoomFailsAtItsPeerWithTheAbortReason) {
  pdkv_engine* prefill = start("prefill", "p");
  pdkv_engine* decode = start("decode", "d");
  pdkv_sender* sender = nullptr;
  pdkv_receiver* receiver = nullptr;
  ASSERT_EQ(pdkv_engine_sender(prefill, 5, nullptr, 0, &sender), PDKV_OK);
  ASSERT_EQ(pdkv_engine_receiver(decode, 5, "p", 0, &receiver), PDKV_OK);
  ASSERT_EQ(pdkv_receiver_init(receiver), PDKV_OK);
  const uint64_t pages[] = {1, 2};
  ASSERT_EQ(pdkv_receiver_send_metadata(receiver, pages, 2, 1, nullptr, 0, 0), PDKV_OK);
  pdkv_poll_state state = PDKV_POLL_BOOTSTRAPPING;
  while (state == PDKV_POLL_BOOTSTRAPPING) {
    ASSERT_NO_FATAL_FAILURE(take_next_changes(prefill, "the metadata"));
    ASSERT_EQ(pdkv_sender_poll(sender, &state), PDKV_OK);
  }
  ASSERT_EQ(state, PDKV_POLL_WAITING_FOR_INPUT);
  ASSERT_EQ(pdkv_sender_abort(sender, "the client went away"), PDKV_OK);
  while (state != PDKV_POLL_FAILED) {
    ASSERT_NO_FATAL_FAILURE(take_next_changes(decode, "the abort"));
    ASSERT_EQ(pdkv_receiver_poll(receiver, &state), PDKV_OK);
  }
  EXPECT_EQ(pdkv_receiver_failure(receiver), PDKV_ABORTED);
  EXPECT_NE(last_error().find("the client went away"), std::string::npos) << last_error();
  pdkv_sender_destroy(sender);
  pdkv_receiver_destroy(receiver);
  pdkv_engine_destroy(decode);
  pdkv_engine_destroy(prefill);
}

}  // namespace

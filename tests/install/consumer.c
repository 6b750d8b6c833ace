/* A C program built against an installed pdkv (pkg-config pdkv): one
 * prefill and one decode engine in this process, one room of 4 pages moved
 * over the backend named by argv[1], and every byte of the decode pages
 * compared with the pattern written on the prefill side. Exits 0 only then. */
#include <pdkv/pdkv.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                      \
  do {                                                                                   \
    pdkv_status s_ = (call);                                                             \
    if (s_ != PDKV_OK) {                                                                 \
      fprintf(stderr, "%s: %s: %s\n", #call, pdkv_status_name(s_), pdkv_last_error()); \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

static pdkv_engine* start(const char* role, const char* id, const char* backend,
                          const char* bootstrap) {
  const char* settings[][2] = {
      {"role", role},       {"engine_id", id},         {"backend", backend},
      {"kv_heads", "2"},    {"head_dim", "8"},         {"dtype_bytes", "2"},
      {"page_size", "4"},   {"num_layers", "2"},       {"num_pages", "16"},
      {"bootstrap_address", bootstrap}, {"timeout_bootstrap_ms", "20000"},
  };
  pdkv_config* config = NULL;
  CHECK(pdkv_config_create(&config));
  for (size_t i = 0; i < sizeof settings / sizeof settings[0]; ++i) {
    CHECK(pdkv_config_set(config, settings[i][0], settings[i][1]));
  }
  pdkv_engine* engine = NULL;
  CHECK(pdkv_engine_create(config, NULL, &engine));
  pdkv_config_destroy(config);
  return engine;
}

/* The byte a prefill writes at `offset` of KV buffer `buffer`. */
static unsigned char pattern(size_t buffer, uint64_t offset) {
  return (unsigned char)(buffer * 131 + offset * 7 + 1);
}

int main(int argc, char** argv) {
  const char* backend = argc > 1 ? argv[1] : "mooncake";
  pdkv_bootstrap_server* server = NULL;
  CHECK(pdkv_bootstrap_server_start("127.0.0.1:0", &server));
  int32_t port = 0;
  CHECK(pdkv_bootstrap_server_port(server, &port));
  char bootstrap[64];
  snprintf(bootstrap, sizeof bootstrap, "127.0.0.1:%d", port);

  pdkv_engine* prefill = start("prefill", "p", backend, bootstrap);
  pdkv_engine* decode = start("decode", "d", backend, bootstrap);

  /* One page = page_size 4 * 2 heads * 8 dims * 2 bytes = 128 bytes. */
  const uint64_t page_bytes = 128, src_pages[4] = {3, 0, 7, 1}, dst_pages[4] = {9, 2, 5, 14};
  size_t buffers = 0;
  CHECK(pdkv_engine_region_count(prefill, PDKV_POOL_KV, &buffers));
  for (size_t b = 0; b < buffers; ++b) {
    pdkv_region r;
    CHECK(pdkv_engine_region(prefill, PDKV_POOL_KV, b, &r));
    for (uint64_t i = 0; i < r.length; ++i) ((unsigned char*)r.base)[i] = pattern(b, i);
  }

  pdkv_sender* sender = NULL;
  pdkv_receiver* receiver = NULL;
  CHECK(pdkv_engine_sender(prefill, 42, NULL, 0, &sender));
  CHECK(pdkv_engine_receiver(decode, 42, "p", 0, &receiver));
  CHECK(pdkv_receiver_init(receiver));
  CHECK(pdkv_receiver_send_metadata(receiver, dst_pages, 4, 0, NULL, 0, 0));
  CHECK(pdkv_sender_init(sender, 4, 0, NULL, 0));

  /* Poll both rooms as a server's scheduler does: until both end. */
  int sent = 0;
  pdkv_poll_state ps = PDKV_POLL_BOOTSTRAPPING, ds = PDKV_POLL_BOOTSTRAPPING;
  while ((ps != PDKV_POLL_SUCCESS && ps != PDKV_POLL_FAILED) ||
         (ds != PDKV_POLL_SUCCESS && ds != PDKV_POLL_FAILED)) {
    int32_t changed = 0;
    CHECK(pdkv_engine_wait_for_changes(decode, 50, &changed));
    CHECK(pdkv_sender_poll(sender, &ps));
    CHECK(pdkv_receiver_poll(receiver, &ds));
    if (!sent && ps == PDKV_POLL_WAITING_FOR_INPUT) {
      CHECK(pdkv_sender_send(sender, src_pages, 4, 1));
      sent = 1;
    }
  }
  if (ps != PDKV_POLL_SUCCESS || ds != PDKV_POLL_SUCCESS) {
    pdkv_status why = pdkv_receiver_failure(receiver);
    fprintf(stderr, "transfer failed: prefill %s, decode %s (%s: %s)\n", pdkv_poll_state_name(ps),
            pdkv_poll_state_name(ds), pdkv_status_name(why), pdkv_last_error());
    return 1;
  }

  uint64_t wrong = 0;
  for (size_t b = 0; b < buffers; ++b) {
    pdkv_region r;
    CHECK(pdkv_engine_region(decode, PDKV_POOL_KV, b, &r));
    for (int p = 0; p < 4; ++p) {
      for (uint64_t i = 0; i < page_bytes; ++i) {
        const unsigned char got = ((unsigned char*)r.base)[dst_pages[p] * page_bytes + i];
        if (got != pattern(b, src_pages[p] * page_bytes + i)) ++wrong;
      }
    }
  }
  pdkv_transfer_metrics metrics;
  CHECK(pdkv_receiver_metrics(receiver, &metrics));
  printf("c consumer: pdkv %s over %s: 4 pages, %llu bytes, %llu wrong\n", pdkv_version(), backend,
         (unsigned long long)metrics.bytes, (unsigned long long)wrong);

  pdkv_sender_destroy(sender);
  pdkv_receiver_destroy(receiver);
  pdkv_engine_destroy(prefill);
  pdkv_engine_destroy(decode);
  pdkv_bootstrap_server_destroy(server);
  return wrong == 0 ? 0 : 1;
}

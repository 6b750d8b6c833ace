/* pdkv's C ABI: what a server written in C, or a binding (pdkv's Python
 * package), links against. It offers what the C++ API (pdkv/engine.h,
 * pdkv/bootstrap.h) offers, with a stable binary interface: opaque handles,
 * plain C types, and status codes.
 *
 * Library: libpdkv.so (SONAME libpdkv.so.0). It exports only pdkv_* symbols:
 * the gRPC, protobuf, UCX, libfabric and fmt code it uses stays private, so
 * that pdkv can share a process with torch, grpcio or another UCX user.
 *
 * Errors. A function that can fail returns pdkv_status. On failure the
 * message, which names the offending value, is kept per thread until the next
 * failing call on that thread: pdkv_last_error(). A NULL handle or a NULL
 * out-pointer is refused with PDKV_INVALID_ARGUMENT, never dereferenced. No
 * C++ exception crosses this interface (an unexpected one becomes
 * PDKV_INTERNAL with its what()).
 *
 * Lifetimes. Every handle made by a *_create/_start/_sender/_receiver call is
 * released by its *_destroy (NULL is accepted and ignored). A sender or
 * receiver may outlive its engine: destroying the engine first fails their
 * rooms ("engine shut down"), and their calls keep answering.
 *
 * Threads. Every function may be called from any thread; none waits on a
 * peer except the ones documented as blocking (pdkv_engine_wait_for_changes,
 * pdkv_bootstrap_server_wait).
 *
 * The call order of a transfer, and what each state means, are those of
 * pdkv/engine.h; docs/integration.md shows them from C, C++ and Python.
 */
#ifndef PDKV_PDKV_H_
#define PDKV_PDKV_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped when this interface changes incompatibly (with the SONAME).
 * Every enum has a *_FORCE_INT32_ member: it is int-sized, and a value a
 * caller passes outside the named ones is refused by name, not undefined. */
#define PDKV_ABI_VERSION 0

/* The same codes as pdkv::StatusCode, with the same numbers. */
typedef enum pdkv_status {
  PDKV_OK = 0,
  PDKV_INVALID_ARGUMENT = 1,
  PDKV_OUT_OF_RANGE = 2,
  PDKV_NOT_FOUND = 3,
  PDKV_ALREADY_EXISTS = 4,
  PDKV_FAILED_PRECONDITION = 5,
  PDKV_UNAVAILABLE = 6,
  PDKV_DEADLINE_EXCEEDED = 7,
  PDKV_ABORTED = 8,
  PDKV_INTERNAL = 9,
  PDKV_UNAUTHENTICATED = 10,
  PDKV_RESOURCE_EXHAUSTED = 11,
  PDKV_STATUS_FORCE_INT32_ = 0x7fffffff /* not a status: keeps the enum int-sized */
} pdkv_status;

/* A room's state, ordered as in pdkv/room.h (and SGLang's KVPoll). */
typedef enum pdkv_poll_state {
  PDKV_POLL_FAILED = 0,
  PDKV_POLL_BOOTSTRAPPING = 1,
  PDKV_POLL_WAITING_FOR_INPUT = 2,
  PDKV_POLL_TRANSFERRING = 3,
  PDKV_POLL_SUCCESS = 4,
  PDKV_POLL_STATE_FORCE_INT32_ = 0x7fffffff
} pdkv_poll_state;

typedef enum pdkv_memory_kind {
  PDKV_MEMORY_HOST = 0,
  PDKV_MEMORY_CUDA = 1,
  PDKV_MEMORY_HIP = 2,
  PDKV_MEMORY_KIND_FORCE_INT32_ = 0x7fffffff
} pdkv_memory_kind;

/* The library: its version ("0.1.0"), PDKV_ABI_VERSION as built. */
const char* pdkv_version(void);
int pdkv_abi_version(void);

/* "invalid_argument" for PDKV_INVALID_ARGUMENT; "unknown" past the last code. */
const char* pdkv_status_name(pdkv_status status);
/* "Failed", "Bootstrapping", "WaitingForInput", "Transferring", "Success" */
const char* pdkv_poll_state_name(pdkv_poll_state state);
/* The message of the last call on this thread that failed ("" if none). */
const char* pdkv_last_error(void);

/* The transport backends this library was built with, by index
 * (0 <= index < pdkv_transport_count()); NULL past the end. */
size_t pdkv_transport_count(void);
const char* pdkv_transport_name(size_t index);

/* ---- Engine configuration ------------------------------------------------
 * A configuration is a set of KEY=VALUE settings, so that this interface
 * need not change when an option is added. Unknown keys and bad values are
 * refused at once, naming both. The keys (docs/integration.md lists them with
 * their defaults):
 *   role (prefill|decode), engine_id, dp_rank, dp_size, tp_rank, tp_size,
 *   pp_rank, pp_size, layers ("BEGIN:END", this stage's layers),
 *   kv_heads, head_dim, dtype_bytes, page_size, num_layers, num_pages,
 *   layout (nhd|hnd), mla (0|1),
 *   aux_item_bytes ("B,B,..."), aux_slots,
 *   state_channels, state_channel_bytes, state_slots,
 *   staging (off|on|auto|naive), staging_bytes,
 *   backend, transport_options ("KEY=VALUE,KEY=VALUE"),
 *   bootstrap_address (host:port), control_host,
 *   timeout_bootstrap_ms, timeout_waiting_for_data_ms, timeout_transfer_ms,
 *   timeout_keepalive_ms, timeout_connect_ms,
 *   faults ("KEY=VALUE,...", pdkv/faults.h),
 *   secret_file, tls_cert, tls_key, tls_ca (paths, read when set;
 *   pdkv/security.h, docs/security.md). */
typedef struct pdkv_config pdkv_config;

pdkv_status pdkv_config_create(pdkv_config** out);
void pdkv_config_destroy(pdkv_config* config);
pdkv_status pdkv_config_set(pdkv_config* config, const char* key, const char* value);

/* ---- Memory ---------------------------------------------------------------- */
typedef struct pdkv_region {
  void* base;
  uint64_t length;
  pdkv_memory_kind kind;
  int32_t device;
} pdkv_region;

/* The rank's memory (pdkv::EnginePools): kv[layer * buffers_per_layer + kv]
 * (K then V per local layer; MLA: one per layer), one aux region per
 * aux_item_bytes entry, the state region and the staging region (length 0:
 * none). The arrays are copied: they need not outlive the call. */
typedef struct pdkv_pools {
  const pdkv_region* kv;
  size_t num_kv;
  const pdkv_region* aux;
  size_t num_aux;
  pdkv_region state;
  pdkv_region staging;
} pdkv_pools;

/* Which of an engine's pools pdkv_engine_region() reads. */
typedef enum pdkv_pool_kind {
  PDKV_POOL_KV = 0,
  PDKV_POOL_AUX = 1,
  PDKV_POOL_STATE = 2,
  PDKV_POOL_STAGING = 3,
  PDKV_POOL_KIND_FORCE_INT32_ = 0x7fffffff
} pdkv_pool_kind;

/* ---- Engine ---------------------------------------------------------------- */
typedef struct pdkv_engine pdkv_engine;
typedef struct pdkv_sender pdkv_sender;
typedef struct pdkv_receiver pdkv_receiver;

/* Counters and gauges: pdkv::EngineStats. */
typedef struct pdkv_engine_stats {
  uint64_t staged_routes, direct_routes, batches_in_flight, rooms, peers, loop_tasks, room_steps,
      engine_threads;
} pdkv_engine_stats;

/* What one room moved: pdkv::TransferMetrics. */
typedef struct pdkv_transfer_metrics {
  uint64_t bytes;
  uint64_t latency_us; /* 0 until the room succeeded */
  int32_t staged;      /* 1 if a route went through staging */
  uint32_t retries;
} pdkv_transfer_metrics;

/* Starts an engine. `pools` NULL: the engine allocates them, zeroed, sized
 * from the configuration (read them with pdkv_engine_region). The
 * configuration is copied. */
pdkv_status pdkv_engine_create(const pdkv_config* config, const pdkv_pools* pools,
                               pdkv_engine** out);
/* Fails every open room ("engine shut down") and stops. */
void pdkv_engine_destroy(pdkv_engine* engine);

/* How many regions a pool has (kv: layers * buffers; aux: entries; state and
 * staging: 0 or 1), and one of them. */
pdkv_status pdkv_engine_region_count(const pdkv_engine* engine, pdkv_pool_kind pool, size_t* count);
pdkv_status pdkv_engine_region(const pdkv_engine* engine, pdkv_pool_kind pool, size_t index,
                               pdkv_region* out);
/* host:port where peers reach this rank; owned by the engine. NULL for a NULL engine. */
const char* pdkv_engine_control_address(const pdkv_engine* engine);
pdkv_status pdkv_engine_stats_get(const pdkv_engine* engine, pdkv_engine_stats* out);

/* The states of many rooms at once: states[i] for rooms[i] (PDKV_POLL_FAILED
 * for a room not open here). */
pdkv_status pdkv_engine_poll(const pdkv_engine* engine, const uint64_t* rooms, size_t count,
                             int32_t* states);
/* Rooms whose state changed since they were last taken, each once, in the
 * order they changed; at most `capacity` of them, the rest kept for the next
 * call (*count < capacity: none is left). */
pdkv_status pdkv_engine_take_changed_rooms(pdkv_engine* engine, uint64_t* rooms, size_t capacity,
                                           size_t* count);
/* Blocks until a room changed (*changed = 1) or timeout_ms passed (0). */
pdkv_status pdkv_engine_wait_for_changes(pdkv_engine* engine, int64_t timeout_ms, int32_t* changed);
/* Readable while changes are waiting (for epoll); owned by the engine. */
pdkv_status pdkv_engine_change_fd(const pdkv_engine* engine, int32_t* fd);

/* ---- Sender (prefill) --------------------------------------------------------
 * decode_engine NULL: learnt from the first metadata (pdkv::Engine::sender). */
pdkv_status pdkv_engine_sender(pdkv_engine* engine, uint64_t room, const char* decode_engine,
                               uint32_t decode_dp_rank, pdkv_sender** out);
void pdkv_sender_destroy(pdkv_sender* sender); /* clears the room */
pdkv_status pdkv_sender_init(pdkv_sender* sender, uint64_t num_pages, uint32_t aux_slot,
                             const uint32_t* state_slots, size_t num_state_slots);
pdkv_status pdkv_sender_send(pdkv_sender* sender, const uint64_t* pages, size_t num_pages,
                             int32_t is_last);
pdkv_status pdkv_sender_poll(const pdkv_sender* sender, pdkv_poll_state* state);
pdkv_status pdkv_sender_abort(pdkv_sender* sender, const char* reason);
/* PDKV_OK while the room has not failed; else the failure's code, with its
 * reason as pdkv_last_error(). */
pdkv_status pdkv_sender_failure(const pdkv_sender* sender);
pdkv_status pdkv_sender_decode_prefix_pages(const pdkv_sender* sender, uint64_t* pages);
pdkv_status pdkv_sender_metrics(const pdkv_sender* sender, pdkv_transfer_metrics* out);

/* ---- Receiver (decode) -------------------------------------------------------- */
pdkv_status pdkv_engine_receiver(pdkv_engine* engine, uint64_t room, const char* prefill_engine,
                                 uint32_t prefill_dp_rank, pdkv_receiver** out);
void pdkv_receiver_destroy(pdkv_receiver* receiver); /* clears the room */
pdkv_status pdkv_receiver_init(pdkv_receiver* receiver);
pdkv_status pdkv_receiver_send_metadata(pdkv_receiver* receiver, const uint64_t* pages,
                                        size_t num_pages, uint32_t aux_slot,
                                        const uint32_t* state_slots, size_t num_state_slots,
                                        uint64_t prefix_pages);
pdkv_status pdkv_receiver_poll(const pdkv_receiver* receiver, pdkv_poll_state* state);
pdkv_status pdkv_receiver_abort(pdkv_receiver* receiver, const char* reason);
pdkv_status pdkv_receiver_failure(const pdkv_receiver* receiver);
pdkv_status pdkv_receiver_metrics(const pdkv_receiver* receiver, pdkv_transfer_metrics* out);

/* ---- Bootstrap service ---------------------------------------------------------
 * `address` host:port; port 0 picks a free one. */
typedef struct pdkv_bootstrap_server pdkv_bootstrap_server;

pdkv_status pdkv_bootstrap_server_start(const char* address, pdkv_bootstrap_server** out);
/* As above, authenticated (and with TLS) as `config`'s secret_file and tls_*
 * keys say; the other keys are ignored. */
pdkv_status pdkv_bootstrap_server_start_secured(const char* address, const pdkv_config* config,
                                                pdkv_bootstrap_server** out);
pdkv_status pdkv_bootstrap_server_port(const pdkv_bootstrap_server* server, int32_t* port);
/* Blocks until pdkv_bootstrap_server_shutdown() is called from another thread. */
pdkv_status pdkv_bootstrap_server_wait(pdkv_bootstrap_server* server);
pdkv_status pdkv_bootstrap_server_shutdown(pdkv_bootstrap_server* server);
void pdkv_bootstrap_server_destroy(pdkv_bootstrap_server* server);

#ifdef __cplusplus
}
#endif

#endif /* PDKV_PDKV_H_ */

// The worker processes of DESIGN §6. In a real server these are the
// inference engine's ranks linking libpdkv; here they simulate the model:
// prefill ranks write a deterministic value for every (room, layer, K/V,
// global head, token, byte) into their pages, decode ranks check every byte
// they receive. `pdkv prefill`, `pdkv decode` and the router `pdkv run` are
// built on this.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "pdkv/engine.h"
#include "pdkv/status.h"

namespace pdkv::worker {

struct RoomShare;

// The model and the workload; identical for every process of one run.
struct Shape {
  std::string backend = "nixl";
  std::vector<std::string> backend_options;  // KEY=VALUE, passed to the transport
  uint32_t rails = 0;                        // --rails: backend option rails=K when > 0
  std::string provider;                      // --provider: backend option provider=NAME
  uint32_t kv_heads = 8;                     // 1 with mla
  uint32_t head_dim = 128;
  uint32_t layers = 4;
  uint32_t page_size = 16;
  uint32_t dtype_bytes = 2;
  std::string layout = "nhd";
  bool mla = false;
  std::string staging = "auto";
  uint32_t prefill_tp = 1, decode_tp = 1;
  uint64_t requests = 8;
  // The first `warmup` requests move like the others but are left out of the
  // figures (cli::summarize): they pay first-touch costs (page mappings,
  // connections) that a long-running server pays once.
  uint64_t warmup = 0;
  uint64_t tokens = 256;
  uint32_t chunks = 1;  // send() calls per request (chunked prefill)
  uint32_t window = 4;  // requests in flight per rank
  // Prefill ranks start a request no sooner than this after the previous
  // one: requests arriving at a steady rate, as fault runs need (0: at once).
  uint32_t interval_ms = 0;
  uint32_t aux_bytes = 16;
  // Engine ids. The prefill engine feeds `decode_engines` decode engines of
  // TP decode_tp each, requests round-robin over them (room r goes to decode
  // engine (r - 1) mod N); `decode_engine` is their id, or with several the
  // stem of "decode-0", "decode-1", ... (decode_engine_id).
  std::string prefill_engine = "prefill", decode_engine = "decode";
  uint32_t decode_engines = 1;
  bool verify = true;  // false: benchmark mode, no pattern written or checked
  // Fault runs: --fault KEY=VALUE (pdkv/faults.h) wraps every rank's
  // transport; --keep-going counts a failed request with its reason and goes
  // on (the run fails only for a wrong byte or a crash); --engine-timeout
  // KEY=MS sets the engines' Timeouts (bootstrap, data, transfer,
  // keepalive, connect).
  std::vector<std::string> faults;
  bool keep_going = false;
  std::vector<std::string> engine_timeouts;
  // Where the KV pools live: host, cuda or hip (device memory from
  // cudaMalloc/hipMalloc; rank r uses device r mod the devices found).
  std::string device = "host";

  uint64_t pages_per_request() const { return (tokens + page_size - 1) / page_size; }
  std::string decode_engine_id(uint32_t index) const;
  // The index of the decode engine named `id`, or kInvalidArgument naming
  // it and the ids of this run.
  Result<uint32_t> decode_engine_index(const std::string& id) const;
  uint32_t decode_engine_of(uint64_t room) const { return (room - 1) % decode_engines; }
  // The rooms of decode engine `index` (the inverse of decode_engine_of).
  RoomShare decode_share(uint32_t index) const;
  // Ok, or the flag and value that cannot work.
  Status validate() const;
  KvSpec kv_spec() const;
  // --device as a MemoryKind (validate() has checked it).
  MemoryKind device_kind() const;
  // --backend-opt and --rails as the transport's options.
  Result<TransportOptions> transport_options() const;
  Result<FaultSpec> fault_spec() const;
  Result<Timeouts> timeouts() const;
  // The staging pool one rank needs for --window requests in flight: a
  // decode rank stages its own heads of a request; a prefill rank gathers
  // what it sends, each of its heads once per destination it writes it to
  // (more than once only where decode TP replicates heads). An error names
  // a TP that does not divide the heads.
  Result<uint64_t> staging_bytes(Role role, uint32_t tp_rank) const;
};

// The rooms one rank serves, in order: first, first + stride, ... up to
// --requests. A prefill rank serves every room; a rank of decode engine i of
// N serves rooms i + 1, i + 1 + N, ...
struct RoomShare {
  uint64_t first = 1, stride = 1;
  uint64_t count(uint64_t requests) const {
    return requests >= first ? (requests - first) / stride + 1 : 0;
  }
  uint64_t position(uint64_t room) const { return (room - first) / stride; }  // 0, 1, ...
  uint64_t room(uint64_t position) const { return first + position * stride; }
};

using ProgressFn = std::function<void(uint64_t done, uint64_t room, bool ok)>;

struct WorkerArgs {
  Shape shape;
  Role role = Role::kPrefill;
  uint32_t tp_rank = 0;
  std::string bootstrap;  // host:port
  Security security;      // the cluster's secret and TLS (pdkv/security.h)
  // This rank's address: its control service binds and advertises it, and
  // its data plane defaults to it (EngineConfig::control_host).
  std::string host = "127.0.0.1";
  // This rank's engine: on a prefill rank, Shape::prefill_engine (naming it
  // lets `ps` find the rank; another id is refused); on a decode rank, one of
  // the run's decode engine ids (default: the only one).
  std::string engine_id;
};

// Runs every request on this rank and returns its summary:
// {"role","engine","rank","requests","succeeded","failed","verified","bytes",
//  "start_ms","end_ms","latencies_ms":[...],
//  "failed_rooms":[{"room":R,"reason":"...","at_ms":epoch ms}, ...],"errors":[...],
//  "events_us":[[room, epoch µs], ...]}: on prefill ranks when the room's last
//  send() was made, on decode ranks when it succeeded.
// "verified": every byte of every succeeded room was right, nothing landed
// in a failed room's pages after its failure (decode ranks poison those
// pages and check them again a transfer timeout later), and, without
// --keep-going, every room succeeded.
// `progress(done, room, ok)` is called after each finished request (ok: it
// succeeded here, and on a decode rank every byte was right), `summary` with the
// summary once every request ended, before the engine shuts down.
Result<nlohmann::json> run_worker(const WorkerArgs& args, const ProgressFn& progress,
                                  const std::function<void(const nlohmann::json&)>& summary);

// The pages of request `room` in this role's pool: slot `slot` of the pool
// (its position among the rank's rooms, mod --window), in an order shuffled
// per room and role, so that prefill and decode page lists never line up by
// accident.
std::vector<uint64_t> request_pages(const Shape& shape, Role role, uint64_t room, uint64_t slot);

}  // namespace pdkv::worker

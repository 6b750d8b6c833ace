// One worker process's run (worker.h): the engine, the simulated model
// (the KV pattern written on prefill ranks, checked on decode ranks), the
// window of requests in flight, and the summary.
#include "worker/worker.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <thread>

#include "worker/kv_pattern.h"
#include "worker/kv_pools.h"

namespace pdkv::worker {
namespace {

using Clock = std::chrono::steady_clock;

uint8_t aux_byte(uint64_t room, uint64_t i) { return mix_byte((room << 24) ^ i ^ 0xa5a5); }
// What a failed room's pages hold from its failure on; a byte that changes
// later was written after the failure.
uint8_t poison_byte(uint64_t room, uint32_t buffer, uint64_t offset) {
  return mix_byte((room << 36) ^ (uint64_t{buffer} << 28) ^ offset ^ 0x5e7a11);
}

// Wall-clock time since the epoch, comparable across the processes of a run.
template <typename Unit>
int64_t since_epoch() {
  return std::chrono::duration_cast<Unit>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}
int64_t epoch_ms() { return since_epoch<std::chrono::milliseconds>(); }
int64_t epoch_us() { return since_epoch<std::chrono::microseconds>(); }

const char* kv_name(uint32_t kv, bool mla) { return mla ? "latent" : (kv == 0 ? "K" : "V"); }

Staging staging_of(const std::string& s) {
  return s == "on"      ? Staging::kOn
         : s == "off"   ? Staging::kOff
         : s == "naive" ? Staging::kNaive
                        : Staging::kAuto;
}

class Run {
 public:
  Run(const WorkerArgs& args, const ProgressFn& progress)
      : args_(args),
        shape_(args.shape),
        prefill_(args.role == Role::kPrefill),
        progress_(progress) {}

  Status start();
  void loop();
  nlohmann::json summary() const;

 private:
  struct InFlight {
    std::unique_ptr<Sender> sender;
    std::unique_ptr<Receiver> receiver;
    Clock::time_point start;
  };
  // A failed room's slot: its pages are poisoned and checked again later.
  struct Quarantine {
    uint64_t room;
    Clock::time_point check_at;
  };

  Status configure();
  bool may_start(uint64_t room) const;
  Status start_room(uint64_t room);
  void finish_room(uint64_t room, InFlight& f, PollState state);
  void fail(uint64_t room, const std::string& why);
  // Checks every byte of a finished room on this decode rank; "" when right.
  std::string verify(uint64_t room);
  std::string describe_offset(const std::vector<uint64_t>& pages, uint32_t buf, uint64_t off,
                              uint8_t got, uint8_t want) const;
  void poison(uint64_t room);
  void check_quarantines(bool all);
  uint64_t slot_of(uint64_t room) const { return share_.position(room) % shape_.window; }
  std::vector<uint64_t> pages_of(uint64_t room) const {
    return request_pages(shape_, args_.role, room, slot_of(room));
  }

  const WorkerArgs& args_;
  const Shape& shape_;
  const bool prefill_;
  const ProgressFn& progress_;
  EngineConfig cfg_;
  UnitRange heads_, layers_;
  RoomShare share_;     // the rooms this rank serves
  uint64_t rooms_ = 0;  // how many
  KvPools pools_;
  std::unique_ptr<Engine> engine_;

  std::map<uint64_t, InFlight> in_flight_;     // by room
  std::map<uint64_t, Quarantine> quarantine_;  // by slot
  nlohmann::json errors_ = nlohmann::json::array();
  nlohmann::json failed_rooms_ = nlohmann::json::array();
  nlohmann::json events_ = nlohmann::json::array();  // [room, epoch µs]
  std::vector<double> latencies_;
  uint64_t next_ = 1, done_ = 0, succeeded_ = 0, bytes_ = 0;
  Clock::time_point next_arrival_;  // prefill: --interval-ms
  bool verified_ = true;
  int64_t start_ms_ = 0;
};

Status Run::configure() {
  const uint32_t tp_size = prefill_ ? shape_.prefill_tp : shape_.decode_tp;
  if (args_.tp_rank >= tp_size) {
    return Status::invalid_argument(fmt::format("--tp-rank {} is outside {} TP {}", args_.tp_rank,
                                                prefill_ ? "prefill" : "decode", tp_size));
  }
  cfg_.role = args_.role;
  if (prefill_) {
    // Decode ranks name it with --prefill-engine: the two must agree.
    cfg_.engine_id = args_.engine_id.empty() ? shape_.prefill_engine : args_.engine_id;
    if (cfg_.engine_id != shape_.prefill_engine) {
      return Status::invalid_argument(
          fmt::format("--engine-id '{}' is not the prefill engine '{}' that decode ranks look up "
                      "(--prefill-engine)",
                      cfg_.engine_id, shape_.prefill_engine));
    }
  } else {
    cfg_.engine_id = args_.engine_id.empty() && shape_.decode_engines == 1
                         ? shape_.decode_engine_id(0)
                         : args_.engine_id;
    PDKV_ASSIGN_OR_RETURN(const uint32_t index, shape_.decode_engine_index(cfg_.engine_id));
    share_ = shape_.decode_share(index);
  }
  rooms_ = share_.count(shape_.requests);
  cfg_.tp_rank = args_.tp_rank;
  cfg_.tp_size = tp_size;
  cfg_.kv = shape_.kv_spec();
  if (shape_.aux_bytes > 0) {
    cfg_.aux_item_bytes = {shape_.aux_bytes};
    cfg_.aux_slots = shape_.window;
  }
  cfg_.backend = shape_.backend;
  PDKV_ASSIGN_OR_RETURN(cfg_.transport_options, shape_.transport_options());
  PDKV_ASSIGN_OR_RETURN(cfg_.faults, shape_.fault_spec());
  PDKV_ASSIGN_OR_RETURN(cfg_.timeouts, shape_.timeouts());
  cfg_.bootstrap_address = args_.bootstrap;
  cfg_.security = args_.security;
  cfg_.control_host = args_.host;
  cfg_.staging = staging_of(shape_.staging);
  PDKV_ASSIGN_OR_RETURN(auto heads_axis,
                        AxisSharding::even(cfg_.kv.total_heads, tp_size,
                                           {"KV heads", prefill_ ? "prefill TP" : "decode TP"}));
  heads_ = heads_axis.owned(args_.tp_rank).value();
  layers_ = UnitRange{0, shape_.layers};
  // Device pools travel through staging unless the transport registers
  // them (then the engine ignores the staging pool), so they get one.
  if ((cfg_.staging != Staging::kOff && cfg_.staging != Staging::kNaive) ||
      shape_.device_kind() != MemoryKind::kHost) {
    PDKV_ASSIGN_OR_RETURN(cfg_.staging_bytes, shape_.staging_bytes(args_.role, args_.tp_rank));
  }
  return Status::ok();
}

Status Run::start() {
  PDKV_RETURN_IF_ERROR(shape_.validate());
  PDKV_RETURN_IF_ERROR(configure());
  // Host pools: the engine allocates them, in the memory its transport moves
  // fastest, as a server that lets it choose would. Device pools are ours.
  PDKV_ASSIGN_OR_RETURN(pools_, KvPools::create(shape_, cfg_, heads_.count, args_.tp_rank));
  PDKV_ASSIGN_OR_RETURN(engine_, pools_.on_device() ? Engine::create(cfg_, pools_.engine_pools())
                                                    : Engine::create(cfg_));
  pools_.bind(engine_->pools());
  start_ms_ = epoch_ms();
  return Status::ok();
}

bool Run::may_start(uint64_t room) const {
  // A slot is reused only after its previous request ended on this rank,
  // and, if that one failed, after its pages were checked again.
  if (room > shape_.requests || in_flight_.size() >= shape_.window) return false;
  if (prefill_ && Clock::now() < next_arrival_) return false;
  const uint64_t previous =
      share_.position(room) >= shape_.window ? room - uint64_t{shape_.window} * share_.stride : 0;
  if (previous > 0 && in_flight_.count(previous)) return false;
  return !quarantine_.count(slot_of(room));
}

Status Run::start_room(uint64_t room) {
  const auto pages = pages_of(room);
  const uint64_t slot = slot_of(room);
  InFlight f;
  f.start = Clock::now();
  next_arrival_ = f.start + std::chrono::milliseconds(shape_.interval_ms);
  if (prefill_) {
    if (shape_.verify) {
      for_each_element(
          cfg_.kv, heads_, layers_, pages, room,
          [&](uint32_t buf, uint64_t off, uint8_t v) { pools_.kv(buf, off) = std::byte{v}; });
      PDKV_RETURN_IF_ERROR(pools_.upload(pages));
    }
    for (uint64_t i = 0; i < shape_.aux_bytes; ++i) {
      pools_.aux(slot * shape_.aux_bytes + i) = std::byte{aux_byte(room, i)};
    }
    // As a router does: it tells the prefill engine where the request goes.
    PDKV_ASSIGN_OR_RETURN(
        f.sender, engine_->sender(room, shape_.decode_engine_id(shape_.decode_engine_of(room))));
    PDKV_RETURN_IF_ERROR(f.sender->init(pages.size(), static_cast<uint32_t>(slot)));
    uint64_t sent = 0;
    for (uint32_t c = 1; c <= shape_.chunks; ++c) {
      const uint64_t upto = pages.size() * c / shape_.chunks;
      PDKV_RETURN_IF_ERROR(
          f.sender->send(std::span(pages).subspan(sent, upto - sent), c == shape_.chunks));
      sent = upto;
    }
    events_.push_back({room, epoch_us()});
  } else {
    PDKV_ASSIGN_OR_RETURN(f.receiver, engine_->receiver(room, shape_.prefill_engine));
    PDKV_RETURN_IF_ERROR(f.receiver->init());
    PDKV_RETURN_IF_ERROR(f.receiver->send_metadata(pages, static_cast<uint32_t>(slot)));
  }
  in_flight_.emplace(room, std::move(f));
  return Status::ok();
}

void Run::fail(uint64_t room, const std::string& why) {
  failed_rooms_.push_back({{"room", room}, {"reason", why}, {"at_ms", epoch_ms()}});
  if (errors_.size() < 8) errors_.push_back(fmt::format("room {}: {}", room, why));
}

void Run::finish_room(uint64_t room, InFlight& f, PollState state) {
  bool ok = false;
  if (state == PollState::kFailed) {
    fail(room, (prefill_ ? f.sender->failure() : f.receiver->failure()).message());
    // kFailed on a decode rank means no source can write any more: from now
    // on, nothing may land in the room's pages. Fault runs check it.
    if (!prefill_ && shape_.verify && shape_.keep_going) poison(room);
  } else if (!prefill_) {
    events_.push_back({room, epoch_us()});
    latencies_.push_back(std::chrono::duration<double, std::milli>(Clock::now() - f.start).count());
    const std::string mismatch = shape_.verify ? verify(room) : std::string();
    if (mismatch.empty()) {
      ok = true;
      ++succeeded_;
      bytes_ += uint64_t{shape_.layers} * cfg_.kv.buffers_per_layer() * shape_.pages_per_request() *
                cfg_.kv.page_bytes(heads_.count);
    } else {
      verified_ = false;
      fail(room, mismatch);
    }
  } else {
    ok = true;
    ++succeeded_;
  }
  ++done_;
  progress_(done_, room, ok);
}

void Run::loop() {
  const std::chrono::milliseconds tick(100);
  next_ = share_.first;
  while (done_ < rooms_) {
    check_quarantines(false);
    while (may_start(next_)) {
      if (const Status started = start_room(next_); !started.is_ok()) {
        fail(next_, started.message());
        ++done_;
        progress_(done_, next_, false);
      }
      next_ += share_.stride;
    }
    for (auto it = in_flight_.begin(); it != in_flight_.end();) {
      const PollState state = prefill_ ? it->second.sender->poll() : it->second.receiver->poll();
      if (state != PollState::kSuccess && state != PollState::kFailed) {
        ++it;
        continue;
      }
      finish_room(it->first, it->second, state);
      it = in_flight_.erase(it);
    }
    // Sleep until a room changes state (or a quarantine is due); the engine
    // lists the rooms, so no poll is spent on rooms that did not move.
    if (done_ < rooms_ && engine_->take_changed_rooms().empty()) {
      // Waiting for the next arrival (--interval-ms) only: a room that holds
      // its slot ends with a change, which wakes the wait anyway.
      const auto arrival =
          std::chrono::ceil<std::chrono::milliseconds>(next_arrival_ - Clock::now());
      const bool paced =
          prefill_ && next_ <= shape_.requests && arrival.count() > 0 && arrival < tick;
      (void)engine_->wait_for_changes(paced ? arrival : tick);
    }
  }
  check_quarantines(true);
}

void Run::poison(uint64_t room) {
  const auto pages = pages_of(room);
  for_each_element(cfg_.kv, heads_, layers_, pages, room, [&](uint32_t buf, uint64_t off, uint8_t) {
    pools_.kv(buf, off) = std::byte{poison_byte(room, buf, off)};
  });
  if (const Status up = pools_.upload(pages); !up.is_ok()) {
    verified_ = false;
    fail(room, "poisoning its pages: " + up.message());
    return;
  }
  // Checked again once the room's timeouts have passed: any write of its
  // sources still on its way would have landed by then.
  quarantine_[slot_of(room)] = {room, Clock::now() + cfg_.timeouts.transfer};
}

void Run::check_quarantines(bool all) {
  for (auto it = quarantine_.begin(); it != quarantine_.end();) {
    const Quarantine q = it->second;
    if (!all && Clock::now() < q.check_at) {
      ++it;
      continue;
    }
    if (all) std::this_thread::sleep_until(q.check_at);  // the check's own window
    const auto pages = pages_of(q.room);
    std::string landed;
    if (const Status down = pools_.download(pages); !down.is_ok()) landed = down.message();
    for_each_element(cfg_.kv, heads_, layers_, pages, q.room,
                     [&](uint32_t buf, uint64_t off, uint8_t) {
                       const uint8_t got = std::to_integer<uint8_t>(pools_.kv(buf, off));
                       const uint8_t want = poison_byte(q.room, buf, off);
                       if (landed.empty() && got != want) {
                         landed = describe_offset(pages, buf, off, got, want);
                       }
                     });
    if (!landed.empty()) {
      verified_ = false;
      errors_.push_back(
          fmt::format("room {}: bytes landed in its pages after it failed: {}", q.room, landed));
    }
    it = quarantine_.erase(it);
  }
}

std::string Run::verify(uint64_t room) {
  const auto pages = pages_of(room);
  if (const Status down = pools_.download(pages); !down.is_ok()) return down.message();
  std::string mismatch;
  for_each_element(cfg_.kv, heads_, layers_, pages, room,
                   [&](uint32_t buf, uint64_t off, uint8_t want) {
                     if (!mismatch.empty()) return;
                     const uint8_t got = std::to_integer<uint8_t>(pools_.kv(buf, off));
                     if (got != want) mismatch = describe_offset(pages, buf, off, got, want);
                   });
  const uint64_t slot = slot_of(room);
  for (uint64_t i = 0; i < shape_.aux_bytes && mismatch.empty(); ++i) {
    const uint8_t got = std::to_integer<uint8_t>(pools_.aux(slot * shape_.aux_bytes + i));
    if (got != aux_byte(room, i)) {
      mismatch =
          fmt::format("aux byte {}: got {:#04x}, expected {:#04x}", i, got, aux_byte(room, i));
    }
  }
  return mismatch;
}

std::string Run::describe_offset(const std::vector<uint64_t>& pages, uint32_t buf, uint64_t off,
                                 uint8_t got, uint8_t want) const {
  // Name the element: invert the layout formula for this offset.
  const KvSpec& kv = cfg_.kv;
  const uint64_t hb = kv.head_bytes(), page_bytes = kv.page_bytes(heads_.count);
  const uint64_t page = off / page_bytes, in_page = off % page_bytes;
  const uint64_t index = std::find(pages.begin(), pages.end(), page) - pages.begin();
  uint64_t slot, head;
  if (kv.mla || kv.layout == Layout::kNhd) {
    slot = in_page / (heads_.count * hb);
    head = (in_page / hb) % heads_.count;
  } else {
    head = in_page / (kv.page_size * hb);
    slot = (in_page / hb) % kv.page_size;
  }
  return fmt::format("layer {} {} head {} token {} byte {}: got {:#04x}, expected {:#04x}",
                     buf / kv.buffers_per_layer(), kv_name(buf % kv.buffers_per_layer(), kv.mla),
                     heads_.first + head, index * kv.page_size + slot, in_page % hb, got, want);
}

nlohmann::json Run::summary() const {
  nlohmann::ordered_json out;
  out["role"] = prefill_ ? "prefill" : "decode";
  out["engine"] = cfg_.engine_id;
  out["rank"] = args_.tp_rank;
  out["requests"] = rooms_;
  out["succeeded"] = succeeded_;
  out["failed"] = rooms_ - succeeded_;
  const bool all = succeeded_ == rooms_ || shape_.keep_going;
  out["verified"] = shape_.verify && verified_ && all;
  out["bytes"] = bytes_;
  out["start_ms"] = start_ms_;
  out["end_ms"] = epoch_ms();
  out["latencies_ms"] = latencies_;
  out["events_us"] = events_;
  out["verify"] = shape_.verify;
  out["failed_rooms"] = failed_rooms_;
  out["staged_routes"] = engine_->stats().staged_routes;
  out["direct_routes"] = engine_->stats().direct_routes;
  out["notified_reports"] = engine_->stats().notified_reports;
  out["errors"] = errors_;
  return nlohmann::json(out);
}

}  // namespace

Result<nlohmann::json> run_worker(const WorkerArgs& args, const ProgressFn& progress,
                                  const std::function<void(const nlohmann::json&)>& summary) {
  Run run(args, progress);
  PDKV_RETURN_IF_ERROR(run.start());
  run.loop();
  // Reported before the engine shuts down: the outcome is known now.
  nlohmann::json out = run.summary();
  summary(out);
  return out;
}

}  // namespace pdkv::worker

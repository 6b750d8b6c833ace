// The fault-injecting decorator of pdkv/faults.h.
//
// Each batch's fate is drawn when it is written: fine, failed after part of
// its bytes, or stalled. A batch is handed to the real transport at once,
// or delay_us later (on the first poll() after that: the engine polls
// batches in flight). A failed or stalled batch is only declared so after
// the real transport finished the part that was posted, so that "kFailed
// means over" holds here as it must for every backend.
#include <fmt/format.h>

#include <charconv>
#include <chrono>
#include <mutex>
#include <random>
#include <unordered_map>

#include "log.h"
#include "pdkv/faults.h"

namespace pdkv {
namespace {

using Clock = std::chrono::steady_clock;

Result<double> parse_probability(const std::string& key, const std::string& value) {
  double p = -1;
  auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), p);
  if (value.empty() || ec != std::errc() || ptr != value.data() + value.size() || !(p >= 0) ||
      p > 1) {
    return Status::invalid_argument(
        fmt::format("fault {}={}: expected a probability in [0, 1]", key, value));
  }
  return p;
}

class FaultInjectingTransport final : public Transport {
 public:
  FaultInjectingTransport(std::unique_ptr<Transport> real, FaultSpec spec)
      : real_(std::move(real)), spec_(spec), rng_(*spec.seed) {}

  std::string_view name() const override { return real_->name(); }
  // No batch-end events: a batch is handed over, and its fate decided, when
  // it is polled, so the engine polls on its timer.
  TransportCapabilities capabilities() const override {
    TransportCapabilities caps = real_->capabilities();
    caps.batch_end_events = false;
    return caps;
  }
  uint64_t write_overhead_bytes_from(std::string_view source_descriptor) const override {
    return real_->write_overhead_bytes_from(source_descriptor);
  }
  Result<MemoryRegion> allocate(uint64_t length) override { return real_->allocate(length); }
  Result<RegionKey> register_region(const MemoryRegion& region) override {
    return real_->register_region(region);
  }
  std::string descriptor() const override { return real_->descriptor(); }

  Result<PeerId> connect(std::string_view peer_descriptor) override {
    if (draw(spec_.fail_connect)) {
      return Status::unavailable("injected fault (fail_connect): connect refused");
    }
    return real_->connect(peer_descriptor);
  }

  Result<BatchId> write(PeerId peer, std::span<const WriteOp> ops) override {
    return submit(Kind::kWrite, peer, ops, {});
  }
  Result<BatchId> read(PeerId peer, std::span<const ReadOp> ops) override {
    return submit(Kind::kRead, peer, ops, {});
  }
  Result<BatchId> write_and_notify(PeerId peer, std::span<const WriteOp> ops,
                                   std::string_view notification) override {
    return submit(Kind::kWriteNotify, peer, ops, notification);
  }

  BatchStatus poll(BatchId id) override {
    std::unique_lock lock(mu_);
    auto it = batches_.find(id);
    if (it == batches_.end()) {
      return {BatchState::kFailed, Status::not_found(fmt::format("no batch {}", id))};
    }
    const BatchStatus out = advance(id, lock);
    if (out.state != BatchState::kInProgress) batches_.erase(id);
    return out;
  }

  std::vector<std::string> take_notifications() override { return real_->take_notifications(); }
  void set_notification_callback(EventCallback callback) override {
    real_->set_notification_callback(std::move(callback));
  }
  void acquire_remote_writes() override { real_->acquire_remote_writes(); }
  void release_to_peers() override { real_->release_to_peers(); }
  void set_peer_failure_callback(PeerFailureCallback callback) override {
    real_->set_peer_failure_callback(std::move(callback));
  }

  void fail_peer(PeerId peer, const Status& reason) override {
    {
      // Batches the real transport no longer holds (stalled after their bytes
      // moved, or not handed over yet) end here; the others end below it.
      std::lock_guard lock(mu_);
      for (auto& [id, b] : batches_) {
        if (b.peer == peer && (!b.posted || b.real_ended)) b.ended = reason;
      }
    }
    real_->fail_peer(peer, reason);
  }
  void fence_inbound(std::string_view peer_descriptor,
                     std::optional<uint64_t> connection) override {
    real_->fence_inbound(peer_descriptor, connection);
  }

 private:
  enum class Kind { kWrite, kRead, kWriteNotify };
  enum class Fate { kFine, kFail, kStall };
  struct Batch {
    Kind kind = Kind::kWrite;
    PeerId peer = 0;
    Fate fate = Fate::kFine;
    std::vector<WriteOp> ops;  // what will be handed over (a prefix for kFail)
    uint64_t bytes = 0;        // of the whole batch, for the failure message
    std::string notification;
    Clock::time_point post_at;
    bool posted = false;
    BatchId real = 0;
    bool real_ended = false;  // the real batch is done (a stalled batch waits on)
    std::optional<Clock::time_point> failing_since;  // kFail with drain_us: said it failed
    std::optional<Status> ended;  // failed by fail_peer before the real batch took it
  };

  bool draw(double p) {
    if (p <= 0) return false;
    std::lock_guard lock(mu_);
    return std::uniform_real_distribution<double>(0, 1)(rng_) < p;
  }

  Result<BatchId> submit(Kind kind, PeerId peer, std::span<const WriteOp> ops,
                         std::string_view notification) {
    Batch b;
    b.kind = kind;
    b.peer = peer;
    b.ops.assign(ops.begin(), ops.end());
    for (const WriteOp& op : ops) b.bytes += op.length;
    b.notification = std::string(notification);
    b.post_at = Clock::now() + std::chrono::microseconds(spec_.delay_us);
    std::unique_lock lock(mu_);
    const double u = std::uniform_real_distribution<double>(0, 1)(rng_);
    b.fate = u < spec_.fail_batch                       ? Fate::kFail
             : u < spec_.fail_batch + spec_.stall_batch ? Fate::kStall
                                                        : Fate::kFine;
    if (b.fate == Fate::kFail) keep_first_half(b.ops);
    const BatchId id = next_++;
    if (spec_.delay_us == 0) {
      // Handed over now, so that a write the backend refuses is refused here.
      lock.unlock();
      auto real = hand_over(b);
      if (!real.is_ok()) return real.status();
      b.posted = true;
      b.real = *real;
      lock.lock();
    }
    batches_.emplace(id, std::move(b));
    return id;
  }

  // kFail: the first half of the writes move (of the only write, its first
  // half of bytes); the rest never does.
  static void keep_first_half(std::vector<WriteOp>& ops) {
    if (ops.size() > 1) {
      ops.resize(ops.size() / 2);
    } else if (ops.size() == 1) {
      ops[0].length /= 2;
      if (ops[0].length == 0) ops.clear();
    }
  }

  Result<BatchId> hand_over(const Batch& b) {
    // A batch that fails or stalls never completes, and a notification is
    // its completion at the peer: only a fine one sends it.
    const bool notifies = b.kind == Kind::kWriteNotify && b.fate == Fate::kFine;
    if (b.ops.empty() && !notifies) return BatchId{0};  // nothing moves: "done" at once
    if (b.kind == Kind::kRead) return real_->read(b.peer, b.ops);
    if (notifies) return real_->write_and_notify(b.peer, b.ops, b.notification);
    return real_->write(b.peer, b.ops);
  }

  // Moves batch `id` on as far as it goes now. `lock` holds mu_, and is
  // released around every call into the real transport (which may call
  // back, or take its own locks); the batch is looked up again after each.
  BatchStatus advance(BatchId id, std::unique_lock<std::mutex>& lock) {
    auto find = [&]() -> Batch* {
      auto it = batches_.find(id);
      return it == batches_.end() ? nullptr : &it->second;
    };
    Batch* b = find();
    if (b->ended) return {BatchState::kFailed, *b->ended};
    if (!b->posted) {
      if (Clock::now() < b->post_at) return {};
      b->posted = true;
      const Batch copy = *b;
      lock.unlock();
      auto real = hand_over(copy);
      lock.lock();
      if (!real.is_ok()) return {BatchState::kFailed, real.status()};
      if ((b = find()) == nullptr) return {BatchState::kFailed, Status::not_found("batch gone")};
      b->real = *real;
    }
    if (!b->real_ended) {
      const BatchId real_id = b->real;
      lock.unlock();
      const BatchStatus real =
          real_id == 0 ? BatchStatus{BatchState::kDone, Status::ok()} : real_->poll(real_id);
      lock.lock();
      if ((b = find()) == nullptr) return {BatchState::kFailed, Status::not_found("batch gone")};
      if (real.state != BatchState::kDone) return real;  // failed, or failing
      b->real_ended = true;
      if (b->ended) return {BatchState::kFailed, *b->ended};
    }
    switch (b->fate) {
      case Fate::kFine:
        return {BatchState::kDone, Status::ok()};
      case Fate::kStall:
        return {};
      case Fate::kFail: {
        uint64_t moved = 0;
        for (const WriteOp& op : b->ops) moved += op.length;
        Status why = Status::internal(fmt::format(
            "injected fault (fail_batch): batch failed after {} of {} bytes", moved, b->bytes));
        if (!b->failing_since) b->failing_since = Clock::now();
        if (Clock::now() < *b->failing_since + std::chrono::microseconds(spec_.drain_us)) {
          return {BatchState::kInProgress, std::move(why)};  // draining, as far as anyone knows
        }
        // The real transport finished what was posted: nothing trails.
        return {BatchState::kFailed, std::move(why), /*may_trail=*/false};
      }
    }
    return {};
  }

  std::unique_ptr<Transport> real_;
  const FaultSpec spec_;
  std::mutex mu_;  // guards rng_, batches_, next_
  std::mt19937_64 rng_;
  std::unordered_map<BatchId, Batch> batches_;
  BatchId next_ = 1;
};

}  // namespace

std::string FaultSpec::to_string() const {
  if (!any()) return "none";
  std::string out;
  auto add = [&](const std::string& s) { out += (out.empty() ? "" : " ") + s; };
  if (fail_batch > 0) add(fmt::format("fail_batch={}", fail_batch));
  if (stall_batch > 0) add(fmt::format("stall_batch={}", stall_batch));
  if (delay_us > 0) add(fmt::format("delay_us={}", delay_us));
  if (drain_us > 0) add(fmt::format("drain_us={}", drain_us));
  if (fail_connect > 0) add(fmt::format("fail_connect={}", fail_connect));
  if (seed) add(fmt::format("seed={}", *seed));
  return out;
}

Result<FaultSpec> parse_faults(const std::vector<std::string>& key_values) {
  FaultSpec spec;
  for (const std::string& kv : key_values) {
    const size_t eq = kv.find('=');
    if (eq == 0 || eq == std::string::npos) {
      return Status::invalid_argument(fmt::format("--fault '{}' is not KEY=VALUE", kv));
    }
    const std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
    if (key == "fail_batch") {
      PDKV_ASSIGN_OR_RETURN(spec.fail_batch, parse_probability(key, value));
    } else if (key == "stall_batch") {
      PDKV_ASSIGN_OR_RETURN(spec.stall_batch, parse_probability(key, value));
    } else if (key == "fail_connect") {
      PDKV_ASSIGN_OR_RETURN(spec.fail_connect, parse_probability(key, value));
    } else if (key == "delay_us") {
      PDKV_ASSIGN_OR_RETURN(spec.delay_us, parse_option_number("fault", key, value, 0, 60'000'000));
    } else if (key == "drain_us") {
      PDKV_ASSIGN_OR_RETURN(spec.drain_us, parse_option_number("fault", key, value, 0, 60'000'000));
    } else if (key == "seed") {
      PDKV_ASSIGN_OR_RETURN(spec.seed, parse_option_number("fault", key, value, 0, UINT64_MAX));
    } else {
      return Status::invalid_argument(fmt::format(
          "unknown fault '{}' (known: fail_batch, stall_batch, delay_us, drain_us, fail_connect, "
          "seed)",
          key));
    }
  }
  if (spec.fail_batch + spec.stall_batch > 1) {
    return Status::invalid_argument(
        fmt::format("fault fail_batch={} and stall_batch={} add up to more than 1", spec.fail_batch,
                    spec.stall_batch));
  }
  return spec;
}

std::unique_ptr<Transport> inject_faults(std::unique_ptr<Transport> real, const FaultSpec& spec) {
  if (!spec.any()) return real;
  FaultSpec s = spec;
  if (!s.seed) s.seed = (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
  logger("faults")->warn("{}: injecting faults {}", real->name(), s.to_string());
  return std::make_unique<FaultInjectingTransport>(std::move(real), s);
}

}  // namespace pdkv

// The `loopback` transport: memcpy between regions registered in one process.
//
// TEST-ONLY. It exists so that the protocol layer can be tested with several
// engines in one process; it is not a backend, is never linked into the
// `pdkv` tool and moves no byte between processes. Writes complete at once,
// under one process-wide lock (which also keeps a peer alive while it is
// written to).
//
// Option {"stall", "1"} injects a fault: writes are accepted but their
// batches never complete, as with a hung NIC (for transfer-timeout tests).
//
// It announces each batch's end (batch_end_events) from write(), once its
// locks are released, and from fail_peer() for stalled ones; {"poll_only",
// "1"} turns that off, so that the engine polls on its timer.
//
// Notifications (write_and_notify) are delivered with the bytes, except for
// a stalled batch (it never completes), and announced to the receiver's
// notification callback; {"notifications", "0"} turns them off, so that the
// engine reports every success by a call alone.
//
// Options that call the peer-failure callback as real backends may (for a
// peer id no one connected, 0xdead), to prove the engine takes them at any
// time on any thread:
//   {"callback_in_connect", "1"}  connect() waits for another thread that
//                                 runs the callback (nixl and mori deliver
//                                 peer failures on their progress thread,
//                                 which connect() waits on)
//   {"callback_in_write", "1"}    write() runs it before it returns
//   {"callback_storm", "1"}       a thread runs it every 100 µs for as long
//                                 as the transport lives
//
// {"write_overhead_bytes", "N"} sets the capability of that name, and
// {"write_overhead_bytes_from", "N"} what write_overhead_bytes_from() says
// of every source (the capability when unset): what Staging::kAuto decides
// from.
#include <fmt/format.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/loopback_transport.h"

#include "pdkv/transport.h"
#include "transport_signal.h"

namespace pdkv::testing {
namespace {

class LoopbackTransport;

std::mutex g_mu;                                // guards g_live and every copy
std::map<uint64_t, LoopbackTransport*> g_live;  // by transport id
uint64_t g_next_id = 1;
std::mutex g_hook_mu;                  // guards g_acquire_hook
std::function<void()> g_acquire_hook;  // set_acquire_hook()

constexpr std::string_view kPrefix = "loopback:";

struct LoopbackOptions {
  bool stall = false;
  bool callback_in_connect = false;
  bool callback_in_write = false;
  bool callback_storm = false;
  bool poll_only = false;
  bool notifications = true;
  std::optional<uint64_t> write_overhead_bytes;
  std::optional<uint64_t> write_overhead_bytes_from;
};

constexpr PeerId kStrangerPeer = 0xdead;

class LoopbackTransport final : public Transport {
 public:
  explicit LoopbackTransport(LoopbackOptions options) : stall_(options.stall), options_(options) {
    std::lock_guard lock(g_mu);
    id_ = g_next_id++;
    g_live[id_] = this;
    if (options_.callback_storm) {
      storm_ = std::thread([this] {
        while (!stopping_) {
          call_back(kStrangerPeer, Status::unavailable("storm"));
          std::this_thread::sleep_for(std::chrono::microseconds(100));  // the storm's pace
        }
      });
    }
  }
  ~LoopbackTransport() override {
    stopping_ = true;
    if (storm_.joinable()) storm_.join();
    std::lock_guard lock(g_mu);
    g_live.erase(id_);
  }

  std::string_view name() const override { return "loopback"; }
  TransportCapabilities capabilities() const override {
    TransportCapabilities caps;
    caps.batch_end_events = !options_.poll_only;
    caps.notifications = options_.notifications;
    if (options_.write_overhead_bytes) caps.write_overhead_bytes = *options_.write_overhead_bytes;
    return caps;
  }
  uint64_t write_overhead_bytes_from(std::string_view source_descriptor) const override {
    return options_.write_overhead_bytes_from.value_or(
        Transport::write_overhead_bytes_from(source_descriptor));
  }

  Result<RegionKey> register_region(const MemoryRegion& region) override {
    if (region.kind != MemoryKind::kHost) {
      return Status::invalid_argument(fmt::format("loopback registers host memory only, not {}",
                                                  memory_kind_name(region.kind)));
    }
    if (region.base == nullptr || region.length == 0) {
      return Status::invalid_argument("loopback: region with no memory");
    }
    std::lock_guard lock(mu_);
    regions_.push_back(region);
    return static_cast<RegionKey>(regions_.size() - 1);
  }

  std::string descriptor() const override { return fmt::format("{}{}", kPrefix, id_); }

  Result<PeerId> connect(std::string_view desc) override {
    uint64_t remote = 0;
    if (desc.substr(0, kPrefix.size()) != kPrefix ||
        std::from_chars(desc.data() + kPrefix.size(), desc.data() + desc.size(), remote).ec !=
            std::errc()) {
      return Status::invalid_argument(fmt::format("not a loopback descriptor: '{}'", desc));
    }
    {
      std::lock_guard global(g_mu);
      if (!g_live.count(remote)) {
        return Status::unavailable(fmt::format("loopback peer {} does not exist", remote));
      }
    }
    if (options_.callback_in_connect) {
      std::thread progress([this] { call_back(kStrangerPeer, Status::unavailable("elsewhere")); });
      progress.join();
    }
    std::lock_guard lock(mu_);
    const PeerId id = next_peer_++;
    peers_[id] = Peer{remote, Status::ok()};
    return id;
  }

  Result<BatchId> write(PeerId peer_id, std::span<const WriteOp> ops) override {
    return write_and_notify(peer_id, ops, {});
  }
  // An empty notification is none (the engine never sends one).
  Result<BatchId> write_and_notify(PeerId peer_id, std::span<const WriteOp> ops,
                                   std::string_view notification) override {
    if (!notification.empty() && !options_.notifications) {
      return Status::failed_precondition("loopback: notifications are turned off");
    }
    PDKV_RETURN_IF_ERROR(check_notification(notification));
    if (options_.callback_in_write) call_back(kStrangerPeer, Status::unavailable("inline"));
    std::shared_ptr<TransportSignal> receiver_notes;
    Result<BatchId> batch = copy(peer_id, ops, notification, receiver_notes);
    if (batch.is_ok() && !stall_) {
      batch_ends_.mark();
      batch_ends_.announce();  // done already; the locks are released
    }
    if (receiver_notes) receiver_notes->announce();
    return batch;
  }
  std::vector<std::string> take_notifications() override {
    std::lock_guard lock(mu_);
    return std::exchange(notifications_, {});
  }
  void set_notification_callback(EventCallback callback) override {
    notes_arrived_->set(std::move(callback));
  }

  BatchStatus poll(BatchId batch) override {
    std::lock_guard lock(mu_);
    auto it = batches_.find(batch);
    if (it == batches_.end()) {
      return {BatchState::kFailed, Status::not_found(fmt::format("no loopback batch {}", batch))};
    }
    BatchStatus status = it->second.status;
    if (status.state != BatchState::kInProgress) batches_.erase(it);
    return status;
  }

  // Copies happen under g_mu: taking it orders every completed copy first.
  void acquire_remote_writes() override {
    std::function<void()> hook;
    {
      std::lock_guard lock(g_hook_mu);
      hook = g_acquire_hook;
    }
    if (hook) hook();
    std::lock_guard lock(g_mu);
  }
  void release_to_peers() override { std::lock_guard lock(g_mu); }

  void set_batch_end_callback(EventCallback callback) override {
    batch_ends_.set(std::move(callback));
  }
  void set_peer_failure_callback(PeerFailureCallback callback) override {
    std::lock_guard lock(mu_);
    callback_ = std::move(callback);
  }

  void fail_peer(PeerId peer_id, const Status& reason) override {
    PeerFailureCallback callback;
    {
      std::lock_guard lock(mu_);
      auto peer = peers_.find(peer_id);
      if (peer == peers_.end() || !peer->second.failure.is_ok()) return;
      peer->second.failure = reason.is_ok() ? Status::unavailable("peer failed") : reason;
      // Its batches in flight (stalled ones) end as failed.
      for (auto& [id, batch] : batches_) {
        if (batch.peer == peer_id && batch.status.state == BatchState::kInProgress) {
          batch.status = BatchStatus{BatchState::kFailed, peer->second.failure};
          batch_ends_.mark();
        }
      }
      callback = callback_;
    }
    batch_ends_.announce();
    if (callback) callback(peer_id, reason);
  }

 private:
  // write(): checks every op, then copies them all, under the locks; then
  // queues `notification` at the receiver (unless empty, or the batch
  // stalls) and hands back its signal to announce once the locks are gone.
  Result<BatchId> copy(PeerId peer_id, std::span<const WriteOp> ops, std::string_view notification,
                       std::shared_ptr<TransportSignal>& receiver_notes) {
    std::lock_guard global(g_mu);
    std::unique_lock lock(mu_);
    auto peer = peers_.find(peer_id);
    if (peer == peers_.end()) return Status::not_found(fmt::format("no loopback peer {}", peer_id));
    if (!peer->second.failure.is_ok()) return peer->second.failure;
    auto remote = g_live.find(peer->second.remote_id);
    if (remote == g_live.end()) {
      return Status::unavailable(fmt::format("loopback peer {} is gone", peer->second.remote_id));
    }
    LoopbackTransport& dst = *remote->second;
    std::unique_lock dst_lock(dst.mu_, std::defer_lock);
    if (&dst != this) dst_lock.lock();
    for (size_t i = 0; i < ops.size(); ++i) {
      PDKV_RETURN_IF_ERROR(
          check(regions_, ops[i].local_region, ops[i].local_offset, ops[i].length, "local", i));
      PDKV_RETURN_IF_ERROR(check(dst.regions_, ops[i].remote_region, ops[i].remote_offset,
                                 ops[i].length, "remote", i));
    }
    for (const WriteOp& op : ops) {
      std::memcpy(static_cast<char*>(dst.regions_[op.remote_region].base) + op.remote_offset,
                  static_cast<const char*>(regions_[op.local_region].base) + op.local_offset,
                  op.length);
    }
    if (!notification.empty() && !stall_) {
      dst.notifications_.emplace_back(notification);
      dst.notes_arrived_->mark();
      receiver_notes = dst.notes_arrived_;
    }
    const BatchId id = next_batch_++;
    batches_[id] =
        Batch{peer_id, {stall_ ? BatchState::kInProgress : BatchState::kDone, Status::ok()}};
    return id;
  }

  struct Peer {
    uint64_t remote_id;
    Status failure;
  };
  struct Batch {
    PeerId peer;
    BatchStatus status;
  };

  static Status check(const std::vector<MemoryRegion>& regions, RegionKey key, uint64_t offset,
                      uint64_t length, const char* side, size_t op) {
    if (key >= regions.size()) {
      return Status::out_of_range(fmt::format("write {}: {} region {} is not registered ({} are)",
                                              op, side, key, regions.size()));
    }
    if (offset > regions[key].length || length > regions[key].length - offset) {
      return Status::out_of_range(
          fmt::format("write {}: {} bytes [{}, {}) outside {} region {} of {} bytes", op, side,
                      offset, offset + length, side, key, regions[key].length));
    }
    return Status::ok();
  }

  void call_back(PeerId peer, const Status& reason) {
    PeerFailureCallback callback;
    {
      std::lock_guard lock(mu_);
      callback = callback_;
    }
    if (callback) callback(peer, reason);
  }

  const bool stall_;
  const LoopbackOptions options_;
  std::atomic<bool> stopping_{false};
  std::thread storm_;
  uint64_t id_ = 0;
  mutable std::mutex mu_;
  std::vector<MemoryRegion> regions_;
  std::map<PeerId, Peer> peers_;
  std::map<BatchId, Batch> batches_;
  PeerId next_peer_ = 1;
  BatchId next_batch_ = 1;
  PeerFailureCallback callback_;
  TransportSignal batch_ends_;
  std::vector<std::string> notifications_;  // received; guarded by mu_
  // Shared with writers, which announce it after releasing the locks that
  // keep this transport alive.
  std::shared_ptr<TransportSignal> notes_arrived_ = std::make_shared<TransportSignal>();
};

Result<std::unique_ptr<Transport>> make_loopback(const TransportOptions& options) {
  LoopbackOptions o;
  const std::map<std::string, bool*> flags = {{"stall", &o.stall},
                                              {"callback_in_connect", &o.callback_in_connect},
                                              {"callback_in_write", &o.callback_in_write},
                                              {"callback_storm", &o.callback_storm},
                                              {"poll_only", &o.poll_only},
                                              {"notifications", &o.notifications}};
  for (const auto& [key, value] : options) {
    // Every transport takes these: the rank's address (one process has none)
    // and the engine's transfer timeout (no batch here ends by a clock).
    if (key == "host" || key == kTransferTimeoutOption) continue;
    if (key == "write_overhead_bytes" || key == "write_overhead_bytes_from") {
      auto& field =
          key == "write_overhead_bytes" ? o.write_overhead_bytes : o.write_overhead_bytes_from;
      PDKV_ASSIGN_OR_RETURN(field,
                            parse_option_number("loopback", key, value, 0, uint64_t{1} << 40));
      continue;
    }
    auto flag = flags.find(key);
    if (flag == flags.end() || (value != "0" && value != "1")) {
      return Status::invalid_argument(fmt::format(
          "loopback option '{}={}' unknown (stall, callback_in_connect, callback_in_write, "
          "callback_storm, poll_only, notifications; each 0 or 1; write_overhead_bytes=N, "
          "write_overhead_bytes_from=N)",
          key, value));
    }
    *flag->second = value == "1";
  }
  return std::unique_ptr<Transport>(std::make_unique<LoopbackTransport>(o));
}

PDKV_REGISTER_TRANSPORT("loopback", make_loopback);

}  // namespace

void loopback_fence() { std::lock_guard lock(g_mu); }

void set_acquire_hook(std::function<void()> hook) {
  std::lock_guard lock(g_hook_mu);
  g_acquire_hook = std::move(hook);
}
}  // namespace pdkv::testing

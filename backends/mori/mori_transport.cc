// The `mori` backend: pdkv's Transport interface over the mori IO engine
// (io_engine.h). A region is a registered memory descriptor; a peer is a
// registered remote engine with its memory descriptors; a batch is one
// transfer, a piece per (local region, remote region) pair it touches.
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "io_engine.h"
#include "log.h"
#include "pdkv/transport.h"

namespace pdkv::backends::mori {
namespace {

constexpr std::string_view kOptions =
    "host=ADDR, transfer_timeout_ms=MS, provider=auto|shm|tcp;ofi_rxm|..., timeout_ms=MS, "
    "shared_pools=on|off";

// What one more write costs (TransportCapabilities::write_overhead_bytes):
// through the provider, one fi_writemsg and its completion per fragment:
// about 10 us on shm and tcp at 512-byte fragments, 7 (shm) to 20 us (tcp)
// at page-sized ones, where staging measured faster than direct writes at
// 1 -> 1; copied into a same-host peer's mapped pool, the bookkeeping of one
// operation: with a batch one transfer, direct writes won at one page where
// staging_pays() says so with 1 KiB (4 -> 1, 2 -> 1; 1.11-1.20 against
// 1.19-1.37 ms p50) and lost where it says stage (1 -> 4, 2 -> 4); at 1 k
// tokens 1 KiB chose right at 4 of 5 heterogeneous pairs, not at 2 -> 4,
// where one page prefers staging and 1 k does not (docs/benchmarks.md).
constexpr uint64_t kProviderWriteOverhead = 131072;
constexpr uint64_t kCopiedWriteOverhead = 1024;

}  // namespace

Result<IoEngineConfig> config_from(const TransportOptions& options) {
  static std::atomic<uint64_t> engines{0};
  IoEngineConfig c;
  c.keep_inbound = false;  // never popped here (IoEngineConfig::keep_inbound)
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  c.key = fmt::format("mori-{}-{}-{}", host, getpid(), engines++);
  bool timeout_given = false;
  for (const auto& [key, value] : options) {
    if (key == "host") {
      c.host = value;
    } else if (key == kTransferTimeoutOption) {
      PDKV_ASSIGN_OR_RETURN(uint64_t ms,
                            parse_option_number("mori", key, value, 1, kMaxTransferTimeoutMs));
      if (!timeout_given) c.transfer_timeout = std::chrono::milliseconds(ms);
    } else if (key == "provider" && !value.empty()) {
      c.provider = value;
    } else if (key == "shared_pools" && (value == "on" || value == "off")) {
      c.shared_pools = value == "on";
    } else if (key == "timeout_ms") {
      PDKV_ASSIGN_OR_RETURN(uint64_t ms, parse_option_number("mori", key, value, 10, 3'600'000));
      c.transfer_timeout = std::chrono::milliseconds(ms);
      timeout_given = true;
    } else {
      return Status::invalid_argument(
          fmt::format("mori option '{}={}' unknown (options: {})", key, value, kOptions));
    }
  }
  return c;
}

namespace {

class MoriTransport final : public Transport {
 public:
  explicit MoriTransport(std::unique_ptr<IoEngine> engine) : engine_(std::move(engine)) {
    // The engine reports each failed engine once, on its progress thread
    // with none of its locks held: the peers connected to it are released
    // and reported.
    engine_->set_peer_failure_callback([this](const std::string& key, const Status& reason) {
      PeerFailureCallback callback;
      std::set<PeerId> ids;
      {
        std::lock_guard lock(mu_);
        auto it = by_engine_.find(key);
        if (it == by_engine_.end()) return;
        ids = std::move(it->second);
        by_engine_.erase(it);
        for (PeerId id : ids) peers_.erase(id);
        callback = on_failure_;
      }
      for (PeerId id : ids) {
        if (callback) callback(id, reason);
      }
    });
  }

  // The engine's progress thread calls back into this object (the peer
  // failure callback above): the engine goes first, while every member it
  // touches is still alive. (Members go in reverse order of declaration,
  // which would take the peer tables first; a campaign run saw that crash.)
  ~MoriTransport() override { engine_.reset(); }

  std::string_view name() const override { return "mori"; }
  TransportCapabilities capabilities() const override {
    TransportCapabilities caps;
    caps.reads = true;
    caps.fences_inbound = engine_->can_fence();
    caps.batch_end_events = true;
    // A batch's notification is a message sent once its transfer has
    // succeeded (IoEngine::send_after).
    caps.notifications = engine_->can_message();
    caps.write_overhead_bytes = kProviderWriteOverhead;
    return caps;
  }
  // A source on this host that maps our pools copies its writes.
  uint64_t write_overhead_bytes_from(std::string_view source_descriptor) const override {
    EngineDesc engine;
    std::vector<MemoryDesc> memory;
    if (decode(source_descriptor, engine, memory).is_ok() && engine_->copies_from(engine, memory)) {
      return kCopiedWriteOverhead;
    }
    return kProviderWriteOverhead;
  }

  // Pools a peer on this host maps (IoEngine::allocate).
  Result<MemoryRegion> allocate(uint64_t length) override {
    PDKV_ASSIGN_OR_RETURN(void* base, engine_->allocate(length));
    return MemoryRegion{base, length};
  }

  Result<RegionKey> register_region(const MemoryRegion& region) override {
    if (region.kind != MemoryKind::kHost) {
      return Status::invalid_argument(fmt::format(
          "mori registers host memory only here, not {} (FI_HMEM is not used; stage through "
          "host memory)",
          memory_kind_name(region.kind)));
    }
    PDKV_ASSIGN_OR_RETURN(MemoryDesc md, engine_->register_memory(region.base, region.length));
    std::lock_guard lock(mu_);
    regions_.push_back(std::move(md));
    return static_cast<RegionKey>(regions_.size() - 1);
  }

  std::string descriptor() const override {
    std::lock_guard lock(mu_);
    return encode(engine_->desc(), regions_);
  }

  Result<PeerId> connect(std::string_view peer_descriptor) override {
    Peer peer;
    PDKV_RETURN_IF_ERROR(decode(peer_descriptor, peer.engine, peer.memory));
    PDKV_RETURN_IF_ERROR(engine_->register_remote_engine(peer.engine, peer.memory));
    std::lock_guard lock(mu_);
    const PeerId id = next_peer_++;
    by_engine_[peer.engine.key].insert(id);
    peers_.emplace(id, std::move(peer));
    return id;
  }

  Result<BatchId> write(PeerId peer, std::span<const WriteOp> ops) override {
    return submit(peer, ops, false, std::nullopt);
  }
  Result<BatchId> write_and_notify(PeerId peer, std::span<const WriteOp> ops,
                                   std::string_view notification) override {
    if (!engine_->can_message()) return Transport::write_and_notify(peer, ops, notification);
    PDKV_RETURN_IF_ERROR(check_notification(notification));
    return submit(peer, ops, false, notification);
  }
  std::vector<std::string> take_notifications() override { return engine_->take_messages(); }
  Result<BatchId> read(PeerId peer, std::span<const ReadOp> ops) override {
    return submit(peer, ops, true, std::nullopt);
  }

  // A batch is one transfer (none for a notification alone). One that
  // failed is in progress with its error while it drains (its notification
  // is dropped already), and kFailed once none of its bytes moves any more.
  BatchStatus poll(BatchId batch_id) override {
    std::lock_guard lock(mu_);
    auto b = batches_.find(batch_id);
    if (b == batches_.end()) {
      return {BatchState::kFailed, Status::not_found(fmt::format("no mori batch {}", batch_id))};
    }
    const TransferStatus st = b->second ? engine_->transfer_status(*b->second)
                                        : TransferStatus{TransferState::kSuccess, {}, false};
    if (st.state == TransferState::kInProgress) {
      return {BatchState::kInProgress, st.draining ? st.error : Status::ok()};
    }
    batches_.erase(b);
    return st.state == TransferState::kSuccess ? BatchStatus{BatchState::kDone, {}}
                                               : BatchStatus{BatchState::kFailed, st.error};
  }

  // Every connection from the source's address goes (its connections are
  // not told apart): `connection` adds nothing here.
  void fence_inbound(std::string_view peer_descriptor, std::optional<uint64_t>) override {
    EngineDesc engine;
    std::vector<MemoryDesc> memory;
    if (!decode(peer_descriptor, engine, memory).is_ok()) return;
    if (!engine_->fence_peer(engine)) {
      logger("mori")->debug("engine '{}' not fenced: its provider cannot", engine.key);
    }
  }

  void acquire_remote_writes() override { engine_->acquire_inbound_writes(); }
  void release_to_peers() override { engine_->release_to_peers(); }

  // A batch ends when its transfer does: each transfer that ends is
  // announced, and the caller's poll tells which.
  void set_batch_end_callback(EventCallback callback) override {
    engine_->set_batch_end_callback(std::move(callback));
  }
  void set_notification_callback(EventCallback callback) override {
    engine_->set_message_callback(std::move(callback));
  }
  void set_peer_failure_callback(PeerFailureCallback callback) override {
    std::lock_guard lock(mu_);
    on_failure_ = std::move(callback);
  }
  // The engine's callback then releases the peer (and every other peer of
  // that engine) and reports it.
  void fail_peer(PeerId peer, const Status& reason) override {
    std::string key;
    {
      std::lock_guard lock(mu_);
      auto p = peers_.find(peer);
      if (p == peers_.end()) return;
      key = p->second.engine.key;
    }
    engine_->fail_peer(key, reason.is_ok() ? Status::unavailable("peer failed") : reason);
  }

 private:
  struct Peer {
    EngineDesc engine;
    std::vector<MemoryDesc> memory;
  };

  // `notification`: sent once the batch's transfer succeeded.
  Result<BatchId> submit(PeerId peer_id, std::span<const WriteOp> ops, bool read,
                         std::optional<std::string_view> notification) {
    std::lock_guard lock(mu_);
    auto p = peers_.find(peer_id);
    if (p == peers_.end()) {
      return Status::not_found(
          fmt::format("no mori peer {} (never connected, or failed)", peer_id));
    }
    std::vector<uint64_t> local_lengths, remote_lengths;
    for (const auto& r : regions_) local_lengths.push_back(r.length);
    for (const auto& r : p->second.memory) remote_lengths.push_back(r.length);
    // One transfer for the whole batch, a piece per (local region, remote
    // region), ops in their order.
    struct Group {
      std::vector<uint64_t> local, remote, sizes;
    };
    PDKV_RETURN_IF_ERROR(
        check_ops_bounds(read ? "read" : "write", ops, local_lengths, remote_lengths));
    std::map<std::pair<RegionKey, RegionKey>, Group> groups;
    for (const WriteOp& op : ops) {
      Group& g = groups[{op.local_region, op.remote_region}];
      g.local.push_back(op.local_offset);
      g.remote.push_back(op.remote_offset);
      g.sizes.push_back(op.length);
    }
    std::vector<IoEngine::Piece> pieces;
    for (const auto& [regions, g] : groups) {
      pieces.push_back({&regions_[regions.first], &p->second.memory[regions.second], g.local,
                        g.remote, g.sizes});
    }
    forget_orphans();
    std::optional<TransferId> transfer;
    if (!pieces.empty()) {
      transfer = engine_->allocate_transfer_id();
      PDKV_RETURN_IF_ERROR(read ? engine_->batch_read(pieces, *transfer)
                                : engine_->batch_write(pieces, *transfer));
    }
    if (notification) {
      const auto after =
          transfer ? std::span<const TransferId>(&*transfer, 1) : std::span<const TransferId>();
      const Status st =
          engine_->send_after(p->second.engine.key, after, std::string(*notification));
      if (!st.is_ok() && transfer) {
        // The caller never got a batch to poll: the transfer is cancelled,
        // and asked for again until over, so that the engine forgets it.
        engine_->cancel_transfer(*transfer, st);
        orphans_.push_back(*transfer);
      }
      PDKV_RETURN_IF_ERROR(st);
    }
    const BatchId id = next_batch_++;
    batches_.emplace(id, transfer);
    return id;
  }

  // Transfers of batches refused once started: asked for again until over,
  // so that the engine forgets them (mu_ held).
  void forget_orphans() {
    std::erase_if(orphans_, [this](TransferId id) {
      return engine_->transfer_status(id).state != TransferState::kInProgress;
    });
  }

  std::unique_ptr<IoEngine> engine_;
  mutable std::mutex mu_;
  std::vector<MemoryDesc> regions_;
  std::map<PeerId, Peer> peers_;
  std::map<std::string, std::set<PeerId>> by_engine_;     // engine key -> its peers
  std::map<BatchId, std::optional<TransferId>> batches_;  // its transfer, if any
  std::vector<TransferId> orphans_;
  PeerFailureCallback on_failure_;
  PeerId next_peer_ = 1;
  BatchId next_batch_ = 1;
};

Result<std::unique_ptr<Transport>> create(const TransportOptions& options) {
  PDKV_ASSIGN_OR_RETURN(IoEngineConfig config, config_from(options));
  PDKV_ASSIGN_OR_RETURN(auto engine, IoEngine::create(std::move(config)));
  return std::unique_ptr<Transport>(new MoriTransport(std::move(engine)));
}

}  // namespace

PDKV_REGISTER_TRANSPORT("mori", create);

}  // namespace pdkv::backends::mori

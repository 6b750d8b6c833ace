// The `mooncake` backend: pdkv's Transport interface over the mooncake
// transfer engine (transfer_engine.h). A region is a registered buffer, a
// peer an open segment, a batch one engine batch with a request per op.
#include <fmt/format.h>

#include "pdkv/transport.h"
#include "spare_vectors.h"
#include "transfer_engine.h"
#include "wire.h"

namespace pdkv::backends::mooncake {
namespace {

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    if (comma > start) items.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  return items;
}

// The shared parser, naming this backend in its errors.
Result<uint64_t> parse_number(const std::string& key, const std::string& value, uint64_t min,
                              uint64_t max) {
  return parse_option_number("mooncake", key, value, min, max);
}

constexpr std::string_view kOptions =
    "host=ADDR, transfer_timeout_ms=MS, listen=ADDR[,ADDR...], bind=ADDR[,ADDR...], rails=N, "
    "slice_size=BYTES, "
    "slice_timeout_ms=MS, request_timeout_ms=MS, retries=N, same_host=auto|off|require, "
    "io_threads=N";

}  // namespace

Result<EngineConfig> config_from(const TransportOptions& options) {
  EngineConfig c;
  bool listen_given = false, request_timeout_given = false;
  std::string host;  // the rank's address: listen and bind on it unless told otherwise
  for (const auto& [key, value] : options) {
    if (key == "host") {
      host = value;
    } else if (key == kTransferTimeoutOption) {
      PDKV_ASSIGN_OR_RETURN(uint64_t n, parse_number(key, value, 1, kMaxTransferTimeoutMs));
      if (!request_timeout_given) c.request_timeout = std::chrono::milliseconds(n);
    } else if (key == "listen") {
      c.listen = split_list(value);
      listen_given = true;
    } else if (key == "bind") {
      c.bind = split_list(value);
    } else if (key == "rails") {
      PDKV_ASSIGN_OR_RETURN(uint64_t n, parse_number(key, value, 1, 64));
      c.rails = static_cast<uint32_t>(n);
    } else if (key == "slice_size") {
      PDKV_ASSIGN_OR_RETURN(c.slice_bytes, parse_number(key, value, 4096, 64ull << 20));
    } else if (key == "slice_timeout_ms") {
      PDKV_ASSIGN_OR_RETURN(uint64_t n, parse_number(key, value, 10, 3'600'000));
      c.slice_timeout = std::chrono::milliseconds(n);
    } else if (key == "request_timeout_ms") {
      PDKV_ASSIGN_OR_RETURN(uint64_t n, parse_number(key, value, 10, 3'600'000));
      c.request_timeout = std::chrono::milliseconds(n);
      request_timeout_given = true;
    } else if (key == "retries") {
      PDKV_ASSIGN_OR_RETURN(uint64_t n, parse_number(key, value, 0, 64));
      c.retries = static_cast<uint32_t>(n);
    } else if (key == "same_host" && (value == "auto" || value == "off" || value == "require")) {
      c.same_host = value == "auto"  ? SameHost::kAuto
                    : value == "off" ? SameHost::kOff
                                     : SameHost::kRequire;
    } else if (key == "io_threads") {
      PDKV_ASSIGN_OR_RETURN(uint64_t n, parse_number(key, value, 1, 64));
      c.io_threads = static_cast<uint32_t>(n);
    } else {
      return Status::invalid_argument(
          fmt::format("mooncake option '{}={}' unknown (options: {})", key, value, kOptions));
    }
  }
  if (!host.empty() && !listen_given) c.listen = {host};
  if (!host.empty() && c.bind.empty() && !listen_given) c.bind = {host};
  if (c.listen.empty()) return Status::invalid_argument("mooncake option listen= names no address");
  return c;
}

namespace {

// From the naive and 1 -> 1 rows of docs/benchmarks.md: a slice over TCP
// costs 5-15 us (its frame, its share of an ACK, the loop's turn), so staging
// pays for page-sized (32 KiB) fragments already; a same-host slice well
// under 1 us. Since batches' lists are kept from batch to batch
// (spare_vectors.h), 1 KiB: it writes directly where two or four sources
// feed a decode rank (staging there scatters for them all and lost) and
// stages 512-byte fragments from a single source. No figure picks both 4 ->
// 2 and 1 -> 2, which staging_pays() cannot tell apart; 1 KiB loses about
// 12 % at 1 -> 2 (docs/benchmarks.md, "Batches' lists kept").
constexpr uint64_t kTcpWriteOverhead = 262144;
constexpr uint64_t kSameHostWriteOverhead = 1024;

static_assert(wire::kMaxNotifyPayload >= Transport::kMaxNotificationBytes,
              "a NOTIFY frame carries any notification the engine sends");

class MooncakeTransport final : public Transport {
 public:
  MooncakeTransport(std::unique_ptr<TransferEngine> engine, SameHost same_host)
      : engine_(std::move(engine)), same_host_(same_host) {}

  std::string_view name() const override { return "mooncake"; }
  TransportCapabilities capabilities() const override {
    TransportCapabilities caps;
    caps.reads = true;
    caps.notifications = true;
    caps.batch_end_events = true;
    // `auto` may reach a peer either way: for a peer it knows nothing of, its
    // figure stages small fragments but writes pages in place.
    caps.write_overhead_bytes = same_host_ == SameHost::kRequire ? kSameHostWriteOverhead
                                : same_host_ == SameHost::kOff   ? kTcpWriteOverhead
                                                                 : 65536;
    return caps;
  }
  // A source writes into this rank by the same-host path when both run on
  // this host (its options are taken to be ours, as one deployment's are).
  uint64_t write_overhead_bytes_from(std::string_view source_descriptor) const override {
    const bool same_host =
        same_host_ == SameHost::kRequire ||
        (same_host_ == SameHost::kAuto && engine_->on_this_host(source_descriptor));
    return same_host ? kSameHostWriteOverhead : kTcpWriteOverhead;
  }

  // Pools in shared memory, which peers on this host copy into with memcpy;
  // ordinary memory where they never would (same_host=off).
  Result<MemoryRegion> allocate(uint64_t length) override {
    if (same_host_ == SameHost::kOff) return Transport::allocate(length);
    PDKV_ASSIGN_OR_RETURN(void* base, engine_->allocate_shared(length));
    return MemoryRegion{base, length};
  }

  Result<RegionKey> register_region(const MemoryRegion& region) override {
    if (region.kind != MemoryKind::kHost) {
      return Status::invalid_argument(
          fmt::format("mooncake moves host memory only, not {} (stage through host memory)",
                      memory_kind_name(region.kind)));
    }
    PDKV_RETURN_IF_ERROR(engine_->register_local_memory(region.base, region.length));
    std::lock_guard lock(mu_);
    regions_.push_back(region);
    return static_cast<RegionKey>(regions_.size() - 1);
  }

  std::string descriptor() const override { return engine_->segment_descriptor(); }

  Result<PeerId> connect(std::string_view peer_descriptor) override {
    PDKV_ASSIGN_OR_RETURN(SegmentHandle segment, engine_->open_segment(peer_descriptor));
    return PeerId{segment};
  }

  Result<BatchId> write(PeerId peer, std::span<const WriteOp> ops) override {
    return submit(peer, ops, Opcode::kWrite, nullptr);
  }
  Result<BatchId> write_and_notify(PeerId peer, std::span<const WriteOp> ops,
                                   std::string_view notification) override {
    const std::string message(notification);
    return submit(peer, ops, Opcode::kWrite, &message);
  }
  std::vector<std::string> take_notifications() override { return engine_->take_notifications(); }
  Result<BatchId> read(PeerId peer, std::span<const ReadOp> ops) override {
    return submit(peer, ops, Opcode::kRead, nullptr);
  }

  BatchStatus poll(BatchId batch) override {
    auto status = engine_->get_batch_status(batch);
    if (!status.is_ok()) return {BatchState::kFailed, status.status()};
    switch (status->state) {
      case TransferState::kCompleted:
        (void)engine_->free_batch_id(batch);
        return {BatchState::kDone, {}};
      case TransferState::kFailed:
      case TransferState::kTimeout:
        (void)engine_->free_batch_id(batch);
        return {BatchState::kFailed, status->error};
      default:
        return {BatchState::kInProgress, {}};
    }
  }

  void acquire_remote_writes() override { engine_->acquire_inbound_writes(); }
  void release_to_peers() override { engine_->release_to_peers(); }

  void set_batch_end_callback(EventCallback callback) override {
    engine_->set_batch_end_callback(std::move(callback));
  }
  void set_notification_callback(EventCallback callback) override {
    engine_->set_notification_callback(std::move(callback));
  }
  void set_peer_failure_callback(PeerFailureCallback callback) override {
    engine_->set_segment_failure_callback(std::move(callback));
  }
  void fail_peer(PeerId peer, const Status& reason) override {
    engine_->close_segment(peer, reason);
  }

 private:
  // `notification`: delivered to the peer after the batch's bytes.
  Result<BatchId> submit(PeerId peer, std::span<const WriteOp> ops, Opcode opcode,
                         const std::string* notification) {
    PDKV_ASSIGN_OR_RETURN(auto remote, engine_->segment_buffers(peer));
    std::vector<uint64_t> local_lengths, remote_lengths;
    SpareVectors<TransferRequest>::Lease lease(spare_requests_);
    std::vector<TransferRequest>& requests = *lease;
    requests.reserve(ops.size());
    {
      std::lock_guard lock(mu_);
      for (const auto& r : regions_) local_lengths.push_back(r.length);
      for (const auto& b : remote) remote_lengths.push_back(b.length);
      PDKV_RETURN_IF_ERROR(check_ops_bounds(opcode == Opcode::kWrite ? "write" : "read", ops,
                                            local_lengths, remote_lengths));
      for (const WriteOp& op : ops) {
        requests.push_back({opcode,
                            static_cast<char*>(regions_[op.local_region].base) + op.local_offset,
                            peer, remote[op.remote_region].base + op.remote_offset, op.length});
      }
    }
    PDKV_ASSIGN_OR_RETURN(BatchId batch, engine_->allocate_batch_id(ops.size() + 1));
    Status st = engine_->submit_transfer(batch, requests);
    if (st.is_ok() && notification != nullptr) {
      st = engine_->submit_notification(batch, peer, *notification);
    }
    if (!st.is_ok()) {
      (void)engine_->free_batch_id(batch);
      return st;
    }
    return batch;
  }

  std::unique_ptr<TransferEngine> engine_;
  const SameHost same_host_;
  mutable std::mutex mu_;
  std::vector<MemoryRegion> regions_;
  SpareVectors<TransferRequest> spare_requests_;  // submit()'s lists, kept from batch to batch
};

Result<std::unique_ptr<Transport>> create(const TransportOptions& options) {
  PDKV_ASSIGN_OR_RETURN(EngineConfig config, config_from(options));
  const SameHost same_host = config.same_host;
  PDKV_ASSIGN_OR_RETURN(auto engine, TransferEngine::create(std::move(config)));
  return std::unique_ptr<Transport>(new MooncakeTransport(std::move(engine), same_host));
}

}  // namespace

PDKV_REGISTER_TRANSPORT("mooncake", create);

}  // namespace pdkv::backends::mooncake

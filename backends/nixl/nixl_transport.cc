// The nixl backend's life cycle, memory and peers; batches and failures are
// in nixl_batches.cc. The design is in nixl_transport.h.
#include "nixl_transport.h"

#include <fmt/format.h>

#include <cstring>
#include <optional>
#include <random>

#include "byte_codec.h"
#include "log.h"
#include "net_interface.h"

namespace pdkv::backends::nixl {
namespace {

constexpr std::string_view kMagic = "pdkv-nixl-2";

// Whether UCX_TLS is an explicit list (not empty, not "^..." exclusions)
// whose every name is in `names`.
bool every_transport_in(std::string_view tls, const std::set<std::string_view>& names) {
  if (tls.empty() || tls.front() == '^') return false;
  while (!tls.empty()) {
    const size_t comma = tls.find(',');
    if (names.count(tls.substr(0, comma)) == 0) return false;
    tls = comma == std::string_view::npos ? std::string_view() : tls.substr(comma + 1);
  }
  return true;
}

// Whether every transport UCX_TLS names can report a failed peer (UCX's
// network transports): then PEER error handling costs nothing, while with
// shared memory in the list it would take shared memory away.
bool network_transports_only(std::string_view tls) {
  static const std::set<std::string_view> kNetwork = {
      "tcp",     "rc", "rc_v", "rc_x", "rc_mlx5", "dc", "dc_x",
      "dc_mlx5", "ud", "ud_v", "ud_x", "ud_mlx5", "ib", "self"};
  return every_transport_in(tls, kNetwork);
}

// Whether UCX emulates puts over every transport UCX_TLS names (tcp, and
// self for a rank's own memory): then the message path costs no copy more.
bool emulates_puts(std::string_view tls) { return every_transport_in(tls, {"tcp", "self"}); }

// A descriptor's header: the magic, the worker address (a view into `r`'s
// bytes), the transport's instance token and its data path (1: messages,
// which its senders must use too); nullopt when it is not a nixl descriptor.
struct Header {
  std::string_view worker_address;
  uint64_t instance = 0;
  uint64_t messages = 0;
};
std::optional<Header> read_header(ByteReader& r) {
  std::string_view magic;
  Header h;
  if (!r.bytes(magic) || magic != kMagic || !r.bytes(h.worker_address) || !r.u64(h.instance) ||
      !r.u64(h.messages)) {
    return std::nullopt;
  }
  return h;
}

}  // namespace

Status ucx_error(const std::string& what, ucs_status_t status) {
  return Status::internal(fmt::format("{}: {}", what, ucs_status_string(status)));
}

NixlTransport::NixlTransport() = default;

Result<std::unique_ptr<Transport>> NixlTransport::create(const TransportOptions& options) {
  std::unique_ptr<NixlTransport> t(new NixlTransport);
  std::string mode = "auto", path = "auto";
  if (const char* env = std::getenv("PDKV_NIXL_ERROR_HANDLING")) mode = env;
  for (const auto& [key, value] : options) {
    if (key == "error_handling" && (value == "peer" || value == "none" || value == "auto")) {
      mode = value;
    } else if (key == "data_path" && (value == "put" || value == "message" || value == "auto")) {
      path = value;
    } else if (key == "host") {
      t->host_ = value;
    } else if (key == kTransferTimeoutOption) {
      // No clock of its own ends a batch: the engine's does.
      PDKV_RETURN_IF_ERROR(
          parse_option_number("nixl", key, value, 1, kMaxTransferTimeoutMs).status());
    } else if (key == "tls") {
      t->tls_ = value;
    } else {
      return Status::invalid_argument(fmt::format(
          "nixl option '{}={}' unknown (host=ADDR, transfer_timeout_ms=MS, tls=LIST as UCX_TLS, "
          "error_handling=auto|peer|none, data_path=auto|put|message; the rest of UCX is "
          "configured through its UCX_* environment variables)",
          key, value));
    }
  }
  if (mode != "peer" && mode != "none" && mode != "auto") {
    return Status::invalid_argument(
        fmt::format("PDKV_NIXL_ERROR_HANDLING='{}' unknown (auto, peer or none)", mode));
  }
  if (t->tls_.empty()) {
    if (const char* env = std::getenv("UCX_TLS")) t->tls_ = env;
  }
  t->peer_error_handling_ = mode == "peer" || (mode == "auto" && network_transports_only(t->tls_));
  const bool messages =
      path == "message" || (path == "auto" && t->peer_error_handling_ && emulates_puts(t->tls_));
  t->data_path_ = messages ? DataPath::kMessage : DataPath::kPut;
  PDKV_RETURN_IF_ERROR(t->init());
  return std::unique_ptr<Transport>(std::move(t));
}

Status NixlTransport::init() {
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return ucx_error("ucp_config_read", st);
  // A dead peer is found by UCX keepalive within seconds, unless the user
  // chose otherwise through UCX_KEEPALIVE_INTERVAL.
  if (std::getenv("UCX_KEEPALIVE_INTERVAL") == nullptr) {
    (void)ucp_config_modify(config, "KEEPALIVE_INTERVAL", "1s");
  }
  // Option host: UCX has no bind address of its own, so its TCP transport
  // is pointed at the interface that owns the address. Only for TCP, and
  // only when the user has not chosen: restricting the devices otherwise
  // would also drop RDMA devices, which carry no IP address UCX knows.
  if (!tls_.empty()) (void)ucp_config_modify(config, "TLS", tls_.c_str());
  if (!host_.empty() && std::getenv("UCX_NET_DEVICES") == nullptr &&
      tls_.find("tcp") != std::string::npos) {
    if (auto device = interface_of(host_)) {
      (void)ucp_config_modify(config, "NET_DEVICES", device->c_str());
    } else {
      logger("nixl")->warn("host {} is on no interface of this host; UCX picks its devices", host_);
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  // Not UCP_FEATURE_WAKEUP: asking for it makes UCX drop its shared-memory
  // transports (posix, sysv, cma), leaving TCP at a tenth of the bandwidth.
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM;
  st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (st != UCS_OK) return ucx_error("ucp_init", st);

  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (ucp_context_query(context_, &attr) == UCS_OK) {
    caps_.cuda_memory = attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA);
    caps_.hip_memory = attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_ROCM);
  }
  if (data_path_ == DataPath::kMessage) {
    // The target copies the bytes in with the CPU.
    caps_.cuda_memory = caps_.hip_memory = false;
  }
  caps_.notifications = true;
  caps_.batch_end_events = true;  // end_batch announces
  caps_.fences_inbound = data_path_ == DataPath::kMessage;
  // A put straight into the peer's shared segment costs little beyond its
  // bytes; on the message path each write is a message the target copies
  // in. Since batches' op lists are kept from batch to batch
  // (spare_vectors.h), 512 bytes: direct puts are much faster where several
  // sources feed a decode rank, and as fast as staging within the noise for
  // 512-byte fragments from one source, which 1 KiB staged
  // (docs/benchmarks.md, "Batches' lists kept"). It is measured on shared
  // memory only; RDMA hardware was not at hand.
  caps_.write_overhead_bytes = data_path_ == DataPath::kPut ? 512 : 65536;
  caps_.reads = true;  // ucp_get_nbx; the same flush completes them

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  st = ucp_worker_create(context_, &wp, &worker_);
  if (st != UCS_OK) return ucx_error("ucp_worker_create", st);
  ucp_address_t* address = nullptr;
  size_t address_length = 0;
  st = ucp_worker_get_address(worker_, &address, &address_length);
  if (st != UCS_OK) return ucx_error("ucp_worker_get_address", st);
  worker_address_.assign(reinterpret_cast<const char*>(address), address_length);
  ucp_worker_release_address(worker_, address);

  std::random_device random;
  instance_ = (uint64_t{random()} << 32) | random();
  const std::pair<unsigned, ucp_am_recv_callback_t> handlers[] = {
      {kNotifyAmId, &NixlTransport::on_notification},
      {kDataAmId, &NixlTransport::on_data},
      {kEndAmId, &NixlTransport::on_end},
      {kAnswerAmId, &NixlTransport::on_answer}};
  for (const auto& [id, callback] : handlers) {
    ucp_am_handler_param_t am{};
    am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    am.id = id;
    am.cb = callback;
    am.arg = this;
    am.flags = UCP_AM_FLAG_WHOLE_MSG;
    st = ucp_worker_set_am_recv_handler(worker_, &am);
    if (st != UCS_OK) return ucx_error("ucp_worker_set_am_recv_handler", st);
  }

  // Idle, the thread wakes every 2 ms for what arrives unasked (emulated
  // puts, notifications, keepalive); for 5 ms after any such event every
  // 50 us, so that a transfer is not held up by a sleeping target.
  ProgressThread::Driver driver;
  driver.progress = [this] { return progress(); };
  driver.busy = [this] { return busy(); };
  thread_.start(std::move(driver));
  return Status::ok();
}

NixlTransport::~NixlTransport() {
  // Every endpoint is drained and closed (batches still in flight fail),
  // the thread letting them finish for at most kDrainLimit + kCloseLimit.
  (void)thread_.run([this] {
    std::vector<PeerId> peers;
    for (const auto& [id, wire] : wires_) peers.push_back(id);
    for (PeerId id : peers) peer_failed(id, Status::aborted("nixl transport shut down"));
    return Status::ok();
  });
  thread_.stop(kDrainLimit + kCloseLimit + std::chrono::milliseconds(200));
  finish_closes(/*all=*/true);  // what UCX did not close in time; the thread is gone
  for (ucp_rkey_h rkey : abandoned_rkeys_) ucp_rkey_destroy(rkey);
  for (auto& r : regions_) {
    if (r.memh && r.owns_memh) ucp_mem_unmap(context_, r.memh);
  }
  for (auto& [base, allocation] : allocations_) ucp_mem_unmap(context_, allocation.second);
  if (worker_) ucp_worker_destroy(worker_);
  if (context_) ucp_cleanup(context_);
}

Result<MemoryRegion> NixlTransport::allocate(uint64_t length) {
  if (length == 0) return Status::invalid_argument("nixl: allocation of 0 bytes");
  return thread_.run([&]() -> Result<MemoryRegion> {
    // UCX picks the allocator (UCX_MEM_ALLOC_METHODS; sysv or posix shared
    // memory first), so that peers' puts go straight into it (file comment).
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    mp.address = nullptr;
    mp.length = length;
    mp.flags = UCP_MEM_MAP_ALLOCATE;
    ucp_mem_h memh = nullptr;
    ucs_status_t st = ucp_mem_map(context_, &mp, &memh);
    if (st != UCS_OK) return ucx_error(fmt::format("ucp_mem_map(ALLOCATE, {} bytes)", length), st);
    ucp_mem_attr_t attr{};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    st = ucp_mem_query(memh, &attr);
    if (st != UCS_OK) {
      ucp_mem_unmap(context_, memh);
      return ucx_error("ucp_mem_query", st);
    }
    std::memset(attr.address, 0, length);  // not every allocator hands out zeroed pages
    std::lock_guard lock(mu_);
    allocations_[reinterpret_cast<uintptr_t>(attr.address)] = {attr.length, memh};
    return MemoryRegion{attr.address, length, MemoryKind::kHost, 0};
  });
}

ucp_mem_h NixlTransport::allocation_holding(const MemoryRegion& region) const {
  std::lock_guard lock(mu_);
  const auto base = reinterpret_cast<uintptr_t>(region.base);
  auto it = allocations_.upper_bound(base);
  if (it == allocations_.begin()) return nullptr;
  --it;
  const auto& [length, memh] = it->second;
  return base + region.length <= it->first + length ? memh : nullptr;
}

Result<RegionKey> NixlTransport::register_region(const MemoryRegion& region) {
  if (region.base == nullptr || region.length == 0) {
    return Status::invalid_argument("nixl: region with no memory");
  }
  if ((region.kind == MemoryKind::kCuda && !caps_.cuda_memory) ||
      (region.kind == MemoryKind::kHip && !caps_.hip_memory)) {
    return Status::invalid_argument(
        fmt::format("nixl: this UCX build cannot register {} memory (stage through host memory)",
                    memory_kind_name(region.kind)));
  }
  return thread_.run([&]() -> Result<RegionKey> {
    LocalRegion local{region, nullptr, true, {}};
    ucs_status_t st = UCS_OK;
    if (ucp_mem_h memh = allocation_holding(region)) {
      // UCX's own memory: its handle already names the shared segment that
      // lets peers write into it directly. The rkey covers the allocation;
      // bounds are still checked against this region.
      local.memh = memh;
      local.owns_memh = false;
    } else {
      ucp_mem_map_params_t mp{};
      mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
      mp.address = region.base;
      mp.length = region.length;
      st = ucp_mem_map(context_, &mp, &local.memh);
      if (st != UCS_OK) return ucx_error("ucp_mem_map", st);
    }
    void* packed = nullptr;
    size_t packed_size = 0;
    st = ucp_rkey_pack(context_, local.memh, &packed, &packed_size);
    if (st != UCS_OK) {
      if (local.owns_memh) ucp_mem_unmap(context_, local.memh);
      return ucx_error("ucp_rkey_pack", st);
    }
    local.rkey.assign(static_cast<const char*>(packed), packed_size);
    ucp_rkey_buffer_release(packed);
    std::lock_guard lock(mu_);
    regions_.push_back(std::move(local));
    return static_cast<RegionKey>(regions_.size() - 1);
  });
}

std::string NixlTransport::descriptor() const {
  ByteWriter w;
  w.bytes(kMagic);
  w.bytes(worker_address_);
  w.u64(instance_);
  w.u64(data_path_ == DataPath::kMessage ? 1 : 0);
  std::lock_guard lock(mu_);
  w.u64(regions_.size());
  for (const auto& r : regions_) {
    w.u64(reinterpret_cast<uint64_t>(r.region.base));
    w.u64(r.region.length);
    w.bytes(r.rkey);
  }
  return w.take();
}

ucp_ep_params_t NixlTransport::endpoint_params(std::string_view worker_address,
                                               ErrorArg* error_arg) const {
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(worker_address.data());
  ep.err_mode = peer_error_handling_ ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  ep.err_handler.cb = &NixlTransport::on_peer_error;
  ep.err_handler.arg = error_arg;
  return ep;
}

Result<ParsedDescriptor> parse_descriptor(std::string_view desc) {
  ByteReader r(desc);
  const std::optional<Header> header = read_header(r);
  uint64_t count = 0;
  // Each region takes at least 24 bytes: a count beyond what is left is a lie.
  if (!header || !r.u64(count) || count > r.left() / 24) {
    return Status::invalid_argument(
        fmt::format("not a nixl descriptor ({} bytes): bad header", desc.size()));
  }
  ParsedDescriptor parsed{header->worker_address, header->instance, header->messages != 0, {}};
  parsed.regions.resize(count);
  for (auto& w : parsed.regions) {
    if (!r.u64(w.base) || !r.u64(w.length) || !r.bytes(w.rkey)) {
      return Status::invalid_argument("nixl descriptor truncated in its region table");
    }
  }
  return parsed;
}

Result<PeerId> NixlTransport::connect(std::string_view desc) {
  PDKV_ASSIGN_OR_RETURN(const ParsedDescriptor parsed, parse_descriptor(desc));
  const auto& table = parsed.regions;
  const std::string_view address = parsed.worker_address;
  return thread_.run([&]() -> Result<PeerId> {
    PeerId id;
    {
      std::lock_guard lock(mu_);
      id = next_peer_++;
    }
    Wire wire;
    wire.messages = parsed.messages;  // the target's choice (docs/backends.md)
    wire.target = parsed.instance;
    wire.generation = generations_[parsed.instance];
    wire.error_arg = std::make_unique<ErrorArg>(ErrorArg{this, id});
    const ucp_ep_params_t ep = endpoint_params(address, wire.error_arg.get());
    ucs_status_t st = ucp_ep_create(worker_, &ep, &wire.ep);
    if (st != UCS_OK) return ucx_error("ucp_ep_create", st);
    PeerEntry entry;
    for (const auto& w : table) {
      RemoteRegion region{w.base, nullptr};
      st = ucp_ep_rkey_unpack(wire.ep, w.rkey.data(), &region.rkey);
      if (st != UCS_OK) {
        Closing closing;
        closing.peer = id;
        closing.wire = std::move(wire);
        closing.reason = Status::aborted("its descriptor had a bad rkey");
        closing_.push_back(std::move(closing));
        start_close(closing_.back());
        finish_closes(/*all=*/false);
        return ucx_error("ucp_ep_rkey_unpack", st);
      }
      wire.regions.push_back(region);
      entry.region_lengths.push_back(w.length);
    }
    wires_.emplace(id, std::move(wire));
    std::lock_guard lock(mu_);
    peers_.emplace(id, std::move(entry));
    return id;
  });
}

BatchStatus NixlTransport::poll(BatchId id) {
  std::lock_guard lock(mu_);
  auto it = batches_.find(id);
  if (it == batches_.end()) {
    return {BatchState::kFailed, Status::not_found(fmt::format("no nixl batch {}", id))};
  }
  BatchStatus status = it->second.status;
  if (status.state != BatchState::kInProgress) batches_.erase(it);
  return status;
}

std::vector<std::string> NixlTransport::take_notifications() {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  out.swap(notifications_);
  return out;
}

void NixlTransport::set_peer_failure_callback(PeerFailureCallback callback) {
  failures_.set_callback(std::move(callback));
}

void NixlTransport::fail_peer(PeerId peer, const Status& reason) {
  const Status why = reason.is_ok() ? Status::unavailable("peer failed") : reason;
  // The endpoint is UCX's: it is closed on the progress thread. From any
  // other thread, later writes are refused once this returns.
  if (thread_.on_this_thread()) {
    thread_.post([this, peer, why] { peer_failed(peer, why); });
    return;
  }
  (void)thread_.run([&] {
    peer_failed(peer, why);
    return Status::ok();
  });
}

void NixlTransport::fence_inbound(std::string_view desc, std::optional<uint64_t> connection) {
  if (!caps_.fences_inbound) return;
  ByteReader r(desc);
  const std::optional<Header> header = read_header(r);
  if (!header) return;
  (void)thread_.run([&] {
    fence_source(header->instance, connection);
    return Status::ok();
  });
}

PDKV_REGISTER_TRANSPORT("nixl", NixlTransport::create);

}  // namespace pdkv::backends::nixl

// The `nixl` backend: NVIDIA NIXL's UCX path, on UCX `ucp`.
//
// Regions are mapped with ucp_mem_map and described to peers by a packed
// rkey. Memory from allocate() is UCX's own (ucp_mem_map ALLOCATE, shared
// memory here), which peers on this host write into directly; into other
// memory, UCX 1.13 emulates a put with active messages that the target's
// progress thread copies out (perf showed uct_mm_ep_am_bcopy at the sender
// and one-page requests waiting on the target's idle tick). The
// descriptor blob carries the worker address and every region's
// (base, length, rkey). A batch is one ucp_put_nbx per write followed by an
// endpoint flush: the flush completing is UCX's statement that every put is
// visible at the peer, and only then is the batch done and its notification
// (a UCX active message) sent. A
// dead peer fails its batches instead of hanging them: through UCX's own
// peer error handling when enabled (option error_handling=peer), and always
// through fail_peer(), the protocol layer's liveness signal.
//
// Threading: every UCX call runs on one progress thread that owns the worker
// (UCS_THREAD_MODE_SINGLE); API calls hand it tasks through a queue. While
// batches are in flight it drives ucp_worker_progress continuously; idle, it
// sleeps on the queue's condition variable and wakes every few milliseconds
// to progress what arrives unasked (notifications, keepalive), more often
// just after such traffic (progress_loop). It does not
// use UCP_FEATURE_WAKEUP: asking for it makes UCX drop its shared-memory
// transports (posix, sysv, cma), leaving TCP at a tenth of the bandwidth.
// UCX reads its usual UCX_* environment variables (UCX_TLS, UCX_NET_DEVICES, ...).
// Option host=ADDR (the rank's address) restricts UCX's network devices to
// the interface that owns ADDR, when UCX_TLS asks for TCP and
// UCX_NET_DEVICES is not set: UCX has no bind address of its own, and
// restricting it otherwise would also drop RDMA devices, which carry no
// IP address UCX would know them by.
#include <fmt/format.h>
#include <ucp/api/ucp.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "byte_codec.h"
#include "log.h"
#include "net_interface.h"
#include "pdkv/transport.h"

namespace pdkv::backends::nixl {
namespace {

constexpr std::string_view kMagic = "pdkv-nixl-1";
constexpr unsigned kNotifyAmId = 0x7d;
constexpr size_t kMaxNotification = 512;

Status ucx_error(const std::string& what, ucs_status_t status) {
  return Status::internal(fmt::format("{}: {}", what, ucs_status_string(status)));
}

class NixlTransport final : public Transport {
 public:
  static Result<std::unique_ptr<Transport>> create(const TransportOptions& options);
  ~NixlTransport() override;

  std::string_view name() const override { return "nixl"; }
  TransportCapabilities capabilities() const override { return caps_; }
  Result<MemoryRegion> allocate(uint64_t length) override;
  Result<RegionKey> register_region(const MemoryRegion& region) override;
  std::string descriptor() const override;
  Result<PeerId> connect(std::string_view peer_descriptor) override;
  Result<BatchId> write(PeerId peer, std::span<const WriteOp> ops) override {
    return write_and_notify(peer, ops, {});
  }
  Result<BatchId> write_and_notify(PeerId peer, std::span<const WriteOp> ops,
                                   std::string_view notification) override {
    return submit(peer, ops, notification, Direction::kWrite);
  }
  Result<BatchId> read(PeerId peer, std::span<const ReadOp> ops) override {
    return submit(peer, ops, {}, Direction::kRead);
  }
  BatchStatus poll(BatchId batch) override;
  std::vector<std::string> take_notifications() override;
  void set_peer_failure_callback(PeerFailureCallback callback) override;
  void fail_peer(PeerId peer, const Status& reason) override;

 private:
  struct LocalRegion {
    MemoryRegion region;
    ucp_mem_h memh = nullptr;
    bool owns_memh = true;  // false: the memh of an allocation (allocations_)
    std::string rkey;       // packed
  };
  struct RemoteRegion {
    uint64_t base = 0, length = 0;
    ucp_rkey_h rkey = nullptr;
  };
  struct Peer {
    ucp_ep_h ep = nullptr;
    std::vector<RemoteRegion> regions;
    Status failure;
    std::set<BatchId> batches;  // in progress
  };
  struct Batch {
    PeerId peer = 0;
    BatchStatus status;
    std::string notification;
  };
  struct CallbackArg {  // user_data of a flush or an endpoint's error handler
    NixlTransport* self;
    uint64_t id;
  };

  enum class Direction { kWrite, kRead };

  NixlTransport() = default;
  Status init();
  Result<BatchId> submit(PeerId peer, std::span<const WriteOp> ops, std::string_view notification,
                         Direction direction);
  void progress_loop();
  // The allocation (allocate()) that holds all of `region`, if any.
  ucp_mem_h allocation_holding(const MemoryRegion& region) const;
  void post(std::function<void()> task);
  template <typename F>
  auto run(F&& task) -> decltype(task());
  // Progress thread only:
  void start_batch(BatchId id, std::vector<WriteOp> ops, Direction direction);
  void finish_batch(BatchId id, ucs_status_t status);
  void peer_failed(PeerId id, const Status& reason);
  void close_endpoint(Peer& peer);
  static void on_flush(void* request, ucs_status_t status, void* user_data);
  static void on_peer_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  static ucs_status_t on_notification(void* arg, const void* header, size_t header_length,
                                      void* data, size_t length, const ucp_am_recv_param_t* param);

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string worker_address_;
  TransportCapabilities caps_;
  // UCP_ERR_HANDLING_MODE_PEER is an option, not the default: with UCX 1.13
  // (Debian 12) it excludes the shared-memory transports, and its TCP
  // transport asserts (tcp_ep.c:478) when peers leave while connections are
  // set up. Dead peers are then found by the protocol layer's liveness
  // (control-connection Watch + keepalive), which calls fail_peer().
  bool peer_error_handling_ = false;
  std::string host_;  // option host: the rank's address

  mutable std::mutex mu_;
  std::deque<std::function<void()>> tasks_;
  std::condition_variable tasks_cv_;
  bool stopping_ = false;
  std::vector<LocalRegion> regions_;
  std::map<uintptr_t, std::pair<uint64_t, ucp_mem_h>> allocations_;  // base -> (length, memh)
  std::map<PeerId, Peer> peers_;
  std::map<BatchId, Batch> batches_;
  std::map<PeerId, std::unique_ptr<CallbackArg>> peer_args_;    // error handler args
  std::map<BatchId, std::unique_ptr<CallbackArg>> flush_args_;  // pending flush callbacks
  std::vector<std::string> notifications_;
  PeerFailureCallback on_failure_;
  PeerId next_peer_ = 1;
  BatchId next_batch_ = 1;
  uint64_t in_flight_ = 0;  // batches the progress thread still drives
  std::thread progress_;
};

Result<std::unique_ptr<Transport>> NixlTransport::create(const TransportOptions& options) {
  std::unique_ptr<NixlTransport> t(new NixlTransport);
  for (const auto& [key, value] : options) {
    if (key == "error_handling" && (value == "peer" || value == "none")) {
      t->peer_error_handling_ = value == "peer";
    } else if (key == "host") {
      t->host_ = value;
    } else {
      return Status::invalid_argument(fmt::format(
          "nixl option '{}={}' unknown (host=ADDR, error_handling=peer|none; UCX itself is "
          "configured through its UCX_* environment variables)",
          key, value));
    }
  }
  if (const char* mode = std::getenv("PDKV_NIXL_ERROR_HANDLING")) {
    t->peer_error_handling_ = std::string_view(mode) != "none";
  }
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
  const char* tls = std::getenv("UCX_TLS");
  if (!host_.empty() && std::getenv("UCX_NET_DEVICES") == nullptr && tls != nullptr &&
      std::string_view(tls).find("tcp") != std::string_view::npos) {
    if (auto device = interface_of(host_)) {
      (void)ucp_config_modify(config, "NET_DEVICES", device->c_str());
    } else {
      logger("nixl")->warn("host {} is on no interface of this host; UCX picks its devices", host_);
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
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
  caps_.notifications = true;
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

  ucp_am_handler_param_t am{};
  am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                  UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  am.id = kNotifyAmId;
  am.cb = &NixlTransport::on_notification;
  am.arg = this;
  am.flags = UCP_AM_FLAG_WHOLE_MSG;
  st = ucp_worker_set_am_recv_handler(worker_, &am);
  if (st != UCS_OK) return ucx_error("ucp_worker_set_am_recv_handler", st);

  progress_ = std::thread([this] { progress_loop(); });
  return Status::ok();
}

NixlTransport::~NixlTransport() {
  if (progress_.joinable()) {
    run([this] {
      std::lock_guard lock(mu_);
      const Status closing = Status::aborted("nixl transport shut down");
      for (auto& [id, peer] : peers_) {
        for (BatchId b : peer.batches) {
          batches_.at(b).status = {BatchState::kFailed, closing};
          --in_flight_;
        }
        peer.batches.clear();
        close_endpoint(peer);
      }
      return 0;
    });
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    tasks_cv_.notify_all();
    progress_.join();
  }
  for (auto& r : regions_) {
    if (r.memh && r.owns_memh) ucp_mem_unmap(context_, r.memh);
  }
  for (auto& [base, allocation] : allocations_) ucp_mem_unmap(context_, allocation.second);
  if (worker_) ucp_worker_destroy(worker_);
  if (context_) ucp_cleanup(context_);
}

void NixlTransport::post(std::function<void()> task) {
  {
    std::lock_guard lock(mu_);
    tasks_.push_back(std::move(task));
  }
  tasks_cv_.notify_one();
}

template <typename F>
auto NixlTransport::run(F&& task) -> decltype(task()) {
  std::packaged_task<decltype(task())()> job(std::forward<F>(task));
  auto result = job.get_future();
  post([&job] { job(); });
  return result.get();
}

void NixlTransport::progress_loop() {
  // Idle, the thread wakes every kIdleTick for what arrives unasked. Emulated
  // puts (into memory UCX did not allocate: file comment) arrive that way
  // too, so for kHotWindow after any such event it ticks at kHotTick: a
  // transfer in progress is not held up by a sleeping target, and a quiet
  // rank costs almost nothing.
  constexpr std::chrono::microseconds kIdleTick{2000}, kHotTick{50}, kHotWindow{5000};
  auto hot_until = std::chrono::steady_clock::time_point::min();
  std::unique_lock lock(mu_);
  while (true) {
    if (stopping_ && tasks_.empty() && in_flight_ == 0) break;
    if (tasks_.empty() && in_flight_ == 0) {
      const auto tick = std::chrono::steady_clock::now() < hot_until ? kHotTick : kIdleTick;
      tasks_cv_.wait_for(lock, tick, [this] { return stopping_ || !tasks_.empty(); });
    }
    std::deque<std::function<void()>> tasks;
    tasks.swap(tasks_);
    lock.unlock();
    for (auto& task : tasks) task();
    unsigned events = 0;
    while (ucp_worker_progress(worker_) != 0) ++events;
    if (events > 0) hot_until = std::chrono::steady_clock::now() + kHotWindow;
    if (events == 0 && tasks.empty()) std::this_thread::yield();  // in flight, nothing new
    lock.lock();
  }
}

Result<MemoryRegion> NixlTransport::allocate(uint64_t length) {
  if (length == 0) return Status::invalid_argument("nixl: allocation of 0 bytes");
  return run([&]() -> Result<MemoryRegion> {
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
  return run([&]() -> Result<RegionKey> {
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
  std::lock_guard lock(mu_);
  w.u64(regions_.size());
  for (const auto& r : regions_) {
    w.u64(reinterpret_cast<uint64_t>(r.region.base));
    w.u64(r.region.length);
    w.bytes(r.rkey);
  }
  return w.take();
}

Result<PeerId> NixlTransport::connect(std::string_view desc) {
  ByteReader r(desc);
  std::string_view magic, address;
  uint64_t count = 0;
  if (!r.bytes(magic) || magic != kMagic || !r.bytes(address) || !r.u64(count) ||
      count > (1u << 20)) {
    return Status::invalid_argument(
        fmt::format("not a nixl descriptor ({} bytes): bad header", desc.size()));
  }
  struct Wire {
    uint64_t base, length;
    std::string_view rkey;
  };
  std::vector<Wire> wire(count);
  for (auto& w : wire) {
    if (!r.u64(w.base) || !r.u64(w.length) || !r.bytes(w.rkey)) {
      return Status::invalid_argument("nixl descriptor truncated in its region table");
    }
  }
  return run([&]() -> Result<PeerId> {
    std::lock_guard lock(mu_);
    const PeerId id = next_peer_++;
    auto arg = std::make_unique<CallbackArg>(CallbackArg{this, id});
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(address.data());
    ep.err_mode = peer_error_handling_ ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    ep.err_handler.cb = &NixlTransport::on_peer_error;
    ep.err_handler.arg = arg.get();
    Peer peer;
    ucs_status_t st = ucp_ep_create(worker_, &ep, &peer.ep);
    if (st != UCS_OK) return ucx_error("ucp_ep_create", st);
    for (const auto& w : wire) {
      RemoteRegion region{w.base, w.length, nullptr};
      st = ucp_ep_rkey_unpack(peer.ep, w.rkey.data(), &region.rkey);
      if (st != UCS_OK) {
        close_endpoint(peer);
        return ucx_error("ucp_ep_rkey_unpack", st);
      }
      peer.regions.push_back(region);
    }
    peer_args_[id] = std::move(arg);
    peers_.emplace(id, std::move(peer));
    return id;
  });
}

Result<BatchId> NixlTransport::submit(PeerId peer_id, std::span<const WriteOp> ops,
                                      std::string_view notification, Direction direction) {
  if (notification.size() > kMaxNotification) {
    return Status::invalid_argument(fmt::format("nixl notification of {} bytes exceeds {}",
                                                notification.size(), kMaxNotification));
  }
  BatchId id;
  {
    std::lock_guard lock(mu_);
    auto peer = peers_.find(peer_id);
    if (peer == peers_.end()) return Status::not_found(fmt::format("no nixl peer {}", peer_id));
    if (!peer->second.failure.is_ok()) return peer->second.failure;
    std::vector<uint64_t> local_lengths, remote_lengths;
    for (const auto& r : regions_) local_lengths.push_back(r.region.length);
    for (const auto& r : peer->second.regions) remote_lengths.push_back(r.length);
    PDKV_RETURN_IF_ERROR(check_ops_bounds(direction == Direction::kWrite ? "write" : "read", ops,
                                          local_lengths, remote_lengths));
    id = next_batch_++;
    Batch batch;  // field by field: GCC's -O3 sees `{}` as maybe uninitialised
    batch.peer = peer_id;
    batch.notification = std::string(notification);
    batches_.emplace(id, std::move(batch));
    peer->second.batches.insert(id);
    ++in_flight_;
  }
  post([this, id, direction, copy = std::vector<WriteOp>(ops.begin(), ops.end())]() mutable {
    start_batch(id, std::move(copy), direction);
  });
  return id;
}

void NixlTransport::start_batch(BatchId id, std::vector<WriteOp> ops, Direction direction) {
  ucs_status_t immediate;
  {
    std::lock_guard lock(mu_);
    Batch& batch = batches_.at(id);
    if (batch.status.state != BatchState::kInProgress) return;  // its peer failed meanwhile
    Peer& peer = peers_.at(batch.peer);
    ucp_request_param_t none{};
    for (const WriteOp& op : ops) {
      const LocalRegion& local = regions_[op.local_region];
      const RemoteRegion& remote = peer.regions[op.remote_region];
      void* buffer = static_cast<char*>(local.region.base) + op.local_offset;
      const uint64_t address = remote.base + op.remote_offset;
      ucs_status_ptr_t req =
          direction == Direction::kWrite
              ? ucp_put_nbx(peer.ep, buffer, op.length, address, remote.rkey, &none)
              : ucp_get_nbx(peer.ep, buffer, op.length, address, remote.rkey, &none);
      if (UCS_PTR_IS_ERR(req)) {
        batch.status = {BatchState::kFailed,
                        ucx_error(direction == Direction::kWrite ? "ucp_put_nbx" : "ucp_get_nbx",
                                  UCS_PTR_STATUS(req))};
        peer.batches.erase(id);
        --in_flight_;
        return;
      }
      // The flush below covers every put's (and get's) completion: no callback per op.
      if (req != nullptr) ucp_request_free(req);
    }
    auto arg = std::make_unique<CallbackArg>(CallbackArg{this, id});
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = &NixlTransport::on_flush;
    param.user_data = arg.get();
    ucs_status_ptr_t flush = ucp_ep_flush_nbx(peer.ep, &param);
    if (flush != nullptr && !UCS_PTR_IS_ERR(flush)) {
      flush_args_[id] = std::move(arg);  // kept until on_flush
      return;
    }
    // Completed (or failed) at once: no callback will come.
    immediate = flush == nullptr ? UCS_OK : UCS_PTR_STATUS(flush);
  }
  finish_batch(id, immediate);
}

void NixlTransport::on_flush(void* request, ucs_status_t status, void* user_data) {
  auto* arg = static_cast<CallbackArg*>(user_data);
  NixlTransport* self = arg->self;
  const BatchId id = arg->id;
  ucp_request_free(request);
  self->finish_batch(id, status);
  std::lock_guard lock(self->mu_);
  self->flush_args_.erase(id);
}

void NixlTransport::finish_batch(BatchId id, ucs_status_t status) {
  std::lock_guard lock(mu_);
  auto it = batches_.find(id);
  if (it == batches_.end() || it->second.status.state != BatchState::kInProgress) return;
  Batch& batch = it->second;
  Peer& peer = peers_.at(batch.peer);
  peer.batches.erase(id);
  --in_flight_;
  if (status != UCS_OK) {
    batch.status = {BatchState::kFailed, ucx_error("flush", status)};
    return;
  }
  if (!batch.notification.empty()) {
    // After the flush: the peer sees the notification only once the bytes are there.
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_AM_SEND_FLAG_EAGER;
    ucs_status_ptr_t req =
        ucp_am_send_nbx(peer.ep, kNotifyAmId, nullptr, 0, batch.notification.data(),
                        batch.notification.size(), &param);
    if (UCS_PTR_IS_ERR(req)) {
      batch.status = {BatchState::kFailed, ucx_error("notification", UCS_PTR_STATUS(req))};
      return;
    }
    // Eager sends copy the payload when they return a request; it finishes on its own.
    if (req != nullptr) ucp_request_free(req);
  }
  batch.status = {BatchState::kDone, Status::ok()};
}

ucs_status_t NixlTransport::on_notification(void* arg, const void*, size_t, void* data,
                                            size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<NixlTransport*>(arg);
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) return UCS_OK;  // never sent: eager only
  std::lock_guard lock(self->mu_);
  self->notifications_.emplace_back(static_cast<const char*>(data), length);
  return UCS_OK;
}

void NixlTransport::on_peer_error(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* a = static_cast<CallbackArg*>(arg);
  a->self->peer_failed(a->id, ucx_error("UCX reported the peer failed", status));
}

void NixlTransport::peer_failed(PeerId id, const Status& reason) {
  PeerFailureCallback callback;
  {
    std::lock_guard lock(mu_);
    auto it = peers_.find(id);
    if (it == peers_.end() || !it->second.failure.is_ok()) return;
    Peer& peer = it->second;
    peer.failure = reason;
    for (BatchId b : peer.batches) {
      batches_.at(b).status = {BatchState::kFailed, reason};
      --in_flight_;
    }
    peer.batches.clear();
    close_endpoint(peer);
    callback = on_failure_;
  }
  if (callback) callback(id, reason);
}

void NixlTransport::close_endpoint(Peer& peer) {
  for (auto& r : peer.regions) {
    if (r.rkey) ucp_rkey_destroy(r.rkey);
    r.rkey = nullptr;
  }
  if (peer.ep == nullptr) return;
  // UCX defines a forced close only for endpoints in PEER error-handling mode
  // on both sides; otherwise close with a flush. Either way wait a bounded
  // time: a dead peer never confirms, and the worker's destruction reclaims
  // whatever is left.
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = peer_error_handling_ ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t req = ucp_ep_close_nbx(peer.ep, &param);
  if (req != nullptr && !UCS_PTR_IS_ERR(req)) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    while (ucp_request_check_status(req) == UCS_INPROGRESS &&
           std::chrono::steady_clock::now() < give_up) {
      ucp_worker_progress(worker_);
    }
    ucp_request_free(req);  // released now, or by UCX when the close completes
  }
  peer.ep = nullptr;
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
  std::lock_guard lock(mu_);
  on_failure_ = std::move(callback);
}

void NixlTransport::fail_peer(PeerId peer, const Status& reason) {
  const Status why = reason.is_ok() ? Status::unavailable("peer failed") : reason;
  // The endpoint is UCX's: close it on the progress thread.
  run([&] {
    peer_failed(peer, why);
    return 0;
  });
}

PDKV_REGISTER_TRANSPORT("nixl", NixlTransport::create);

}  // namespace
}  // namespace pdkv::backends::nixl

// The transfer engine's API: segments, batches and their status. The data
// plane lives in rail.cc (initiator), inbound.cc (target) and peer.cc.
#include "transfer_engine.h"

#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "engine_impl.h"
#include "host_identity.h"
#include "log.h"

namespace pdkv::backends::mooncake {
namespace {

constexpr auto kTickPeriod = std::chrono::milliseconds(20);

Result<int> listen_on(const std::string& text, std::string& advertised) {
  PDKV_ASSIGN_OR_RETURN(SocketAddress address, parse_address(text, false));
  const bool wildcard =
      address.storage.ss_family == AF_INET
          ? reinterpret_cast<sockaddr_in*>(&address.storage)->sin_addr.s_addr == INADDR_ANY
          : IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<sockaddr_in6*>(&address.storage)->sin6_addr);
  if (wildcard) {
    return Status::invalid_argument(fmt::format(
        "mooncake listen address '{}' is a wildcard; name the interface's address, since peers "
        "connect to what is listed",
        text));
  }
  const int fd = ::socket(address.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::internal(fmt::format("socket: {}", std::strerror(errno)));
  if (::bind(fd, address.get(), address.length) != 0 || ::listen(fd, 128) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::unavailable(
        fmt::format("mooncake cannot listen on '{}': {}", text, std::strerror(err)));
  }
  address.length = sizeof address.storage;
  getsockname(fd, reinterpret_cast<sockaddr*>(&address.storage), &address.length);
  advertised = format_address(address);
  return fd;
}

// A same-host path to `desc`'s process, or why there is none. On success
// `pidfd` watches the process's exit.
Status same_host_path(const SegmentDescriptor& desc, const std::string& host_identity, int& pidfd) {
  if (host_identity.empty() || desc.host_identity != host_identity) {
    return Status::failed_precondition("the segment is on another host");
  }
  const pid_t pid = static_cast<pid_t>(desc.pid);
  pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) return Status::unavailable(fmt::format("pidfd_open: {}", std::strerror(errno)));
  // After the pidfd exists, a matching start time proves it is the same process.
  if (process_start_time(pid) != desc.start_time) {
    ::close(pidfd);
    pidfd = -1;
    return Status::unavailable(fmt::format("process {} is gone", pid));
  }
  if (!desc.buffers.empty()) {  // probe the permission with a harmless read of one byte
    char byte;
    iovec local{&byte, 1}, remote{reinterpret_cast<void*>(desc.buffers[0].base), 1};
    if (process_vm_readv(pid, &local, 1, &remote, 1, 0) != 1) {
      const int err = errno;
      ::close(pidfd);
      pidfd = -1;
      return Status::failed_precondition(
          fmt::format("process_vm_readv of process {}: {}", pid, std::strerror(err)));
    }
  }
  return Status::ok();
}

}  // namespace

const char* transfer_state_name(TransferState state) {
  switch (state) {
    case TransferState::kWaiting:
      return "waiting";
    case TransferState::kPending:
      return "pending";
    case TransferState::kCompleted:
      return "completed";
    case TransferState::kFailed:
      return "failed";
    case TransferState::kTimeout:
      return "timeout";
  }
  return "unknown";
}

TransferEngine::Impl::~Impl() {
  for (auto& l : loops) l->loop.stop();  // first: no handler runs past here
}

bool TransferEngine::Impl::local_contains(uint64_t addr, uint64_t length) const {
  std::shared_lock lock(buffers_mu);
  return buffer_index.find(addr, length) != nullptr;
}

bool TransferEngine::Impl::Batch::advance(size_t index, TransferState to, Status error) {
  Request& r = requests[index];
  const bool ended = r.state != TransferState::kWaiting && r.state != TransferState::kPending;
  if (ended || r.state == to) return false;
  if (r.state == TransferState::kWaiting) ++started;
  r.state = to;
  if (to == TransferState::kCompleted) ++completed;
  if (to == TransferState::kFailed || to == TransferState::kTimeout) {
    r.error = std::move(error);
    if (!first_failure) first_failure = index;
  }
  return true;
}

void TransferEngine::Impl::mark_pending(const Slices& slices) {
  std::lock_guard lock(mu);
  for (const auto& s : slices) {
    auto b = batches.find(s->batch);
    if (b != batches.end()) b->second.advance(s->request, TransferState::kPending);
  }
}

SlicePtr TransferEngine::Impl::new_slice() {
  if (spare_slices.empty()) return std::make_unique<Slice>();
  SlicePtr s = std::move(spare_slices.back());
  spare_slices.pop_back();
  return s;
}

void TransferEngine::Impl::complete(Slices& slices) {
  std::vector<std::pair<Peer*, SlicePtr>> released;
  {
    std::lock_guard lock(mu);
    for (const auto& s : slices) {
      auto b = batches.find(s->batch);
      if (b == batches.end()) continue;  // freed after it failed
      --b->second.slices_out;
      if (b->second.first_failure && b->second.slices_out == 0) batch_ends.mark();  // over
      Request& r = b->second.requests[s->request];
      if (r.state != TransferState::kWaiting && r.state != TransferState::kPending) continue;
      r.transferred += s->length;
      b->second.transferred += s->length;
      if (--r.slices_left == 0 && b->second.advance(s->request, TransferState::kCompleted)) {
        release_notification(b->second, released);
        if (b->second.announcing()) batch_ends.mark();
      }
    }
    for (auto& s : slices) {
      if (spare_slices.size() == kMaxSpareSlices) break;
      // A notification's slice is one a batch and would keep its message's
      // buffer: it is freed.
      if (s->opcode != Opcode::kNotify) spare_slices.push_back(std::move(s));
    }
  }
  slices.clear();
  for (auto& [peer, slice] : released) peer->post_dispatch(std::move(slice));
  batch_ends.announce();
}

void TransferEngine::Impl::release_notification(Batch& batch,
                                                std::vector<std::pair<Peer*, SlicePtr>>& out) {
  // The held notification is the one request not completed.
  if (!batch.notification || batch.completed + 1 != batch.requests.size()) return;
  ++batch.slices_out;
  batch.peers.insert(batch.notify_peer);
  out.emplace_back(batch.notify_peer, std::move(batch.notification));
}

void TransferEngine::Impl::fail(const Slice& slice, TransferState state, const Status& reason) {
  {
    std::lock_guard lock(mu);
    auto b = batches.find(slice.batch);
    if (b == batches.end()) return;
    --b->second.slices_out;
    b->second.advance(slice.request, state, reason);
    batch_ends.mark();
  }
  batch_ends.announce();
}

void TransferEngine::Impl::fail_request(const Slice& slice, const Status& reason) {
  {
    std::lock_guard lock(mu);
    auto b = batches.find(slice.batch);
    if (b == batches.end()) return;
    b->second.advance(slice.request, TransferState::kFailed, reason);
    batch_ends.mark();
  }
  batch_ends.announce();
}

bool TransferEngine::Impl::wanted(const Slice& slice) {
  std::lock_guard lock(mu);
  auto b = batches.find(slice.batch);
  return b != batches.end() && !b->second.first_failure;
}

void TransferEngine::Impl::segment_failed(SegmentHandle segment, const Status& reason) {
  FailureCallback callback;
  {
    std::lock_guard lock(mu);
    if (!failed_segments.emplace(segment, reason).second) return;
    callback = on_failure;
  }
  if (callback) callback(segment, reason);
}

TransferEngine::TransferEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TransferEngine::~TransferEngine() = default;

Result<std::unique_ptr<TransferEngine>> TransferEngine::create(EngineConfig config) {
  auto impl = std::make_unique<Impl>();
  if (config.listen.empty()) return Status::invalid_argument("mooncake needs a listen address");
  if (config.io_threads == 0) return Status::invalid_argument("mooncake io_threads must be >= 1");
  impl->config = config;
  PDKV_ASSIGN_OR_RETURN(impl->secret, random_secret());
  impl->host_identity = local_host_identity();
  for (const auto& b : config.bind) {
    PDKV_ASSIGN_OR_RETURN(SocketAddress a, parse_address(b, false));
    impl->bind_addresses.push_back(a);
  }
  std::vector<int> fds;
  for (const auto& address : config.listen) {
    std::string advertised;
    auto fd = listen_on(address, advertised);
    if (!fd.is_ok()) {
      for (int f : fds) ::close(f);
      return fd.status();
    }
    fds.push_back(*fd);
    impl->rail_addresses.push_back(advertised);
  }
  Impl* core = impl.get();
  for (uint32_t i = 0; i < config.io_threads; ++i) {
    auto& ctx = *impl->loops.emplace_back(std::make_unique<LoopContext>());
    PDKV_RETURN_IF_ERROR(ctx.loop.start(
        [&ctx] {
          const auto now = Clock::now();
          bool pending = false;
          for (Peer* p : ctx.peers) pending |= p->tick(now);
          for (auto it = ctx.inbound.begin(); it != ctx.inbound.end();) {
            Inbound* conn = (it++)->first;  // a refused one erases itself later
            pending |= conn->check_handshake(now);
          }
          return pending;
        },
        kTickPeriod));
  }
  LoopContext& first = *impl->loops.front();
  for (int fd : fds) {
    auto& listener = impl->listeners.emplace_back(std::make_unique<Listener>(*core, fd));
    first.loop.post([&first, l = listener.get()] { first.loop.add(l->fd(), EPOLLIN, l); });
  }
  logger("mooncake")
      ->debug("segment {} up, {} rail address(es)", impl->segment_name(),
              impl->rail_addresses.size());
  return std::unique_ptr<TransferEngine>(new TransferEngine(std::move(impl)));
}

Result<void*> TransferEngine::allocate_shared(uint64_t length) {
  std::unique_lock lock(impl_->buffers_mu);
  return impl_->shared_pools.allocate(length);
}

Status TransferEngine::register_local_memory(void* addr, uint64_t length) {
  if (addr == nullptr || length == 0) return Status::invalid_argument("mooncake: empty buffer");
  const auto base = reinterpret_cast<uint64_t>(addr);
  std::unique_lock lock(impl_->buffers_mu);
  impl_->buffers.push_back(impl_->shared_pools.describe(base, length));
  impl_->buffer_index = BufferIndex(impl_->buffers);
  return Status::ok();
}

TransferEngine::SameHostBytes TransferEngine::same_host_bytes() const {
  return {impl_->same_host_mapped_bytes.load(), impl_->same_host_kernel_bytes.load()};
}

bool TransferEngine::on_this_host(std::string_view descriptor) const {
  const auto desc = SegmentDescriptor::decode(descriptor);
  return desc.is_ok() && !impl_->host_identity.empty() &&
         desc->host_identity == impl_->host_identity;
}

std::string TransferEngine::segment_descriptor() const {
  SegmentDescriptor d;
  d.name = impl_->segment_name();
  d.host_identity = impl_->host_identity;
  d.pid = static_cast<uint64_t>(::getpid());
  d.start_time = process_start_time(::getpid());
  d.secret = impl_->secret;
  d.rails = impl_->rail_addresses;
  std::shared_lock lock(impl_->buffers_mu);
  d.buffers = impl_->buffers;
  return d.encode();
}

Result<SegmentHandle> TransferEngine::open_segment(std::string_view descriptor) {
  PDKV_ASSIGN_OR_RETURN(SegmentDescriptor desc, SegmentDescriptor::decode(descriptor));
  for (const auto& rail : desc.rails) {
    auto a = parse_address(rail, true);
    if (!a.is_ok()) {
      return Status::invalid_argument("mooncake descriptor: " + a.status().message());
    }
  }
  int pidfd = -1;
  bool same_host = false;
  if (impl_->config.same_host != SameHost::kOff) {
    const Status path = same_host_path(desc, impl_->host_identity, pidfd);
    same_host = path.is_ok();
    if (!same_host && impl_->config.same_host == SameHost::kRequire) {
      return Status::failed_precondition(
          fmt::format("mooncake same_host=require, but segment {} has no same-host path: {}",
                      desc.name, path.message()));
    }
    if (!same_host && path.code() != StatusCode::kFailedPrecondition) {
      return Status::unavailable(fmt::format("segment {}: {}", desc.name, path.message()));
    }
    if (!same_host && desc.host_identity == impl_->host_identity) {
      logger("mooncake")
          ->warn("segment {}: same-host path unavailable ({}); using TCP", desc.name,
                 path.message());
    }
  }
  // Mapped here, on the caller's thread, not on the I/O loop: populating the
  // page tables of gigabytes of pools takes a while (shared_pool.h).
  PeerMappings mapped;
  if (same_host && pidfd >= 0) {
    const Status status = mapped.map(pidfd, desc.buffers);
    if (!status.is_ok()) {
      logger("mooncake")
          ->info("segment {}: a shared buffer is not mapped ({}); the kernel copies into it",
                 desc.name, status.message());
    }
  }
  LoopContext& loop = impl_->pick_loop();
  Peer* peer;
  SegmentHandle handle;
  {
    std::lock_guard lock(impl_->mu);
    handle = impl_->next_segment++;
    auto owned = std::make_unique<Peer>(*impl_, handle, std::move(desc), loop, std::move(mapped));
    peer = owned.get();
    impl_->peers.emplace(handle, std::move(owned));
  }
  loop.loop.post([peer, same_host, pidfd] { peer->start(same_host, pidfd); });
  return handle;
}

Result<std::vector<SegmentDescriptor::Buffer>> TransferEngine::segment_buffers(
    SegmentHandle segment) const {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->peers.find(segment);
  if (it == impl_->peers.end()) {
    return Status::not_found(fmt::format("no open mooncake segment {}", segment));
  }
  return it->second->descriptor().buffers;
}

void TransferEngine::close_segment(SegmentHandle segment, const Status& reason) {
  Peer* peer;
  {
    std::lock_guard lock(impl_->mu);
    auto it = impl_->peers.find(segment);
    if (it == impl_->peers.end()) return;
    peer = it->second.get();
  }
  peer->loop().loop.post([peer, reason] { peer->fail(reason, false); });
}

void TransferEngine::set_batch_end_callback(std::function<void()> callback) {
  impl_->batch_ends.set(std::move(callback));
}

void TransferEngine::set_notification_callback(std::function<void()> callback) {
  impl_->notes_arrived.set(std::move(callback));
}

void TransferEngine::set_segment_failure_callback(FailureCallback callback) {
  std::lock_guard lock(impl_->mu);
  impl_->on_failure = std::move(callback);
}

Result<BatchId> TransferEngine::allocate_batch_id(size_t batch_size) {
  if (batch_size == 0) return Status::invalid_argument("mooncake batch of size 0");
  std::lock_guard lock(impl_->mu);
  const BatchId id = impl_->next_batch++;
  impl_->batches[id].capacity = batch_size;
  return id;
}

Status TransferEngine::Impl::check_requests(std::span<const TransferRequest> requests) const {
  // A batch's requests mostly go to one segment: each run of them looks it up once.
  const Peer* target = nullptr;
  for (size_t i = 0; i < requests.size(); ++i) {
    const TransferRequest& r = requests[i];
    if (r.opcode != Opcode::kWrite && r.opcode != Opcode::kRead) {
      return Status::invalid_argument(
          fmt::format("request {}: opcode {} is not write or read (notifications: "
                      "submit_notification)",
                      i, static_cast<int>(r.opcode)));
    }
    if (i == 0 || r.target != requests[i - 1].target) {
      auto peer = peers.find(r.target);
      if (peer == peers.end()) {
        return Status::not_found(fmt::format("request {}: no open segment {}", i, r.target));
      }
      if (auto f = failed_segments.find(r.target); f != failed_segments.end()) return f->second;
      target = peer->second.get();
    }
    if (!local_contains(reinterpret_cast<uint64_t>(r.source), r.length)) {
      return Status::out_of_range(
          fmt::format("request {}: local bytes [{}, +{}) are not registered", i,
                      static_cast<const void*>(r.source), r.length));
    }
    if (target->find_buffer(r.target_offset, r.length) == nullptr) {
      return Status::out_of_range(
          fmt::format("request {}: target bytes [{:#x}, +{}) outside segment {}'s buffers", i,
                      r.target_offset, r.length, target->descriptor().name));
    }
  }
  return Status::ok();
}

std::map<Peer*, Slices> TransferEngine::Impl::slice_requests(
    BatchId batch_id, Batch& batch, std::span<const TransferRequest> requests) {
  std::map<Peer*, Slices> by_peer;
  if (batch.requests.empty()) {
    batch.deadline = Clock::now() + config.request_timeout;
    // A batch is mostly submitted whole, then its notification: its list of
    // 65,536 is not regrown (a regrowth moved every request, on fresh
    // pages), and its storage is an earlier batch's.
    if (batch.requests.capacity() == 0) batch.requests = spare_requests.take();
    batch.requests.reserve(std::min(batch.capacity, requests.size() + 1));
  }
  Slices* slices = nullptr;  // those of requests[i - 1]'s segment
  for (size_t i = 0; i < requests.size(); ++i) {
    const TransferRequest& r = requests[i];
    const auto index = static_cast<uint32_t>(batch.requests.size());
    Request& rec = batch.requests.emplace_back();
    rec.slices_left = (r.length + config.slice_bytes - 1) / config.slice_bytes;
    if (rec.slices_left == 0) batch.advance(index, TransferState::kCompleted);
    if (i == 0 || r.target != requests[i - 1].target) {
      Peer* target = peers.at(r.target).get();  // check_requests found it
      slices = &by_peer[target];
      batch.peers.insert(target);
    }
    batch.slices_out += rec.slices_left;
    for (uint64_t off = 0; off < r.length; off += config.slice_bytes) {
      // A whole Slice is assigned, so that nothing of a spare one's last use
      // is left (every field is named: -Wmissing-field-initializers).
      *slices->emplace_back(new_slice()) =
          Slice{.batch = batch_id,
                .request = index,
                .opcode = r.opcode,
                .local = r.source + off,
                .remote = r.target_offset + off,
                .length = std::min(config.slice_bytes, r.length - off),
                .attempts = 0,
                .seq = 0,
                .message = {}};
    }
  }
  return by_peer;
}

Status TransferEngine::submit_transfer(BatchId batch_id,
                                       std::span<const TransferRequest> requests) {
  std::map<Peer*, Slices> by_peer;
  {
    std::lock_guard lock(impl_->mu);
    auto b = impl_->batches.find(batch_id);
    if (b == impl_->batches.end()) return Status::not_found(fmt::format("no batch {}", batch_id));
    Impl::Batch& batch = b->second;
    if (batch.requests.size() + requests.size() > batch.capacity) {
      return Status::out_of_range(fmt::format("batch {} holds {} requests; {} more do not fit",
                                              batch_id, batch.capacity, requests.size()));
    }
    // Check everything before anything is queued: a refused submission moves nothing.
    PDKV_RETURN_IF_ERROR(impl_->check_requests(requests));
    by_peer = impl_->slice_requests(batch_id, batch, requests);
  }
  for (auto& [peer, slices] : by_peer) peer->post_dispatch(std::move(slices));
  return Status::ok();
}

Status TransferEngine::submit_notification(BatchId batch_id, SegmentHandle target,
                                           std::string message) {
  if (message.size() > wire::kMaxNotifyPayload) {
    return Status::invalid_argument(fmt::format("mooncake notification of {} bytes exceeds {}",
                                                message.size(), wire::kMaxNotifyPayload));
  }
  std::vector<std::pair<Peer*, SlicePtr>> released;
  {
    std::lock_guard lock(impl_->mu);
    auto b = impl_->batches.find(batch_id);
    if (b == impl_->batches.end()) return Status::not_found(fmt::format("no batch {}", batch_id));
    Impl::Batch& batch = b->second;
    auto peer = impl_->peers.find(target);
    if (peer == impl_->peers.end()) return Status::not_found(fmt::format("no segment {}", target));
    if (batch.notification || batch.requests.size() >= batch.capacity) {
      return Status::failed_precondition(
          fmt::format("batch {} has no room for a notification", batch_id));
    }
    if (batch.requests.empty()) batch.deadline = Clock::now() + impl_->config.request_timeout;
    const auto index = static_cast<uint32_t>(batch.requests.size());
    batch.requests.emplace_back().slices_left = 1;
    auto slice = std::make_unique<Slice>();
    slice->batch = batch_id;
    slice->request = index;
    slice->opcode = Opcode::kNotify;
    slice->length = message.size();
    slice->message = std::move(message);
    slice->local = slice->message.data();
    batch.notification = std::move(slice);
    batch.notify_peer = peer->second.get();
    impl_->release_notification(batch, released);
  }
  for (auto& [peer, slice] : released) peer->post_dispatch(std::move(slice));
  return Status::ok();
}

std::vector<std::string> TransferEngine::take_notifications() {
  std::lock_guard lock(impl_->mu);
  return std::exchange(impl_->notifications, {});
}

namespace {

// Lazily ends requests whose batch passed its deadline (mu held).
void apply_deadline(TransferEngine::Impl::Batch& batch, std::chrono::milliseconds timeout) {
  if (Clock::now() < batch.deadline || batch.completed == batch.requests.size()) return;
  const Status late = Status::deadline_exceeded(
      fmt::format("not completed within {} ms (request_timeout_ms, else the engine's transfer "
                  "timeout)",
                  timeout.count()));
  for (size_t i = 0; i < batch.requests.size(); ++i) {
    batch.advance(i, TransferState::kTimeout, late);
  }
  batch.deadline = Clock::time_point::max();  // once
}

// A batch's state as get_batch_status reports it (mu held): failed once a
// request failed and no slice of it is out any more.
TransferStatus summarize(const TransferEngine::Impl::Batch& batch) {
  TransferStatus total;
  total.transferred_bytes = batch.transferred;
  if (batch.first_failure && batch.slices_out > 0) {
    total.state = TransferState::kPending;  // failed, not yet over
  } else if (batch.first_failure) {
    const TransferEngine::Impl::Request& failed = batch.requests[*batch.first_failure];
    total.state = failed.state;
    total.error = failed.error;
  } else if (batch.completed == batch.requests.size()) {
    total.state = TransferState::kCompleted;
  } else {
    total.state = batch.started == 0 ? TransferState::kWaiting : TransferState::kPending;
  }
  return total;
}

}  // namespace

Result<TransferStatus> TransferEngine::get_transfer_status(BatchId batch_id, size_t task_id) {
  std::lock_guard lock(impl_->mu);
  auto b = impl_->batches.find(batch_id);
  if (b == impl_->batches.end()) return Status::not_found(fmt::format("no batch {}", batch_id));
  if (task_id >= b->second.requests.size()) {
    return Status::out_of_range(fmt::format("batch {} has {} requests, not {}", batch_id,
                                            b->second.requests.size(), task_id + 1));
  }
  apply_deadline(b->second, impl_->config.request_timeout);
  const Impl::Request& r = b->second.requests[task_id];
  return TransferStatus{r.state, r.transferred, r.error};
}

Result<TransferStatus> TransferEngine::get_batch_status(BatchId batch_id) {
  std::set<Peer*> to_cancel;
  TransferStatus total;
  {
    std::lock_guard lock(impl_->mu);
    auto b = impl_->batches.find(batch_id);
    if (b == impl_->batches.end()) return Status::not_found(fmt::format("no batch {}", batch_id));
    Impl::Batch& batch = b->second;
    apply_deadline(batch, impl_->config.request_timeout);
    if (batch.first_failure && batch.slices_out > 0 && !batch.cancelled) {
      batch.cancelled = true;
      to_cancel = batch.peers;
    }
    total = summarize(batch);
  }
  for (Peer* peer : to_cancel) {
    peer->loop().loop.post([peer, batch_id] { peer->cancel(batch_id); });
  }
  return total;
}

Status TransferEngine::free_batch_id(BatchId batch_id) {
  std::lock_guard lock(impl_->mu);
  auto batch = impl_->batches.find(batch_id);
  if (batch == impl_->batches.end()) {
    return Status::not_found(fmt::format("no batch {}", batch_id));
  }
  impl_->spare_requests.give_back(std::move(batch->second.requests));
  impl_->batches.erase(batch);
  return Status::ok();
}

void TransferEngine::acquire_inbound_writes() const {
  (void)impl_->memory_order.load(std::memory_order_acquire);
}

void TransferEngine::release_to_peers() {
  impl_->memory_order.fetch_add(1, std::memory_order_release);
}

}  // namespace pdkv::backends::mooncake

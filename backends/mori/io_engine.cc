#include "io_engine.h"

#include <fmt/format.h>
#include <poll.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "fabric_endpoint.h"
#include "host_identity.h"
#include "log.h"

namespace pdkv::backends::mori {
namespace {

using Clock = std::chrono::steady_clock;

// Idle, the progress thread still reads the completion queues this often:
// manual-progress providers move inbound data only when polled.
constexpr auto kIdleTick = std::chrono::milliseconds(1);
// After peers' traffic was last seen, the thread keeps polling without
// sleeping this long: on shm every small write waits for the target's poll.
constexpr auto kHotWindow = std::chrono::milliseconds(5);

// Errors that mean the peer is gone (or cannot be reached), not a bad request.
bool peer_is_gone(int err) {
  switch (err) {
    case ECONNREFUSED:
    case ECONNRESET:
    case ECONNABORTED:
    case EPIPE:
    case ENOTCONN:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ESRCH:
      return true;
    default:
      return false;
  }
}

// One posted (or to be posted) operation. The provider's context comes first
// (FI_CONTEXT2 mode lets it use that space).
struct Op {
  fi_context2 provider_context;
  TransferId transfer = 0;
  bool read = false;
  bool signal = false;  // the write that carries the transfer id as remote CQ data
  char* local = nullptr;
  void* local_desc = nullptr;
  uint64_t length = 0;
  uint64_t remote_addr = 0;
  uint64_t key = 0;
};

}  // namespace

struct IoEngine::Impl {
  struct Registered {
    MemoryDesc desc;
    std::vector<fid_mr*> mrs;  // per endpoint
  };
  struct Peer {
    EngineDesc desc;
    size_t endpoint = 0;
    fi_addr_t addr = FI_ADDR_UNSPEC;
    Status failure;
  };
  struct Transfer {
    std::string peer;
    size_t endpoint = 0;
    fi_addr_t addr = FI_ADDR_UNSPEC;
    uint64_t outstanding = 0;         // posted or queued, not completed
    std::unique_ptr<Op> held_signal;  // posted once the others completed
    TransferStatus status;
    Clock::time_point deadline;
  };

  IoEngineConfig config;
  EngineDesc desc;
  std::vector<std::unique_ptr<Endpoint>> endpoints;
  std::string host_identity;
  uint32_t next_transfer = 1;

  std::mutex mu;
  int wake_fd = -1;  // eventfd: tasks and submissions wake the idle thread
  bool stopping = false;
  std::deque<std::function<void()>> tasks;
  std::vector<Registered> registered;
  std::map<std::string, Peer> peers;
  std::map<TransferId, Transfer> transfers;
  std::deque<std::unique_ptr<Op>> to_post;    // queued, in order
  std::map<Op*, std::unique_ptr<Op>> posted;  // handed to the provider
  std::map<uint32_t, std::string> nonces;     // peer nonce -> engine key
  std::set<TransferId> inbound;               // landed, not yet popped
  PeerFailureCallback on_failure;
  std::thread progress;

  ~Impl() {
    {
      std::lock_guard lock(mu);
      stopping = true;
    }
    notify();
    if (progress.joinable()) progress.join();
    if (wake_fd >= 0) ::close(wake_fd);
    // Memory regions before their domains (the endpoints close the rest).
    for (auto& r : registered) {
      for (fid_mr* mr : r.mrs) {
        if (mr) fi_close(&mr->fid);
      }
    }
    endpoints.clear();  // closing the endpoints drops what was still posted
  }

  template <typename F>
  auto run(F&& task) -> decltype(task()) {
    std::packaged_task<decltype(task())()> job(std::forward<F>(task));
    auto result = job.get_future();
    {
      std::lock_guard lock(mu);
      tasks.push_back([&job] { job(); });
    }
    notify();
    return result.get();
  }

  void progress_loop();
  void idle_wait(std::unique_lock<std::mutex>& lock);
  void notify() {
    const uint64_t one = 1;
    if (wake_fd >= 0) (void)!::write(wake_fd, &one, sizeof one);
  }
  void post_queued();                                                    // mu held
  void read_completions(Endpoint& e);                                    // mu held
  void finish_op(std::unique_ptr<Op> op, const Status& error, int err);  // mu held
  void fail_transfer(Transfer& t, const Status& reason);                 // mu held
  void fail_peer_locked(const std::string& key, const Status& reason,
                        std::vector<std::pair<std::string, Status>>& report);  // mu held
  Status submit(bool read, std::span<const uint64_t> local_offsets,
                std::span<const uint64_t> remote_offsets, std::span<const uint64_t> sizes,
                TransferId id, const MemoryDesc& local, const MemoryDesc& remote);
};

void IoEngine::Impl::progress_loop() {
  std::unique_lock lock(mu);
  auto next_deadline_check = Clock::now();
  auto hot_until = Clock::now();
  while (!stopping) {
    while (!tasks.empty()) {
      auto task = std::move(tasks.front());
      tasks.pop_front();
      lock.unlock();
      task();
      lock.lock();
    }
    post_queued();
    for (auto& e : endpoints) read_completions(*e);
    const auto now = Clock::now();
    for (auto& e : endpoints) {
      if (e->inbound == nullptr) continue;
      const uint64_t seen = fi_cntr_read(e->inbound);
      if (seen != e->inbound_seen) {
        e->inbound_seen = seen;
        hot_until = now + kHotWindow;
      }
    }
    if (now >= next_deadline_check) {
      next_deadline_check = now + std::chrono::milliseconds(10);
      for (auto& [id, t] : transfers) {
        if (t.status.state == TransferState::kInProgress && now >= t.deadline) {
          fail_transfer(t, Status::deadline_exceeded(
                               fmt::format("transfer {:#x} to {} not done within {} ms", id, t.peer,
                                           config.transfer_timeout.count())));
        }
      }
    }
    if (to_post.empty() && posted.empty() && tasks.empty() && now >= hot_until) {
      idle_wait(lock);
    } else if (tasks.empty()) {
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    }
  }
}

// Sleeps until a CQ's file descriptor or wake_fd says there is work, or
// kIdleTick passes when a provider has no descriptor (mu held on entry/exit).
void IoEngine::Impl::idle_wait(std::unique_lock<std::mutex>& lock) {
  std::vector<pollfd> fds = {{wake_fd, POLLIN, 0}};
  bool all_waitable = wake_fd >= 0;
  for (auto& e : endpoints) {
    if (e->wait_fd < 0) {
      all_waitable = false;
      continue;
    }
    fid* cq = &e->cq->fid;
    // Only when nothing is pending in the provider may we block on its fd.
    if (fi_trywait(e->fabric, &cq, 1) != FI_SUCCESS) return;
    fds.push_back({e->wait_fd, POLLIN, 0});
  }
  const int timeout_ms = all_waitable ? 100 : static_cast<int>(kIdleTick.count());
  lock.unlock();
  ::poll(fds.data(), fds.size(), std::max(timeout_ms, 1));
  uint64_t count;
  if (fds[0].revents & POLLIN) (void)!::read(wake_fd, &count, sizeof count);
  lock.lock();
}

void IoEngine::Impl::post_queued() {
  while (!to_post.empty()) {
    Op* op = to_post.front().get();
    auto t = transfers.find(op->transfer);
    if (t == transfers.end() || t->second.status.state != TransferState::kInProgress) {
      to_post.pop_front();  // its transfer ended (failed) meanwhile
      continue;
    }
    Endpoint& e = *endpoints[t->second.endpoint];
    iovec iov{op->local, op->length};
    fi_rma_iov rma{op->remote_addr, op->length, op->key};
    fi_msg_rma msg{};
    msg.msg_iov = &iov;
    msg.desc = &op->local_desc;
    msg.iov_count = 1;
    msg.addr = t->second.addr;
    msg.rma_iov = &rma;
    msg.rma_iov_count = 1;
    msg.context = op;
    ssize_t rc;
    if (op->read) {
      rc = fi_readmsg(e.ep, &msg, FI_COMPLETION);
    } else {
      uint64_t flags = FI_COMPLETION | FI_DELIVERY_COMPLETE;
      if (op->signal) {
        flags |= FI_REMOTE_CQ_DATA;
        msg.data = op->transfer;
      }
      rc = fi_writemsg(e.ep, &msg, flags);
    }
    if (rc == -FI_EAGAIN) return;  // the provider needs progress first
    auto owned = std::move(to_post.front());
    to_post.pop_front();
    if (rc != 0) {
      fail_transfer(t->second, ofi_error(op->read ? "fi_readmsg" : "fi_writemsg", int(rc)));
      continue;
    }
    posted.emplace(op, std::move(owned));
  }
}

void IoEngine::Impl::read_completions(Endpoint& e) {
  fi_cq_data_entry entries[64];
  while (true) {
    const ssize_t n = fi_cq_read(e.cq, entries, 64);
    if (n == -FI_EAGAIN) return;
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(e.cq, &err, 0) != 1) return;
      char detail[256] = {};
      fi_cq_strerror(e.cq, err.prov_errno, err.err_data, detail, sizeof detail);
      auto it = posted.find(static_cast<Op*>(err.op_context));
      if (it == posted.end()) {
        logger("mori")->warn("{}: completion error for no operation of ours: {} ({})", e.provider,
                             fi_strerror(err.err), detail);
        continue;
      }
      auto op = std::move(it->second);
      posted.erase(it);
      const Status failed = Status::unavailable(fmt::format(
          "{} {}: {} ({})", e.provider, op->read ? "read" : "write", fi_strerror(err.err), detail));
      finish_op(std::move(op), failed, err.err);
      continue;
    }
    if (n < 0) {
      logger("mori")->warn("{}: fi_cq_read: {}", e.provider, fi_strerror(int(-n)));
      return;
    }
    for (ssize_t i = 0; i < n; ++i) {
      const fi_cq_data_entry& c = entries[i];
      if (c.flags & FI_REMOTE_CQ_DATA) {  // a peer's transfer has landed here
        inbound.insert(c.data);
        continue;
      }
      auto it = posted.find(static_cast<Op*>(c.op_context));
      if (it == posted.end()) continue;
      auto op = std::move(it->second);
      posted.erase(it);
      finish_op(std::move(op), Status::ok(), 0);
    }
  }
}

void IoEngine::Impl::finish_op(std::unique_ptr<Op> op, const Status& error, int err) {
  auto it = transfers.find(op->transfer);
  if (it == transfers.end()) return;
  Transfer& t = it->second;
  if (t.status.state != TransferState::kInProgress) return;  // failed earlier; now accounted for
  if (!error.is_ok()) {
    fail_transfer(t, error);
    if (peer_is_gone(err)) {
      std::vector<std::pair<std::string, Status>> report;
      fail_peer_locked(t.peer, error, report);
      // The callback runs without mu: it may call back into this engine.
      for (auto& [key, reason] : report) {
        if (on_failure) {
          auto cb = on_failure;
          tasks.push_back([cb, key, reason] { cb(key, reason); });
        }
      }
    }
    return;
  }
  if (--t.outstanding > 0) return;
  if (t.held_signal) {  // every other write is in place: now the one that says so
    t.outstanding = 1;
    to_post.push_back(std::move(t.held_signal));
    return;
  }
  t.status.state = TransferState::kSuccess;
}

void IoEngine::Impl::fail_transfer(Transfer& t, const Status& reason) {
  if (t.status.state != TransferState::kInProgress) return;
  t.status = {TransferState::kFailed, reason};
  t.held_signal.reset();
}

void IoEngine::Impl::fail_peer_locked(const std::string& key, const Status& reason,
                                      std::vector<std::pair<std::string, Status>>& report) {
  auto p = peers.find(key);
  if (p == peers.end() || !p->second.failure.is_ok()) return;
  p->second.failure = reason;
  for (auto& [id, t] : transfers) {
    if (t.peer == key) fail_transfer(t, reason);
  }
  report.emplace_back(key, reason);
}

IoEngine::IoEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
IoEngine::~IoEngine() = default;

Result<std::unique_ptr<IoEngine>> IoEngine::create(IoEngineConfig config) {
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->host_identity = local_host_identity();
  std::vector<std::string> wanted;
  if (const char* env = std::getenv("FI_PROVIDER"); env != nullptr && config.provider == "auto") {
    wanted = {env};  // the operator's choice, for every peer
  } else if (config.provider == "auto") {
    wanted = {"shm", "tcp;ofi_rxm"};
  } else {
    wanted = {config.provider};
  }
  std::string why;
  for (const auto& name : wanted) {
    auto e = std::make_unique<Endpoint>();
    if (Status st = e->open(name, config.host); !st.is_ok()) {
      why += (why.empty() ? "" : "; ") + st.message();
      logger("mori")->debug("provider {} unavailable: {}", name, st.message());
      continue;
    }
    impl->desc.endpoints.push_back({name, e->address});
    impl->endpoints.push_back(std::move(e));
  }
  if (impl->endpoints.empty()) {
    // A provider named by the user that is not here is bad input; "auto"
    // finding nothing is this machine's problem.
    const std::string message = fmt::format(
        "mori: no libfabric provider could be opened ({}); `fi_info -l` lists this host's", why);
    return config.provider == "auto" ? Status::unavailable(message)
                                     : Status::invalid_argument(message);
  }
  uint32_t nonce = 0;
  if (getrandom(&nonce, sizeof nonce, 0) != sizeof nonce) {
    return Status::internal("getrandom failed: no transfer-id nonce");
  }
  impl->desc.key = config.key;
  impl->desc.nonce = nonce;
  impl->desc.host_identity = impl->host_identity;
  impl->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  Impl* raw = impl.get();
  impl->progress = std::thread([raw] { raw->progress_loop(); });
  return std::unique_ptr<IoEngine>(new IoEngine(std::move(impl)));
}

const EngineDesc& IoEngine::desc() const { return impl_->desc; }

std::vector<std::string> IoEngine::providers() const {
  std::vector<std::string> names;
  for (const auto& e : impl_->endpoints) names.push_back(e->provider);
  return names;
}

Result<MemoryDesc> IoEngine::register_memory(void* base, uint64_t length) {
  if (base == nullptr || length == 0) return Status::invalid_argument("mori: empty buffer");
  return impl_->run([&]() -> Result<MemoryDesc> {
    Impl::Registered reg;
    reg.desc.engine_key = impl_->desc.key;
    reg.desc.base = reinterpret_cast<uint64_t>(base);
    reg.desc.length = length;
    for (auto& e : impl_->endpoints) {
      fid_mr* mr = nullptr;
      const uint64_t requested = e->prov_key ? 0 : e->next_key++;
      int rc =
          fi_mr_reg(e->domain, base, length, FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE,
                    0, requested, 0, &mr, nullptr);
      if (rc == 0 && e->endpoint_mr) {
        rc = fi_mr_bind(mr, &e->ep->fid, 0);
        if (rc == 0) rc = fi_mr_enable(mr);
      }
      if (rc != 0) {
        if (mr) fi_close(&mr->fid);
        for (fid_mr* m : reg.mrs) fi_close(&m->fid);
        return ofi_error(fmt::format("fi_mr_reg of {} bytes on {}", length, e->provider), rc);
      }
      reg.mrs.push_back(mr);
      reg.desc.keys.push_back(fi_mr_key(mr));
    }
    std::lock_guard lock(impl_->mu);
    reg.desc.id = static_cast<uint32_t>(impl_->registered.size());
    impl_->registered.push_back(reg);
    return reg.desc;
  });
}

Status IoEngine::register_remote_engine(const EngineDesc& remote) {
  // shm for a peer on this host, when both have it; else the first provider
  // both have (tcp;ofi_rxm in auto mode).
  std::optional<size_t> local, theirs;
  const bool same_host =
      !impl_->host_identity.empty() && remote.host_identity == impl_->host_identity;
  for (size_t i = 0; i < impl_->endpoints.size() && !local; ++i) {
    const std::string& p = impl_->endpoints[i]->provider;
    if (p == "shm" && !same_host) continue;
    for (size_t j = 0; j < remote.endpoints.size(); ++j) {
      if (remote.endpoints[j].provider == p) {
        local = i;
        theirs = j;
        break;
      }
    }
  }
  if (!local) {
    std::vector<std::string> ours = providers(), peer;
    for (const auto& e : remote.endpoints) peer.push_back(e.provider);
    return Status::failed_precondition(fmt::format(
        "mori engine '{}' shares no usable provider with this one (ours: {}; its: {}{})",
        remote.key, fmt::join(ours, ", "), fmt::join(peer, ", "),
        same_host ? "" : "; shm only reaches this host"));
  }
  return impl_->run([&]() -> Status {
    Endpoint& e = *impl_->endpoints[*local];
    fi_addr_t addr = FI_ADDR_UNSPEC;
    const int n =
        fi_av_insert(e.av, remote.endpoints[*theirs].address.data(), 1, &addr, 0, nullptr);
    if (n != 1) {
      return Status::invalid_argument(
          fmt::format("mori engine '{}': its {} address was not accepted", remote.key, e.provider));
    }
    std::lock_guard lock(impl_->mu);
    impl_->peers[remote.key] = Impl::Peer{remote, *local, addr, {}};
    impl_->nonces[remote.nonce] = remote.key;
    return Status::ok();
  });
}

Result<std::string> IoEngine::provider_for(const std::string& engine_key) const {
  std::lock_guard lock(impl_->mu);
  auto p = impl_->peers.find(engine_key);
  if (p == impl_->peers.end()) {
    return Status::not_found(fmt::format("no mori engine '{}' registered", engine_key));
  }
  return impl_->endpoints[p->second.endpoint]->provider;
}

TransferId IoEngine::allocate_transfer_id() {
  std::lock_guard lock(impl_->mu);
  return (TransferId{impl_->desc.nonce} << 32) | impl_->next_transfer++;
}

Result<IoEngine::Session> IoEngine::create_session(const MemoryDesc& local,
                                                   const MemoryDesc& remote) {
  std::lock_guard lock(impl_->mu);
  if (local.engine_key != impl_->desc.key || local.id >= impl_->registered.size()) {
    return Status::invalid_argument(
        fmt::format("memory {} of engine '{}' is not registered here", local.id, local.engine_key));
  }
  if (impl_->peers.count(remote.engine_key) == 0) {
    return Status::not_found(fmt::format("no mori engine '{}' registered", remote.engine_key));
  }
  Session s;
  s.engine_ = this;
  s.local_ = local;
  s.remote_ = remote;
  return s;
}

Status IoEngine::Session::batch_write(std::span<const uint64_t> local_offsets,
                                      std::span<const uint64_t> remote_offsets,
                                      std::span<const uint64_t> sizes, TransferId id) {
  return engine_->impl_->submit(false, local_offsets, remote_offsets, sizes, id, local_, remote_);
}

Status IoEngine::Session::batch_read(std::span<const uint64_t> local_offsets,
                                     std::span<const uint64_t> remote_offsets,
                                     std::span<const uint64_t> sizes, TransferId id) {
  return engine_->impl_->submit(true, local_offsets, remote_offsets, sizes, id, local_, remote_);
}

Status IoEngine::Impl::submit(bool read, std::span<const uint64_t> local_offsets,
                              std::span<const uint64_t> remote_offsets,
                              std::span<const uint64_t> sizes, TransferId id,
                              const MemoryDesc& local, const MemoryDesc& remote) {
  if (local_offsets.size() != sizes.size() || remote_offsets.size() != sizes.size()) {
    return Status::invalid_argument(
        fmt::format("transfer {:#x}: {} local offsets, {} remote offsets, {} sizes", id,
                    local_offsets.size(), remote_offsets.size(), sizes.size()));
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (local_offsets[i] > local.length || sizes[i] > local.length - local_offsets[i] ||
        remote_offsets[i] > remote.length || sizes[i] > remote.length - remote_offsets[i]) {
      return Status::out_of_range(fmt::format(
          "transfer {:#x} op {}: {} bytes at local {} / remote {} leave the buffers ({} / {})", id,
          i, sizes[i], local_offsets[i], remote_offsets[i], local.length, remote.length));
    }
  }
  {
    std::lock_guard lock(mu);
    auto p = peers.find(remote.engine_key);
    if (p == peers.end()) {
      return Status::not_found(fmt::format("no mori engine '{}' registered", remote.engine_key));
    }
    if (!p->second.failure.is_ok()) return p->second.failure;
    if (transfers.count(id)) {
      return Status::already_exists(fmt::format("transfer {:#x} is already in use", id));
    }
    const size_t ep = p->second.endpoint;
    Endpoint& e = *endpoints[ep];
    const Registered& reg = registered.at(local.id);
    // The remote key of the provider this peer is reached by.
    size_t theirs = 0;
    for (size_t j = 0; j < p->second.desc.endpoints.size(); ++j) {
      if (p->second.desc.endpoints[j].provider == e.provider) theirs = j;
    }
    if (theirs >= remote.keys.size()) {
      return Status::invalid_argument(fmt::format("memory {} of engine '{}' has no {} key",
                                                  remote.id, remote.engine_key, e.provider));
    }
    Transfer& t = transfers[id];
    t.peer = remote.engine_key;
    t.endpoint = ep;
    t.addr = p->second.addr;
    t.deadline = Clock::now() + config.transfer_timeout;
    const uint64_t remote_base = e.virt_addr ? remote.base : 0;
    std::vector<std::unique_ptr<Op>> ops;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (sizes[i] == 0) continue;
      auto op = std::make_unique<Op>();
      op->transfer = id;
      op->read = read;
      op->local = reinterpret_cast<char*>(local.base) + local_offsets[i];
      op->local_desc = fi_mr_desc(reg.mrs[ep]);
      op->length = sizes[i];
      op->remote_addr = remote_base + remote_offsets[i];
      op->key = remote.keys[theirs];
      ops.push_back(std::move(op));
    }
    if (ops.empty()) {
      t.status.state = TransferState::kSuccess;
      return Status::ok();
    }
    if (!read) {  // the last write tells the target, after all the others
      ops.back()->signal = true;
      if (ops.size() > 1) {
        t.held_signal = std::move(ops.back());
        ops.pop_back();
      }
    }
    t.outstanding = ops.size();
    for (auto& op : ops) to_post.push_back(std::move(op));
  }
  notify();
  return Status::ok();
}

TransferStatus IoEngine::transfer_status(TransferId id) {
  std::lock_guard lock(impl_->mu);
  auto t = impl_->transfers.find(id);
  if (t == impl_->transfers.end()) {
    return {TransferState::kFailed, Status::not_found(fmt::format("no transfer {:#x}", id))};
  }
  TransferStatus st = t->second.status;
  // Ended and accounted for (no operation of it still with the provider).
  if (st.state != TransferState::kInProgress) impl_->transfers.erase(t);
  return st;
}

bool IoEngine::pop_inbound_transfer_status(const std::string& remote_key, TransferId id) {
  std::lock_guard lock(impl_->mu);
  auto n = impl_->nonces.find(static_cast<uint32_t>(id >> 32));
  if (n == impl_->nonces.end() || n->second != remote_key) return false;
  return impl_->inbound.erase(id) > 0;
}

void IoEngine::fail_peer(const std::string& engine_key, const Status& reason) {
  std::vector<std::pair<std::string, Status>> report;
  PeerFailureCallback callback;
  {
    std::lock_guard lock(impl_->mu);
    impl_->fail_peer_locked(engine_key, reason, report);
    callback = impl_->on_failure;
  }
  if (callback) {
    for (auto& [key, why] : report) callback(key, why);
  }
}

// Providers copy peers' bytes into our memory inside the progress thread's
// provider calls (shm inline writes, tcp), always under mu. Taking mu orders
// the caller after the round that moved bytes it learnt of, and before the
// rounds that will move bytes into memory it touched. (An atomic flag would
// not do: a provider may acknowledge bytes inside a call, before any
// release that follows it.)
void IoEngine::acquire_inbound_writes() const { std::lock_guard lock(impl_->mu); }

void IoEngine::release_to_peers() { std::lock_guard lock(impl_->mu); }

void IoEngine::set_peer_failure_callback(PeerFailureCallback callback) {
  std::lock_guard lock(impl_->mu);
  impl_->on_failure = std::move(callback);
}

}  // namespace pdkv::backends::mori

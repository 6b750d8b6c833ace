// IoEngine's API (io_engine.h): creation, registration, peers, submissions
// and status. State and threads: io_engine_impl.h.
#include <fmt/format.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <sys/eventfd.h>
#include <sys/random.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <optional>
#include <utility>

#include "crypto.h"
#include "host_identity.h"
#include "io_engine_impl.h"
#include "log.h"

namespace pdkv::backends::mori {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kKeyTries = 4;

// A memory key of the provider's key size drawn from the kernel's random
// bytes (never 0): a peer that did not get our descriptor cannot guess it.
Result<uint64_t> random_key(const Endpoint& e) {
  PDKV_ASSIGN_OR_RETURN(const std::string bytes, crypto::random_bytes(sizeof(uint64_t)));
  uint64_t key = 0;
  std::memcpy(&key, bytes.data(), sizeof key);
  if (e.key_bytes < sizeof key) key &= (uint64_t{1} << (8 * e.key_bytes)) - 1;
  return key == 0 ? 1 : key;
}

}  // namespace

IoEngine::IoEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
IoEngine::~IoEngine() {
  if (impl_->thread.stop()) return;
  // Its thread is stuck in a provider call that reads the engine: kept,
  // where a leak checker still sees it.
  if (impl_->late_reports.joinable()) impl_->late_reports.join();
  static std::mutex kept_mu;
  static auto* kept = new std::vector<std::unique_ptr<Impl>>;
  std::lock_guard lock(kept_mu);
  kept->push_back(std::move(impl_));
}

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
  if (impl->takes_messages()) {
    while (impl->desc.inbox_key == 0) {
      if (getrandom(&impl->desc.inbox_key, sizeof(uint64_t), 0) != sizeof(uint64_t)) {
        return Status::internal("getrandom failed: no inbox key");
      }
    }
  }
  impl->desc.keeps_inbound = config.keep_inbound;
  impl->desc.host_identity = impl->host_identity;
  impl->desc.start_time = process_start_time(::getpid());
  impl->returned_at.assign(impl->endpoints.size(), Clock::time_point{});
  impl->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  // A kernel that gives eventfds no id (before 5.16) offers no doorbell:
  // nothing would prove to a peer that it took this one.
  if (const uint64_t id = impl->wake_fd >= 0 ? PeerDoorbell::id_of(impl->wake_fd) : 0; id != 0) {
    impl->desc.doorbell = impl->wake_fd;
    impl->desc.doorbell_id = id;
  }
  impl->start_thread();
  return std::unique_ptr<IoEngine>(new IoEngine(std::move(impl)));
}

const EngineDesc& IoEngine::desc() const { return impl_->desc; }

std::vector<std::string> IoEngine::Impl::provider_names() const {
  std::vector<std::string> names;
  for (const auto& e : endpoints) names.push_back(e->provider);
  return names;
}

std::vector<std::string> IoEngine::providers() const { return impl_->provider_names(); }

Result<void*> IoEngine::allocate(uint64_t length) {
  if (!impl_->config.shared_pools) {
    return Status::failed_precondition("mori has no memory of its own with shared_pools=off");
  }
  std::lock_guard lock(impl_->pools_mu);
  return impl_->shared_pools.allocate(length);
}

Result<MemoryDesc> IoEngine::register_memory(void* base, uint64_t length) {
  if (base == nullptr || length == 0) return Status::invalid_argument("mori: empty buffer");
  SharedBuffer shared;
  {
    std::lock_guard lock(impl_->pools_mu);
    shared = impl_->shared_pools.describe(reinterpret_cast<uint64_t>(base), length);
  }
  return impl_->thread.run([&]() -> Result<MemoryDesc> {
    Impl::Registered reg;
    reg.desc.engine_key = impl_->desc.key;
    reg.desc.base = reinterpret_cast<uint64_t>(base);
    reg.desc.length = length;
    reg.desc.memfd = shared.memfd;
    reg.desc.memfd_inode = shared.memfd_inode;
    for (auto& e : impl_->endpoints) {
      fid_mr* mr = nullptr;
      int rc = -FI_ENOKEY;
      // A key nobody can guess (a key in use already is drawn again).
      for (int tries = 0; rc == -FI_ENOKEY && tries < kKeyTries; ++tries) {
        PDKV_ASSIGN_OR_RETURN(const uint64_t requested,
                              e->prov_key ? Result<uint64_t>(uint64_t{0}) : random_key(*e));
        rc = fi_mr_reg(e->domain, base, length,
                       FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE, 0, requested, 0, &mr,
                       nullptr);
      }
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

// The endpoint a peer is reached by, ours and its: shm for a peer on this
// host, when both have it; else the first provider both have (tcp;ofi_rxm in
// auto mode).
Result<std::pair<size_t, size_t>> IoEngine::Impl::endpoint_for(const EngineDesc& remote) const {
  std::optional<size_t> local, theirs;
  const bool same_host = !host_identity.empty() && remote.host_identity == host_identity;
  for (size_t i = 0; i < endpoints.size() && !local; ++i) {
    const std::string& p = endpoints[i]->provider;
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
    std::vector<std::string> ours = provider_names(), peer;
    for (const auto& e : remote.endpoints) peer.push_back(e.provider);
    return Status::failed_precondition(fmt::format(
        "mori engine '{}' shares no usable provider with this one (ours: {}; its: {}{})",
        remote.key, fmt::join(ours, ", "), fmt::join(peer, ", "),
        same_host ? "" : "; shm only reaches this host"));
  }
  return std::pair{*local, *theirs};
}

std::shared_ptr<const PeerMappings> IoEngine::Impl::map_pools(
    const std::string& key, const PeerProcess& process, std::span<const MemoryDesc> memory) const {
  std::vector<SharedBuffer> shared;
  for (const MemoryDesc& m : memory) {
    if (m.memfd >= 0) shared.push_back({m.base, m.length, m.memfd, m.memfd_inode});
  }
  if (shared.empty() || process.fd() < 0) return nullptr;
  auto mapped = std::make_shared<PeerMappings>();
  if (const Status st = mapped->map(process.fd(), shared); !st.is_ok()) {
    logger("mori")->info("engine '{}': a shared pool is not mapped ({}); shm writes into it", key,
                         st.message());
  }
  if (mapped->empty()) return nullptr;
  return mapped;
}

namespace {

// Any thread, no lock held: the peer's doorbell, taken through its pidfd;
// nullptr (logged) when it names none or it cannot be taken.
std::shared_ptr<const PeerDoorbell> take_doorbell(const EngineDesc& remote,
                                                  const PeerProcess& process) {
  if (remote.doorbell < 0 || process.fd() < 0) return nullptr;
  auto bell = PeerDoorbell::take(process.fd(), remote.doorbell, remote.doorbell_id);
  if (!bell.is_ok()) {
    logger("mori")->info("engine '{}': {}; its progress thread polls for what is posted to it",
                         remote.key, bell.status().message());
    return nullptr;
  }
  return std::move(*bell);
}

}  // namespace

Status IoEngine::register_remote_engine(const EngineDesc& remote,
                                        std::span<const MemoryDesc> memory) {
  PDKV_ASSIGN_OR_RETURN(const auto chosen, impl_->endpoint_for(remote));
  // Named, not a structured binding: lambdas capture these (clang 14).
  const auto local = chosen.first, theirs = chosen.second;
  // A peer over shm: its process watched, and its pools mapped, here rather
  // than on the progress thread.
  std::shared_ptr<const PeerProcess> process;
  std::shared_ptr<const PeerMappings> mapped;
  std::shared_ptr<const PeerDoorbell> doorbell;
  const Endpoint& reaching = *impl_->endpoints[local];
  if (const pid_t pid = shm_address_pid(remote.endpoints[theirs].address);
      reaching.provider == "shm" && pid > 0) {
    process = std::make_shared<const PeerProcess>(pid);
    // After the pidfd exists, a matching start time proves it is the
    // engine's process, not a later one that reuses its pid: only then are
    // the memfds and the eventfd it names that engine's.
    if (process_start_time(pid) == remote.start_time) {
      // Copies find their place by the peer's virtual addresses.
      if (impl_->config.shared_pools && reaching.virt_addr) {
        mapped = impl_->map_pools(remote.key, *process, memory);
      }
      doorbell = take_doorbell(remote, *process);
    }
  }
  return impl_->thread.run([&]() -> Status {
    Endpoint& e = *impl_->endpoints[local];
    fi_addr_t addr = FI_ADDR_UNSPEC;
    const int n = fi_av_insert(e.av, remote.endpoints[theirs].address.data(), 1, &addr, 0, nullptr);
    if (n != 1) {
      return Status::invalid_argument(
          fmt::format("mori engine '{}': its {} address was not accepted", remote.key, e.provider));
    }
    std::optional<Impl::Retired> replaced;
    std::shared_ptr<const PeerMappings> unmapped;  // the old pools, dropped with no lock held
    {
      std::lock_guard lock(impl_->mu);
      Impl::Peer& peer = impl_->peers[remote.key];
      if (peer.addr != FI_ADDR_UNSPEC && peer.addr != addr)
        replaced = {peer.endpoint, peer.addr, nullptr};
      peer.desc = remote;
      peer.endpoint = local;
      peer.addr = addr;
      peer.process = process;
      peer.doorbell = doorbell;
      unmapped = std::exchange(peer.mapped, mapped);
      impl_->nonces[remote.nonce] = remote.key;
      impl_->failures.forget(remote.key);  // a new engine by that key from now on
    }
    if (replaced) {  // registered again: one entry
      (void)fi_av_remove(impl_->endpoints[replaced->endpoint]->av, &replaced->addr, 1, 0);
    }
    return Status::ok();
  });
}

bool IoEngine::fence_peer(const EngineDesc& remote) {
  auto chosen = impl_->endpoint_for(remote);
  if (!chosen.is_ok()) return false;
  const auto local = chosen->first, theirs = chosen->second;
  Result<bool> fenced = impl_->thread.run([&]() -> Result<bool> {
    return impl_->endpoints[local]->fence(remote.endpoints[theirs].address);
  });
  return fenced.is_ok() && *fenced;
}

bool IoEngine::can_fence() const {
  return std::any_of(impl_->endpoints.begin(), impl_->endpoints.end(),
                     [](const auto& e) { return e->can_fence; });
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
  PDKV_RETURN_IF_ERROR(impl_->check_ours(local));
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
  const Piece piece{&local_, &remote_, local_offsets, remote_offsets, sizes};
  return engine_->impl_->submit(false, {&piece, 1}, id);
}

Status IoEngine::Session::batch_read(std::span<const uint64_t> local_offsets,
                                     std::span<const uint64_t> remote_offsets,
                                     std::span<const uint64_t> sizes, TransferId id) {
  const Piece piece{&local_, &remote_, local_offsets, remote_offsets, sizes};
  return engine_->impl_->submit(true, {&piece, 1}, id);
}

Status IoEngine::batch_write(std::span<const Piece> pieces, TransferId id) {
  return impl_->submit(false, pieces, id);
}

Status IoEngine::batch_read(std::span<const Piece> pieces, TransferId id) {
  return impl_->submit(true, pieces, id);
}

std::string message_header(uint64_t inbox_key, MessageKind kind) {
  std::string header(kMessageHeader, '\0');
  std::memcpy(header.data(), &inbox_key, sizeof inbox_key);
  header[sizeof inbox_key] = static_cast<char>(kind);
  return header;
}

// A write of no bytes of its own, at `last`'s place, that carries the
// transfer id. Where the signal need not wait for the bodies (tcp;ofi_rxm),
// a signal that also carries bytes is a crash waiting for a closed
// connection: libfabric 1.17's tcp reports a write with remote CQ data that
// was part-way in with no context when its connection closes (the fence, a
// failed peer's address removed, a reconnect), and rxm's error handler
// dereferences that context (rxm_handle_comp_error; seen as a SIGSEGV in
// fi_av_remove in the fault campaign). A write of no bytes is never
// part-way in. (shm, where the signal waits for the bodies anyway, never
// completed one of no bytes here: there the last body carries it.)
std::unique_ptr<Op> IoEngine::Impl::signal_after(const Op& last) {
  auto signal = std::make_unique<Op>();
  signal->transfer = last.transfer;
  signal->signal = true;
  signal->ordered = last.ordered;
  signal->local = last.local;
  signal->local_desc = last.local_desc;
  signal->remote_addr = last.remote_addr;
  signal->key = last.key;
  return signal;
}

// The signal tells the target, after all the other writes of `t`.
void IoEngine::Impl::add_signal(Transfer& t, std::vector<std::unique_ptr<Op>>& ops,
                                bool signal_apart, bool ordered) {
  if (ordered && signal_apart) {
    ops.push_back(signal_after(*ops.back()));
  } else {
    ops.back()->signal = true;
  }
  if (ops.size() > 1 && !ordered) {
    t.held_signal = std::move(ops.back());
    ops.pop_back();
  }
}

Status IoEngine::Impl::check_pieces(TransferId id, std::span<const Piece> pieces) {
  if (pieces.empty()) {
    return Status::invalid_argument(fmt::format("transfer {:#x}: no buffers", id));
  }
  for (size_t k = 0; k < pieces.size(); ++k) {
    const Piece& piece = pieces[k];
    if (piece.local == nullptr || piece.remote == nullptr) {
      return Status::invalid_argument(fmt::format("transfer {:#x} piece {}: no buffer", id, k));
    }
    const MemoryDesc& local = *piece.local;
    const MemoryDesc& remote = *piece.remote;
    if (piece.local_offsets.size() != piece.sizes.size() ||
        piece.remote_offsets.size() != piece.sizes.size()) {
      return Status::invalid_argument(fmt::format(
          "transfer {:#x} piece {}: {} local offsets, {} remote offsets, {} sizes", id, k,
          piece.local_offsets.size(), piece.remote_offsets.size(), piece.sizes.size()));
    }
    if (k > 0 && remote.engine_key != pieces[0].remote->engine_key) {
      return Status::invalid_argument(
          fmt::format("transfer {:#x} piece {}: engine '{}', where piece 0 names '{}'", id, k,
                      remote.engine_key, pieces[0].remote->engine_key));
    }
    for (size_t i = 0; i < piece.sizes.size(); ++i) {
      const uint64_t size = piece.sizes[i], at = piece.local_offsets[i],
                     to = piece.remote_offsets[i];
      if (at > local.length || size > local.length - at || to > remote.length ||
          size > remote.length - to) {
        return Status::out_of_range(fmt::format(
            "transfer {:#x} piece {} op {}: {} bytes at local {} / remote {} leave the buffers "
            "({} / {})",
            id, k, i, size, at, to, local.length, remote.length));
      }
    }
  }
  return Status::ok();
}

Status IoEngine::Impl::check_ours(const MemoryDesc& local) const {
  if (local.engine_key != desc.key || local.id >= registered.size()) {
    return Status::invalid_argument(
        fmt::format("memory {} of engine '{}' is not registered here", local.id, local.engine_key));
  }
  return Status::ok();
}

Status IoEngine::Impl::add_ops(const Piece& piece, const Peer& peer, bool read, TransferId id,
                               std::vector<std::unique_ptr<Op>>& ops) {
  const MemoryDesc& local = *piece.local;
  const MemoryDesc& remote = *piece.remote;
  PDKV_RETURN_IF_ERROR(check_ours(local));
  // The bounds were checked against the caller's copy of the descriptor.
  const MemoryDesc& ours = registered[local.id].desc;
  if (local.base != ours.base || local.length > ours.length) {
    return Status::invalid_argument(
        fmt::format("memory {} of engine '{}' is not registered here as {} bytes at {:#x}",
                    local.id, local.engine_key, local.length, local.base));
  }
  const size_t ep = peer.endpoint;
  const Endpoint& e = *endpoints[ep];
  // The remote key of the provider this peer is reached by.
  size_t theirs = 0;
  for (size_t j = 0; j < peer.desc.endpoints.size(); ++j) {
    if (peer.desc.endpoints[j].provider == e.provider) theirs = j;
  }
  if (theirs >= remote.keys.size()) {
    return Status::invalid_argument(fmt::format("memory {} of engine '{}' has no {} key", remote.id,
                                                remote.engine_key, e.provider));
  }
  const uint64_t remote_base = e.virt_addr ? remote.base : 0;
  void* const local_desc = fi_mr_desc(registered[local.id].mrs[ep]);
  for (size_t i = 0; i < piece.sizes.size(); ++i) {
    if (piece.sizes[i] == 0) continue;
    auto op = std::make_unique<Op>();
    op->transfer = id;
    op->read = read;
    op->local = reinterpret_cast<char*>(local.base) + piece.local_offsets[i];
    op->local_desc = local_desc;
    op->length = piece.sizes[i];
    op->remote_addr = remote_base + piece.remote_offsets[i];
    op->key = remote.keys[theirs];
    ops.push_back(std::move(op));
  }
  return Status::ok();
}

Status IoEngine::Impl::submit(bool read, std::span<const Piece> pieces, TransferId id) {
  PDKV_RETURN_IF_ERROR(check_pieces(id, pieces));
  const std::string& key = pieces[0].remote->engine_key;
  {
    std::lock_guard lock(mu);
    auto p = peers.find(key);
    if (lost) {
      return Status::unavailable("mori: this engine's progress thread was given up (see its log)");
    }
    if (p == peers.end()) {
      if (auto failure = failures.failure(key)) return *failure;
      return Status::not_found(fmt::format("no mori engine '{}' registered", key));
    }
    if (transfers.count(id)) {
      return Status::already_exists(fmt::format("transfer {:#x} is already in use", id));
    }
    std::vector<std::unique_ptr<Op>> ops;
    for (const Piece& piece : pieces) {
      PDKV_RETURN_IF_ERROR(add_ops(piece, p->second, read, id, ops));
    }
    const size_t ep = p->second.endpoint;
    const Endpoint& e = *endpoints[ep];
    // Where the peer's endpoint keeps writes in order, the signal may follow
    // the others at once; else it waits for their completions.
    const bool ordered = !read && std::all_of(ops.begin(), ops.end(), [&](const auto& op) {
      return op->length <= e.ordered_write_bytes;
    });
    for (auto& op : ops) op->ordered = ordered;
    Transfer& t = transfers[id];
    t.id = id;
    t.peer = key;
    t.endpoint = ep;
    t.addr = p->second.addr;
    t.deadline = Clock::now() + config.transfer_timeout;
    if (ops.empty()) {
      t.status.state = TransferState::kSuccess;
      batch_ends.mark();  // announced by the progress thread, woken below
      notify();
      return Status::ok();
    }
    // Every body copied into the peer's mapped pools is in place once the
    // copy is done: no signal, and the target hears that it landed from a
    // message (queue_landed).
    t.lands_by_message = !read && p->second.desc.inbox_key != 0 && takes_messages() &&
                         std::all_of(ops.begin(), ops.end(), [&](const auto& op) {
                           return copy_target(p->second.mapped.get(), *op) != nullptr;
                         });
    if (!read && !t.lands_by_message) add_signal(t, ops, e.signal_apart, ordered);
    t.outstanding = ops.size();
    for (auto& op : ops) p->second.queue.push_back(std::move(op));
  }
  notify();
  return Status::ok();
}

TransferStatus IoEngine::transfer_status(TransferId id) {
  (void)impl_->give_up_if_stuck();
  std::lock_guard lock(impl_->mu);
  auto t = impl_->transfers.find(id);
  if (t == impl_->transfers.end()) {
    return {TransferState::kFailed, Status::not_found(fmt::format("no transfer {:#x}", id))};
  }
  // A failed transfer is reported once it is over: nothing of it is left
  // with the provider (its Ops stay in `posted` until the provider returns
  // them, when the drain ran out of time).
  Impl::Transfer& transfer = t->second;
  if (!transfer.over(Clock::now(), impl_->returned_at[transfer.endpoint])) {
    const bool failed = transfer.status.state == TransferState::kFailed;
    return {TransferState::kInProgress, failed ? transfer.status.error : Status::ok(), failed};
  }
  TransferStatus st = t->second.status;
  if (st.state != TransferState::kInProgress) impl_->transfers.erase(t);
  return st;
}

bool IoEngine::pop_inbound_transfer_status(const std::string& remote_key, TransferId id) {
  std::lock_guard lock(impl_->mu);
  auto n = impl_->nonces.find(static_cast<uint32_t>(id >> 32));
  if (n == impl_->nonces.end() || n->second != remote_key) return false;
  return impl_->inbound.erase(id) > 0;
}

void IoEngine::cancel_transfer(TransferId id, const Status& reason) {
  std::lock_guard lock(impl_->mu);
  auto t = impl_->transfers.find(id);
  if (t != impl_->transfers.end()) impl_->fail_transfer(t->second, reason);
  impl_->notify();
}

void IoEngine::fail_peer(const std::string& engine_key, const Status& reason) {
  {
    std::lock_guard lock(impl_->mu);
    impl_->fail_peer_locked(engine_key, reason);
  }
  (void)impl_->give_up_if_stuck();
}

// Providers copy peers' bytes into our memory inside the progress thread's
// provider calls (shm inline writes, tcp), always in a round under round_mu.
// Taking round_mu orders the caller after the round that moved bytes it
// learnt of, and before the rounds that will move bytes into memory it
// touched. (An atomic flag would not do: a provider may acknowledge bytes
// inside a call, before any release that follows it.) A same-host peer's
// copies into our pools happen in its own process, outside our rounds; we
// learn of them from the landed message or notice that follows them (read
// in a round), which the peer posts after a release: taking round_mu
// orders the caller after those bytes too.
void IoEngine::acquire_inbound_writes() const { impl_->wait_round(); }

void IoEngine::release_to_peers() { impl_->wait_round(); }

bool IoEngine::can_message() const { return impl_->takes_messages(); }

Status IoEngine::send_after(const std::string& remote_key, std::span<const TransferId> after,
                            std::string message) {
  static_assert(kMaxMessageBytes + kMessageHeader <= InboxSlot::kBytes, "a message fits");
  if (!can_message()) return Status::failed_precondition("mori: a provider has no messages");
  if (message.size() > kMaxMessageBytes) {
    return Status::invalid_argument(
        fmt::format("mori: a message of {} bytes (at most {})", message.size(), kMaxMessageBytes));
  }
  {
    std::lock_guard lock(impl_->mu);
    auto peer = impl_->peers.find(remote_key);
    if (peer == impl_->peers.end()) {
      if (auto failure = impl_->failures.failure(remote_key)) return *failure;
      return Status::not_found(fmt::format("no mori engine '{}' registered", remote_key));
    }
    const uint64_t inbox = peer->second.desc.inbox_key;
    if (inbox == 0) return Status::ok();  // it takes none: the call that follows tells it
    Impl::PendingMessage pending{
        remote_key, {}, message_header(inbox, MessageKind::kNotice) + message};
    for (TransferId id : after) {
      auto t = impl_->transfers.find(id);
      if (t == impl_->transfers.end() || t->second.status.state == TransferState::kFailed) {
        return Status::ok();  // one failed already: the message is not sent
      }
      if (t->second.status.state == TransferState::kInProgress) pending.waiting.insert(id);
    }
    if (!pending.waiting.empty()) {
      impl_->pending_messages.push_back(std::move(pending));
      return Status::ok();
    }
    impl_->queue_message(remote_key, std::move(pending.payload));
  }
  impl_->notify();
  return Status::ok();
}

std::vector<std::string> IoEngine::take_messages() {
  std::lock_guard lock(impl_->mu);
  return std::exchange(impl_->messages, {});
}

uint64_t IoEngine::copied_bytes() const { return impl_->copied_bytes.load(); }

uint64_t IoEngine::rung_doorbells() const { return impl_->rung_doorbells.load(); }

namespace {

// Any thread, no lock held: whether this process may take a file from the
// process of `remote` (reached over shm at `address`): it takes the first
// one the descriptor names (its doorbell, else a memfd of `memory`) and
// closes it at once.
Status take_probe(const EngineDesc& remote, std::string_view address,
                  std::span<const MemoryDesc> memory) {
  const pid_t pid = shm_address_pid(address);
  const PeerProcess process(pid);
  if (process.fd() < 0 || process_start_time(pid) != remote.start_time) {
    return Status::unavailable(fmt::format("its process {} is not the one described", pid));
  }
  int32_t number = remote.doorbell;
  for (const MemoryDesc& m : memory) {
    if (number < 0) number = m.memfd;
  }
  PDKV_ASSIGN_OR_RETURN(const int fd, take_peer_fd(process.fd(), number, "descriptor"));
  ::close(fd);
  return Status::ok();
}

}  // namespace

bool IoEngine::copies_from(const EngineDesc& remote, std::span<const MemoryDesc> memory) const {
  const auto chosen = impl_->endpoint_for(remote);
  if (!chosen.is_ok() || impl_->endpoints[chosen->first]->provider != "shm") return false;
  const auto shared = [](const MemoryDesc& m) { return m.memfd >= 0; };
  if (!std::any_of(memory.begin(), memory.end(), shared)) return false;  // its pools are not
  const std::pair<std::string, uint64_t> engine{remote.key, remote.start_time};
  {
    std::lock_guard lock(impl_->mu);
    if (std::none_of(impl_->registered.begin(), impl_->registered.end(),
                     [&](const Impl::Registered& r) { return shared(r.desc); })) {
      return false;  // ours are not
    }
    if (auto known = impl_->may_take_from.find(engine); known != impl_->may_take_from.end()) {
      return known->second;
    }
  }
  const Status probe = take_probe(remote, remote.endpoints[chosen->second].address, memory);
  if (!probe.is_ok()) {
    logger("mori")->info(
        "engine '{}' on this host: {}; its writes are taken to go through shm, not into our "
        "pools (ptrace permission is alike both ways between processes of one user)",
        remote.key, probe.message());
  }
  std::lock_guard lock(impl_->mu);
  return impl_->may_take_from.emplace(engine, probe.is_ok()).first->second;
}

uint64_t IoEngine::dropped_messages() const {
  std::lock_guard lock(impl_->mu);
  return impl_->dropped_messages;
}

void IoEngine::set_message_callback(std::function<void()> callback) {
  impl_->messages_in.set(std::move(callback));
}

void IoEngine::set_batch_end_callback(std::function<void()> callback) {
  impl_->batch_ends.set(std::move(callback));
}

void IoEngine::set_peer_failure_callback(PeerFailureCallback callback) {
  impl_->failures.set_callback(std::move(callback));
}

}  // namespace pdkv::backends::mori

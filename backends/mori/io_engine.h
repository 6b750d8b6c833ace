// The `mori` IO engine, shaped like AMD's MORI-IO on its libfabric path: an
// engine with a key and an engine descriptor; register_memory -> a memory
// descriptor; sessions between a local and a remote memory descriptor; batch
// write and batch read with transfer ids and per-transfer status; and, on
// the target, the status of inbound transfers.
//
// Data plane: libfabric (OFI) reliable-datagram endpoints (FI_EP_RDM) with
// RMA. One endpoint per provider the engine opens: `shm` serves peers on
// this host, `tcp;ofi_rxm` the others (or one provider chosen by option).
// The last write of a transfer (the last body; over tcp;ofi_rxm a write of
// no bytes after them) carries the transfer id as remote CQ data and asks
// for FI_DELIVERY_COMPLETE: when it completes the target has every
// byte, and the target learns from that data that the transfer landed. The
// other writes ask for FI_TRANSMIT_COMPLETE (the peer's endpoint has them:
// shm writes them straight into the peer's memory, or queues them ahead of
// the signal). Where the provider keeps writes to a peer in order
// (FI_ORDER_RMA_WAW: tcp;ofi_rxm) the signal follows them at once; where it
// does not (shm) it is posted once they all completed (libfabric's FI_FENCE
// is offered by none of these providers). One progress thread
// (progress_thread.h) posts operations in bursts (FI_MORE) and reads the
// completion queues, holding the engine's lock only while it touches the
// state other threads share; it serves inbound traffic too (manual-progress
// providers move data only when polled), and when idle waits on the
// completion queues' descriptors, or polls every millisecond where a
// provider has none. Each peer has its own queue of operations to post, so
// that a peer the provider answers with -FI_EAGAIN holds up no other.
//
// Same-host peers' pools (shared_pool.h): memory this engine allocates
// (allocate) lives in sealed memfds that its descriptor names; an engine
// that reaches such a peer over shm maps those pools when it registers the
// peer with its memory, and its progress thread copies a write's bodies
// into them (copy_into_peer) and reads out of them instead of posting them.
// A write copied whole has no signal: it succeeds once its copies are done,
// and the target learns that it landed from a message (MessageKind::kLanded
// in io_engine_impl.h).
//
// Messages (send_after): a short message to a peer, sent once the transfers
// it follows have succeeded, that is once the peer has their bytes
// (delivery complete); the peer's endpoint keeps receives posted for them
// (FI_MSG) and take_messages() returns what arrived, each checked against
// the key its descriptor gave out (EngineDesc::inbox_key). The transport's
// notifications travel so.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pdkv/status.h"
#include "pdkv/transport.h"

namespace pdkv::backends::mori {

struct IoEngineConfig {
  std::string key;  // names this engine to its peers; unique per process
  // "auto": shm for peers on this host, tcp;ofi_rxm for the others; or one
  // libfabric provider for every peer ("shm", "tcp;ofi_rxm", "verbs;ofi_rxm",
  // "efa", ...). FI_PROVIDER, when set, is what libfabric may choose from.
  std::string provider = "auto";
  // The rank's address: network providers open their endpoint on it (the
  // shared-memory one has no address). Empty: the provider's choice.
  std::string host;
  // A transfer not done in this time fails (its operations are still
  // accounted for when the provider returns them): option timeout_ms, else
  // the engine's transfer timeout.
  std::chrono::milliseconds transfer_timeout{30'000};
  // Option shared_pools=on|off: whether allocate() hands out memfd-backed
  // pools and peers' pools are mapped (off: every byte goes through the
  // provider, as on another host).
  bool shared_pools = true;
  // Whether peers' transfers that landed here are kept for
  // pop_inbound_transfer_status. The transport never pops them (its
  // notifications and control calls say what arrived), so it keeps none:
  // kept and never popped, they would grow with every transfer.
  bool keep_inbound = true;
};

// The configuration the `mori` transport's options (TransportOptions) ask
// for; kInvalidArgument names an unknown key or a bad value.
Result<IoEngineConfig> config_from(const TransportOptions& options);

// What a peer needs to reach this engine: its key, a nonce that tags its
// transfer ids, where it runs (host, and its process's start time), and one
// fabric address per provider.
struct EngineDesc {
  struct Endpoint {
    std::string provider;
    std::string address;  // fi_getname
  };
  std::string key;
  uint32_t nonce = 0;
  std::string host_identity;
  uint64_t start_time = 0;  // of its process (process_start_time): tells a reused pid apart
  std::vector<Endpoint> endpoints;
  // Messages to this engine begin with this key, drawn at random, and one
  // that does not is dropped: only who holds the descriptor (and with it
  // the memory keys) can send one. 0: it takes no messages.
  uint64_t inbox_key = 0;
  // It keeps peers' landed transfers (IoEngineConfig::keep_inbound): only
  // then is it told of writes copied into its pools (MessageKind::kLanded).
  bool keeps_inbound = true;
  // Its doorbell (peer_doorbell.h): the number, in its process, of the
  // eventfd that wakes its progress thread, and that eventfd's id, which
  // proves a peer took the one described. A peer on the same host rings it
  // after posting. -1 (and 0): none.
  int32_t doorbell = -1;
  uint64_t doorbell_id = 0;
};

// A registered buffer, as a peer reaches it: one remote key per provider.
struct MemoryDesc {
  std::string engine_key;
  uint32_t id = 0;
  uint64_t base = 0, length = 0;
  std::vector<uint64_t> keys;  // in the order of the engine's endpoints
  // The number, in the engine's process, of a sealed memfd whose offset 0
  // holds `base` (IoEngine::allocate), and its inode; -1 when the memory is
  // not shared.
  int32_t memfd = -1;
  uint64_t memfd_inode = 0;
};

std::string encode(const EngineDesc& engine, std::span<const MemoryDesc> memory);
// Never trusts its input (kInvalidArgument for anything malformed).
Status decode(std::string_view blob, EngineDesc& engine, std::vector<MemoryDesc>& memory);

using TransferId = uint64_t;  // the engine's nonce in the high 32 bits

enum class TransferState : uint8_t { kInProgress, kSuccess, kFailed };
struct TransferStatus {
  TransferState state = TransferState::kInProgress;
  Status error;
  // kInProgress, yet failed: it waits for what the provider still holds
  // (error says why it failed), which its caller may hear of now.
  bool draining = false;
};

class IoEngine {
 public:
  using PeerFailureCallback = std::function<void(const std::string& engine_key, const Status&)>;

  static Result<std::unique_ptr<IoEngine>> create(IoEngineConfig config);
  ~IoEngine();

  const EngineDesc& desc() const;
  // The providers this engine opened, in endpoint order.
  std::vector<std::string> providers() const;

  // `length` zeroed bytes in a sealed memfd (shared_pool.h), which a peer on
  // this host maps once it is registered; they live as long as the engine.
  // kFailedPrecondition with shared_pools off.
  Result<void*> allocate(uint64_t length);
  Result<MemoryDesc> register_memory(void* base, uint64_t length);
  // Adds a peer to the address vector of the provider it will be reached by.
  // A peer reached over shm has those of `memory` that name a memfd mapped
  // here (on the caller's thread: filling the page tables of gigabytes takes
  // a while); one that cannot be mapped is left to the provider.
  Status register_remote_engine(const EngineDesc& remote, std::span<const MemoryDesc> memory = {});
  // The provider a registered peer is reached by.
  Result<std::string> provider_for(const std::string& engine_key) const;

  TransferId allocate_transfer_id();

  class Session {
   public:
    // Bytes flow local -> remote (write) or remote -> local (read). Offsets
    // are relative to the two buffers; ranges are checked by the caller.
    Status batch_write(std::span<const uint64_t> local_offsets,
                       std::span<const uint64_t> remote_offsets, std::span<const uint64_t> sizes,
                       TransferId id);
    Status batch_read(std::span<const uint64_t> local_offsets,
                      std::span<const uint64_t> remote_offsets, std::span<const uint64_t> sizes,
                      TransferId id);

   private:
    friend class IoEngine;
    IoEngine* engine_ = nullptr;
    MemoryDesc local_, remote_;
  };
  Result<Session> create_session(const MemoryDesc& local, const MemoryDesc& remote);

  // The operations of one transfer between one local and one remote buffer.
  struct Piece {
    const MemoryDesc* local = nullptr;
    const MemoryDesc* remote = nullptr;
    std::span<const uint64_t> local_offsets, remote_offsets, sizes;
  };
  // One transfer over several buffer pairs of one peer, checked as
  // create_session and a Session's calls check theirs: one id, one status,
  // and one signal after all its bytes, where sessions make a transfer per
  // pair, each with its own bookkeeping at both ends (a KV write touches two
  // buffers per layer).
  Status batch_write(std::span<const Piece> pieces, TransferId id);
  Status batch_read(std::span<const Piece> pieces, TransferId id);

  // The status of a transfer this engine started; a finished one is
  // forgotten after it is reported once. A failed one is reported once it is
  // over: none of its operations is left with the provider (cancelled, or
  // returned), or its drain ran out (kDrainQuiet, kDrainCap:
  // io_engine_progress.cc). Until then it is kInProgress with `draining` set.
  TransferStatus transfer_status(TransferId id);
  // Fails transfer `id` (one whose caller gave it up: the message that was
  // to follow it was refused); its operations are cancelled or drained as
  // for any failed transfer.
  void cancel_transfer(TransferId id, const Status& reason);
  // Target side: whether transfer `id` from engine `remote_key` has landed
  // (every byte visible here); consumes it when it has. Always false with
  // keep_inbound off. A write copied into our pools is heard of by a
  // message, which, unlike a signal, may be lost without failing the write
  // (the peer failing): then this never says it landed.
  bool pop_inbound_transfer_status(const std::string& remote_key, TransferId id);

  // The peer is gone: its transfers fail with `reason`, later ones are
  // refused, and what it held here is released (its address once nothing of
  // it is with the provider, its nonce, its landed transfers).
  void fail_peer(const std::string& engine_key, const Status& reason);
  // Target side: drops what engine `remote` had sent here that has not
  // landed yet (its connection closes; a later write comes on a new one).
  // False where the provider cannot (Endpoint::fence).
  bool fence_peer(const EngineDesc& remote);
  bool can_fence() const;
  // Called once per failed peer, on the progress thread, with no lock of
  // the engine held.
  void set_peer_failure_callback(PeerFailureCallback callback);
  // Called on the progress thread, with no lock of the engine held, after
  // transfers ended or failed (Transport::set_batch_end_callback).
  void set_batch_end_callback(std::function<void()> callback);

  // Whether every endpoint carries messages (FI_MSG, see Endpoint).
  bool can_message() const;
  // Sends `message` (at most kMaxMessageBytes) to engine `remote_key` once
  // every transfer of `after` (this engine's, to that peer) succeeded: at
  // once when `after` is empty, never when one of them fails, nor to a peer
  // that takes no messages. Its delivery is not reported.
  Status send_after(const std::string& remote_key, std::span<const TransferId> after,
                    std::string message);
  static constexpr size_t kMaxMessageBytes = 1024;
  // Target side: the messages peers sent, in arrival order, since the last call.
  std::vector<std::string> take_messages();
  // Target side: messages dropped for want of this engine's inbox key.
  uint64_t dropped_messages() const;
  // Called on the progress thread, with no lock of the engine held, after
  // messages arrived.
  void set_message_callback(std::function<void()> callback);

  // Bytes this engine's progress thread copied into or out of peers' mapped
  // pools; the provider moved the rest.
  uint64_t copied_bytes() const;
  // Times this engine rang a same-host peer's doorbell (peer_doorbell.h):
  // once per burst that posted anything to that peer through the provider.
  uint64_t rung_doorbells() const;
  // Whether the engine of `remote`, with `memory`, copies into this engine's
  // pools when it writes here: on this host over shm, with shared pools on
  // both sides, and with the kernel letting it take our pools' memfds. That
  // needs ptrace permission over this process, which the kernel gives alike
  // both ways between processes of one user that are not each other's
  // ancestors (Yama ptrace_scope 0 and 1): this engine probes its own over
  // the source's process, once per engine (take_probe below).
  bool copies_from(const EngineDesc& remote, std::span<const MemoryDesc> memory) const;

  // Memory ordering against the bytes peers move (see Transport).
  void acquire_inbound_writes() const;
  void release_to_peers();

  struct Impl;

 private:
  explicit IoEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pdkv::backends::mori

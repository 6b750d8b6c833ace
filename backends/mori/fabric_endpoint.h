// One libfabric provider's objects for the mori IO engine: fabric, domain,
// RDM endpoint, address vector, completion queue (with a wait descriptor
// where the provider has one), with FI_RMA_EVENT a counter of peers'
// accesses, and with FI_MSG an inbox of posted receives for peers' short
// messages. What fi_getinfo returned is read here, never assumed.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "pdkv/status.h"

namespace pdkv::backends::mori {

// kInternal "what: <fi_strerror(rc)>".
Status ofi_error(const std::string& what, int rc);

// The process an shm endpoint's address names: shm calls its region after
// the process ("<pid>:<uid>:<index>", maybe behind "fi_shm://"); -1 when
// the address is not of that form.
pid_t shm_address_pid(std::string_view address);

// A receive posted for one peer's message; the CQ entry's context names it.
struct InboxSlot {
  static constexpr size_t kBytes = 1040;  // a message, its key and kind; a longer one fails
  fi_context2 context;                    // first: the provider's (FI_CONTEXT2)
  char bytes[kBytes];
};

// Touched only on the engine's progress thread once the engine runs.
struct Endpoint {
  std::string provider;
  fi_info* info = nullptr;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_ep* ep = nullptr;
  fid_av* av = nullptr;
  fid_cq* cq = nullptr;
  fid_cntr* inbound = nullptr;  // counts peers' writes and reads here (with FI_RMA_EVENT)
  int wait_fd = -1;             // the CQ's, when the provider has one
  uint64_t inbound_seen = 0;
  std::string address;       // fi_getname
  bool virt_addr = false;    // FI_MR_VIRT_ADDR: remote addresses are virtual addresses
  bool prov_key = false;     // FI_MR_PROV_KEY: the provider chooses keys
  bool endpoint_mr = false;  // FI_MR_ENDPOINT: bind each MR to the endpoint
  size_t key_bytes = 8;      // of a key the provider takes (mr_key_size)
  // Writes to one peer up to this size land in the order they were posted
  // (FI_ORDER_RMA_WAW with max_order_waw_size); 0: no order is promised.
  size_t ordered_write_bytes = 0;
  // Where writes are ordered, the signal is a write of no bytes of its own
  // after the bodies (IoEngine::Impl::signal_after): all but shm, where one
  // never completed (libfabric 1.17) and no connection can close under it.
  bool signal_apart = false;
  // Peers' messages (FI_MSG, where no local buffer needs registering): this
  // many receives (fewer where the provider's receive queue is shorter)
  // stay posted, each posted again once its message is taken.
  static constexpr size_t kInboxSlots = 64;
  bool messages = false;
  std::vector<std::unique_ptr<InboxSlot>> inbox;
  // The inbox slot a completion's context names; null when it is none.
  InboxSlot* inbox_slot(void* context) const;

  Endpoint() = default;
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;
  ~Endpoint();

  // Opens provider `name` (RDM endpoints with RMA), with FI_RMA_EVENT where
  // the provider has it, else without; a network provider's endpoint on
  // `host` when one is given.
  Status open(const std::string& name, const std::string& host = "");

  // Drops the connection the peer at `address` (fi_getname's) has to this
  // endpoint, and with it what it had sent that did not land yet; a later
  // write of the peer comes on a new connection. True when the provider
  // does that: ofi_rxm when libfabric's av_remove_cleanup is on (open()
  // turns it on unless the operator set FI_AV_REMOVE_CLEANUP); shm peers
  // share this host, where no path can be cut.
  bool fence(const std::string& address);
  bool can_fence = false;  // decided by open(), as libfabric reads its setting then

  // Posts `slot`'s receive again; false when the provider asks to be
  // progressed first (-FI_EAGAIN: the caller tries again later).
  bool post_receive(InboxSlot& slot);

 private:
  Status get_info(const std::string& name, const std::string& host, uint64_t extra_caps,
                  uint64_t prov_key_mode);
  Status open_objects();
  Status open_inbox();
};

}  // namespace pdkv::backends::mori

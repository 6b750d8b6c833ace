#include "fabric_endpoint.h"

#include <fmt/format.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "log.h"

namespace pdkv::backends::mori {

Status ofi_error(const std::string& what, int rc) {
  return Status::internal(fmt::format("{}: {}", what, fi_strerror(rc < 0 ? -rc : rc)));
}

Endpoint::~Endpoint() {
  if (ep) fi_close(&ep->fid);
  if (inbound) fi_close(&inbound->fid);
  if (av) fi_close(&av->fid);
  if (cq) fi_close(&cq->fid);
  if (domain) fi_close(&domain->fid);
  if (fabric) fi_close(&fabric->fid);
  if (info) fi_freeinfo(info);
}

namespace {

// libfabric reads av_remove_cleanup from the environment once, when it
// initialises (the first fi_getinfo of the process): set before that, and
// only where the operator said nothing.
void ask_for_av_remove_cleanup() {
  static std::once_flag once;
  std::call_once(once, [] { setenv("FI_AV_REMOVE_CLEANUP", "1", /*overwrite=*/0); });
}

bool av_remove_cleanup() {
  const char* v = std::getenv("FI_AV_REMOVE_CLEANUP");
  if (v == nullptr) return false;
  const std::string s(v);
  return s == "1" || s == "yes" || s == "true" || s == "on" || s == "y";
}

// libfabric's shm provider names an endpoint's shared-memory region after
// the process ("<pid>:<uid>:<index>", maybe behind "fi_shm://"), and when a
// file of that name exists it refuses to reuse it while the pid stored in
// it is alive (fi_enable: "Device or resource busy"). Such a file is a
// region that a killed process of this pid left: pids are unique among live
// processes, and this one has not created it yet, so the pid libfabric
// finds alive is this process's. It is removed. (Assumes /dev/shm is not
// shared with another pid namespace.)
void remove_stale_shm_region(fid_ep* ep) {
  char buffer[256] = {};
  size_t length = sizeof buffer - 1;
  if (fi_getname(&ep->fid, buffer, &length) != 0) return;
  std::string name(buffer, strnlen(buffer, sizeof buffer - 1));
  if (shm_address_pid(name) != ::getpid()) return;  // not ours: never touched
  if (const size_t slash = name.rfind('/'); slash != std::string::npos) name.erase(0, slash + 1);
  const std::string file = "/dev/shm/" + name;
  if (::unlink(file.c_str()) == 0) {
    logger("mori")->info("removed {}, a shared-memory region a killed process of this pid left",
                         file);
  }
}

}  // namespace

pid_t shm_address_pid(std::string_view address) {
  if (const size_t slash = address.rfind('/'); slash != std::string_view::npos) {
    address.remove_prefix(slash + 1);
  }
  const std::string_view digits = address.substr(0, address.find(':'));
  if (digits.empty() || digits.size() == address.size()) return -1;
  pid_t pid = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), pid);
  return ec == std::errc() && end == digits.data() + digits.size() && pid > 0 ? pid : -1;
}

bool Endpoint::fence(const std::string& peer_address) {
  if (!can_fence) return false;
  // The peer's connection is found by its address whether or not this side
  // ever inserted it: removing the address closes it.
  fi_addr_t addr = FI_ADDR_UNSPEC;
  if (fi_av_insert(av, peer_address.data(), 1, &addr, 0, nullptr) != 1) return false;
  return fi_av_remove(av, &addr, 1, 0) == 0;
}

// A counter of inbound accesses (FI_RMA_EVENT) tells the progress thread that
// peers are busy here; a provider without it is opened without.
Status Endpoint::open(const std::string& name, const std::string& host) {
  ask_for_av_remove_cleanup();
  provider = name;
  can_fence = name != "shm" && av_remove_cleanup();
  signal_apart = name != "shm";
  // Shared memory has no network address to open on.
  const std::string node = name == "shm" ? "" : host;
  // Keys we draw at random where the provider takes them (without
  // FI_MR_PROV_KEY); the provider's own where it insists (util providers'
  // count from 1, so they are asked for last). RMA events where offered.
  // Messages where offered (the notifications that follow transfers).
  Status found = Status::ok();
  for (const uint64_t msg : {uint64_t{FI_MSG}, uint64_t{0}}) {
    for (const uint64_t prov_key : {uint64_t{0}, uint64_t{FI_MR_PROV_KEY}}) {
      for (const uint64_t caps : {uint64_t{FI_RMA_EVENT}, uint64_t{0}}) {
        found = get_info(name, node, caps | msg, prov_key);
        if (found.is_ok()) return open_objects();
      }
    }
  }
  return found;
}

Status Endpoint::get_info(const std::string& name, const std::string& host, uint64_t extra_caps,
                          uint64_t prov_key_mode) {
  fi_info* hints = fi_allocinfo();
  if (hints == nullptr) return Status::internal("fi_allocinfo failed");
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | extra_caps;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | prov_key_mode | FI_MR_ENDPOINT;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
  hints->fabric_attr->prov_name = strdup(name.c_str());
  const int rc = fi_getinfo(FI_VERSION(1, 9), host.empty() ? nullptr : host.c_str(), nullptr,
                            host.empty() ? 0 : FI_SOURCE, hints, &info);
  fi_freeinfo(hints);
  if (rc != 0) {
    return ofi_error(
        fmt::format("fi_getinfo for provider '{}'{}", name, host.empty() ? "" : " on " + host), rc);
  }
  return Status::ok();
}

Status Endpoint::open_objects() {
  const std::string& name = provider;
  const uint64_t mr_mode = info->domain_attr->mr_mode;
  virt_addr = mr_mode & FI_MR_VIRT_ADDR;
  prov_key = mr_mode & FI_MR_PROV_KEY;
  key_bytes = std::min<size_t>(info->domain_attr->mr_key_size, sizeof(uint64_t));
  endpoint_mr = mr_mode & FI_MR_ENDPOINT;
  if (info->tx_attr->msg_order & (FI_ORDER_RMA_WAW | FI_ORDER_WAW)) {
    ordered_write_bytes = info->ep_attr->max_order_waw_size;
  }
  if (info->domain_attr->cq_data_size < sizeof(uint64_t)) {
    return Status::failed_precondition(
        fmt::format("provider '{}' carries {} bytes of remote CQ data; a transfer id needs 8", name,
                    info->domain_attr->cq_data_size));
  }
  int r;
  if ((r = fi_fabric(info->fabric_attr, &fabric, nullptr)) != 0) return ofi_error("fi_fabric", r);
  if ((r = fi_domain(fabric, info, &domain, nullptr)) != 0) return ofi_error("fi_domain", r);
  // A CQ with a file descriptor lets the idle progress thread sleep until
  // peers' traffic arrives (tcp;ofi_rxm needs our polls to move it);
  // providers without one are polled every kIdleTick.
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_DATA;
  cq_attr.wait_obj = FI_WAIT_FD;
  if (fi_cq_open(domain, &cq_attr, &cq, nullptr) != 0 ||
      fi_control(&cq->fid, FI_GETWAIT, &wait_fd) != 0) {
    if (cq) fi_close(&cq->fid);
    cq = nullptr;
    wait_fd = -1;
    cq_attr.wait_obj = FI_WAIT_NONE;
    if ((r = fi_cq_open(domain, &cq_attr, &cq, nullptr)) != 0) return ofi_error("fi_cq_open", r);
  }
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_UNSPEC;
  if ((r = fi_av_open(domain, &av_attr, &av, nullptr)) != 0) return ofi_error("fi_av_open", r);
  if ((r = fi_endpoint(domain, info, &ep, nullptr)) != 0) return ofi_error("fi_endpoint", r);
  if ((r = fi_ep_bind(ep, &av->fid, 0)) != 0) return ofi_error("fi_ep_bind(av)", r);
  if ((r = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV)) != 0) {
    return ofi_error("fi_ep_bind(cq)", r);
  }
  if (info->caps & FI_RMA_EVENT) {
    fi_cntr_attr cntr_attr{};
    cntr_attr.events = FI_CNTR_EVENTS_COMP;
    cntr_attr.wait_obj = FI_WAIT_NONE;
    if ((r = fi_cntr_open(domain, &cntr_attr, &inbound, nullptr)) != 0) {
      return ofi_error("fi_cntr_open", r);
    }
    if ((r = fi_ep_bind(ep, &inbound->fid, FI_REMOTE_WRITE | FI_REMOTE_READ)) != 0) {
      return ofi_error("fi_ep_bind(cntr)", r);
    }
  }
  if (provider == "shm") remove_stale_shm_region(ep);
  if ((r = fi_enable(ep)) != 0) return ofi_error("fi_enable", r);
  size_t len = 0;
  fi_getname(&ep->fid, nullptr, &len);
  address.resize(len);
  if ((r = fi_getname(&ep->fid, address.data(), &len)) != 0) return ofi_error("fi_getname", r);
  address.resize(len);
  return open_inbox();
}

// Only where our buffers need no registration (FI_MR_LOCAL): the inbox and
// each message sent are plain memory. An inbox the provider will not take
// leaves the endpoint without messages, not unopened.
Status Endpoint::open_inbox() {
  messages = (info->caps & FI_MSG) && !(info->domain_attr->mr_mode & FI_MR_LOCAL);
  if (!messages) return Status::ok();
  const size_t slots =
      info->rx_attr->size > 0 ? std::min(kInboxSlots, info->rx_attr->size) : kInboxSlots;
  for (size_t i = 0; i < slots; ++i) {
    inbox.push_back(std::make_unique<InboxSlot>());
    if (!post_receive(*inbox.back())) {
      logger("mori")->info("{}: no messages (fi_recv refused receive {} of the inbox)", provider,
                           i);
      messages = false;
      break;
    }
  }
  return Status::ok();
}

InboxSlot* Endpoint::inbox_slot(void* context) const {
  for (const auto& slot : inbox) {
    if (&slot->context == context) return slot.get();
  }
  return nullptr;
}

bool Endpoint::post_receive(InboxSlot& slot) {
  return fi_recv(ep, slot.bytes, InboxSlot::kBytes, nullptr, FI_ADDR_UNSPEC, &slot.context) == 0;
}

}  // namespace pdkv::backends::mori

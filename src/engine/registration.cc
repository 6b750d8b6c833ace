#include "engine/registration.h"

#include <fmt/format.h>

#include "grpc_status.h"
#include "log.h"

namespace pdkv::engine {

Registration::Registration(EventLoop& loop, CallTracker& tracker,
                           const std::string& bootstrap_address, const Security& security,
                           proto::RankInfo self)
    : loop_(loop),
      tracker_(tracker),
      bootstrap_(bootstrap_address, security),
      self_(std::move(self)),
      group_(new_call_group()) {}

void Registration::start() {
  if (stopped_ || timer_ != 0) return;
  timer_ = loop_.after(kRenewEvery, [this] { renew(); });
}

void Registration::stop() {
  stopped_ = true;
  loop_.cancel(timer_);
  timer_ = 0;
  tracker_.cancel(group_);  // shutdown does not wait for a service that is away
}

void Registration::renew() {
  timer_ = 0;
  if (stopped_) return;
  proto::RegisterRankRequest request;
  request.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  *request.mutable_rank() = self_;
  request.set_renewal(true);  // never displaces a newer incarnation of this rank
  auto& stub = bootstrap_.stub();
  // Not wait_for_ready: a service that is away fails the call at once, and
  // the next renewal tries again.
  start_unary<proto::RegisterRankRequest, proto::RegisterRankReply>(
      loop_, tracker_, group_, kRenewEvery, /*wait_for_ready=*/false, std::move(request),
      [&stub](auto* ctx, auto* req, auto* rep, auto cb) {
        stub.async()->RegisterRank(ctx, req, rep, std::move(cb));
      },
      [this](const grpc::Status& s, const proto::RegisterRankReply&) { renewed(s); });
}

void Registration::renewed(const grpc::Status& s) {
  if (stopped_) return;
  if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
    // A newer process of this rank registered (this one was frozen or cut
    // off, and replaced): it owns the entry now.
    logger("engine")->warn(
        "{}; no longer renewing this rank's registration",
        from_grpc(s, "bootstrap " + bootstrap_.address() + " RegisterRank").message());
    return;
  }
  if (!s.ok() && !lapsed_) {
    lapsed_ = true;
    const Status why = from_grpc(s, fmt::format("bootstrap {} RegisterRank", bootstrap_.address()));
    logger("engine")->warn("{}; registering again every {} ms until it answers", why.message(),
                           kRenewEvery.count());
  } else if (s.ok() && lapsed_) {
    lapsed_ = false;
    logger("engine")->info("registered again with bootstrap {}", bootstrap_.address());
  }
  timer_ = loop_.after(kRenewEvery, [this] { renew(); });
}

}  // namespace pdkv::engine

#include "engine/peer_links.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <optional>

#include "grpc_status.h"
#include "log.h"

namespace pdkv::engine {

PeerLink::PeerLink(std::string key, std::string address, std::string name,
                   std::chrono::milliseconds keepalive)
    : key_(std::move(key)),
      address_(std::move(address)),
      name_(std::move(name)),
      keepalive_(keepalive) {
  grpc::ChannelArguments args;
  const int ms = static_cast<int>(keepalive.count());
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // A private connection per link: a peer's death must not be hidden behind,
  // or leak into, a subchannel shared with another link.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Reconnect quickly: a transient connect error must be retried well inside
  // the connect timeout, after which an unreachable peer is declared lost.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, std::max(100, ms / 4));
  channel_ = grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), args);
  stub_ = proto::Control::NewStub(channel_);
}

PeerLink::~PeerLink() { stop(); }

Status PeerLink::alive() const {
  std::lock_guard lock(mu_);
  return lost_reason_;
}

void PeerLink::watch(const proto::RankRef& self, std::chrono::milliseconds connect_timeout,
                     std::function<void(const Status&)> lost) {
  watcher_ = std::thread([this, self, connect_timeout, lost = std::move(lost)] {
    // First the connection. A slow peer gets `connect_timeout`; one that
    // keeps refusing (its process is gone) is dead after one keepalive
    // period of refusals; a single transient failure is retried.
    const auto deadline = std::chrono::system_clock::now() + connect_timeout;
    std::optional<std::chrono::system_clock::time_point> failing_since;
    std::string why;
    while (true) {
      const grpc_connectivity_state state = channel_->GetState(/*try_to_connect=*/true);
      if (state == GRPC_CHANNEL_READY) break;
      const auto now = std::chrono::system_clock::now();
      if (state == GRPC_CHANNEL_TRANSIENT_FAILURE && !failing_since) failing_since = now;
      if (failing_since && now - *failing_since >= keepalive_) {
        why = fmt::format("unreachable for {} ms", keepalive_.count());
      } else if (now >= deadline) {
        why = fmt::format("cannot connect within {} ms", connect_timeout.count());
      }
      if (stopping_) return;
      if (!why.empty()) {
        const Status reason =
            Status::unavailable(fmt::format("control connection to {} lost: {}", name_, why));
        {
          std::lock_guard lock(mu_);
          lost_reason_ = reason;
          cancel_calls();
        }
        lost(reason);
        return;
      }
      channel_->WaitForStateChange(state, std::min(deadline, now + std::chrono::milliseconds(50)));
    }
    auto stream = stub_->Watch(&watch_ctx_);
    proto::Heartbeat hello;
    hello.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
    *hello.mutable_from() = self;
    proto::Heartbeat ignored;
    if (stream->Write(hello)) {
      while (stream->Read(&ignored)) {
      }
    }
    const grpc::Status s = stream->Finish();
    if (stopping_) return;
    // A peer shutting down ends the stream itself (OK or CANCELLED): replies
    // it already decided are still on their way, so calls in flight finish on
    // their own. Any other end (reset, keepalive timeout) is a death: cancel them.
    const bool leaving = s.ok() || s.error_code() == grpc::StatusCode::CANCELLED;
    const Status reason =
        Status::unavailable(fmt::format("control connection to {} lost: {}", name_,
                                        s.ok() ? "the peer closed it" : s.error_message()));
    {
      std::lock_guard lock(mu_);
      lost_reason_ = reason;
      if (!leaving) cancel_calls();
    }
    lost(reason);
  });
}

void PeerLink::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    cancel_calls();
  }
  watch_ctx_.TryCancel();
  if (watcher_.joinable()) watcher_.join();
}

void PeerLink::cancel_calls() {
  for (grpc::ClientContext* ctx : calls_) ctx->TryCancel();
}

PeerLinks::PeerLinks(proto::RankRef self, std::chrono::milliseconds keepalive,
                     std::chrono::milliseconds connect_timeout,
                     std::function<void(const std::string&, const Status&)> on_lost)
    : self_(std::move(self)),
      keepalive_(keepalive),
      connect_timeout_(connect_timeout),
      on_lost_(std::move(on_lost)) {}

PeerLinks::~PeerLinks() { stop_all(); }

std::string PeerLinks::key_of(const std::string& address, uint64_t incarnation) {
  return fmt::format("{}#{}", address, incarnation);
}

std::shared_ptr<PeerLink> PeerLinks::get(const std::string& address, uint64_t incarnation,
                                         const std::string& name) {
  const std::string key = key_of(address, incarnation);
  std::lock_guard lock(mu_);
  auto& link = links_[key];
  if (!link) {
    link =
        std::make_shared<PeerLink>(key, address, fmt::format("{} ({})", name, address), keepalive_);
    if (!stopped_) {
      link->watch(self_, connect_timeout_,
                  [this, key](const Status& reason) { on_lost_(key, reason); });
    }
  }
  return link;
}

void PeerLinks::stop_all() {
  std::map<std::string, std::shared_ptr<PeerLink>> links;
  {
    std::lock_guard lock(mu_);
    stopped_ = true;
    links.swap(links_);
  }
  for (auto& [key, link] : links) link->stop();
}

void configure_server(grpc::ServerBuilder& builder, std::chrono::milliseconds keepalive) {
  // gRPC sets SO_REUSEPORT by default: then binding port 0 can hand two
  // processes the same port, and the kernel splits connections between them.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  const int ms = static_cast<int>(keepalive.count());
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             std::max(1, ms / 2));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
}

}  // namespace pdkv::engine

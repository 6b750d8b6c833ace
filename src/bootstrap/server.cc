#include <grpcpp/grpcpp.h>

#include "bootstrap/registry.h"
#include "grpc_status.h"
#include "log.h"
#include "pdkv.grpc.pb.h"
#include "pdkv/bootstrap.h"
#include "security/call_auth.h"
#include "security/grpc_security.h"

namespace pdkv {
namespace {

constexpr char kRegisterMethod[] = "/pdkv.proto.Bootstrap/RegisterRank";
constexpr char kTopologyMethod[] = "/pdkv.proto.Bootstrap/GetTopology";

class BootstrapService final : public proto::Bootstrap::Service {
 public:
  BootstrapService(const Security& security, const Limits& limits)
      : auth_(security, limits.replay_cache, "bootstrap"), registry_(limits) {}

  grpc::Status RegisterRank(grpc::ServerContext* ctx, const proto::RegisterRankRequest* request,
                            proto::RegisterRankReply* reply) override {
    PDKV_GRPC_CHECK(check_protocol_version(request->protocol_version()));
    if (auto s = auth_.check(*ctx, kRegisterMethod, request); !s.ok()) return s;
    auto registered = registry_.register_rank(request->rank(), request->renewal());
    if (!registered.is_ok()) {
      logger("bootstrap")->warn("refused registration: {}", registered.status().message());
      return to_grpc(registered.status());
    }
    reply->set_replaced(registered->replaced);
    const auto& r = request->rank();
    // Live ranks renew every second: news only when this service did not
    // know the rank (it was restarted).
    const bool news = !request->renewal() || !registered->replaced;
    if (registered->replaced && registered->replaced_incarnation != r.incarnation()) {
      logger("bootstrap")
          ->warn("{} rank dp {} tp {} pp {}: incarnation {} (from {}) replaces incarnation {}",
                 r.engine_id(), r.dp_rank(), r.tp_rank(), r.pp_rank(), r.incarnation(), ctx->peer(),
                 registered->replaced_incarnation);
    }
    logger("bootstrap")
        ->log(news ? spdlog::level::info : spdlog::level::debug,
              "{} rank {} dp {} tp {}/{} pp {}/{} at {}",
              registered->replaced ? "re-registered" : "registered", r.engine_id(), r.dp_rank(),
              r.tp_rank(), r.tp_size(), r.pp_rank(), r.pp_size(), r.control_address());
    return grpc::Status::OK;
  }

  grpc::Status GetTopology(grpc::ServerContext* ctx, const proto::TopologyRequest* request,
                           proto::TopologyReply* reply) override {
    PDKV_GRPC_CHECK(check_protocol_version(request->protocol_version()));
    // Descriptors carry remote keys: only for callers holding the secret.
    if (auto s = auth_.check(*ctx, kTopologyMethod, request); !s.ok()) return s;
    auto ranks = registry_.topology(request->engine_id(), request->dp_rank());
    if (!ranks.is_ok()) return to_grpc(ranks.status());
    for (auto& r : *ranks) *reply->add_ranks() = std::move(r);
    return grpc::Status::OK;
  }

 private:
  security::CallAuthenticator auth_;
  bootstrap::Registry registry_;
};

}  // namespace

struct BootstrapServer::Impl {
  Impl(const Security& security, const Limits& limits) : service(security, limits) {}
  BootstrapService service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

BootstrapServer::BootstrapServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

BootstrapServer::~BootstrapServer() { shutdown(); }

Result<std::unique_ptr<BootstrapServer>> BootstrapServer::start(const std::string& address,
                                                                const Security& security,
                                                                const Limits& limits) {
  security::warn_if_unauthenticated(security, "bootstrap");
  auto impl = std::make_unique<Impl>(security, limits);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, security::server_credentials(security), &impl->port);
  builder.RegisterService(&impl->service);
  // No SO_REUSEPORT: two services must never share a port (see configure_server).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  impl->server = builder.BuildAndStart();
  if (!impl->server || impl->port == 0) {
    return Status::unavailable(fmt::format("bootstrap cannot listen on '{}'", address));
  }
  logger("bootstrap")->info("listening on port {}", impl->port);
  return std::unique_ptr<BootstrapServer>(new BootstrapServer(std::move(impl)));
}

int BootstrapServer::port() const { return impl_->port; }

void BootstrapServer::wait() { impl_->server->Wait(); }

void BootstrapServer::shutdown() {
  if (impl_ && impl_->server) impl_->server->Shutdown();
}

}  // namespace pdkv

#include "bootstrap/client.h"

#include <fmt/format.h>

#include "grpc_status.h"
#include "security/grpc_security.h"

namespace pdkv::bootstrap {
namespace {

void set_deadline(grpc::ClientContext& ctx, std::chrono::milliseconds timeout) {
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
}

// A bootstrap service that went away is tried again about every half
// second (gRPC's default backoff grows to two minutes), so that ranks
// register again, and lookups resume, moments after it is back. One attempt
// (TCP, TLS and HTTP/2 handshakes) may take 2 s; gRPC's default of 20 s
// (GRPC_ARG_MIN_RECONNECT_BACKOFF_MS bounds the attempt, not the backoff)
// held a rank unregistered that long when the service's kernel accepted the
// connection but the service never answered it (frozen, then replaced).
constexpr int kConnectAttemptMs = 2000;

std::shared_ptr<grpc::Channel> bootstrap_channel(const std::string& address,
                                                 const Security& security) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, kConnectAttemptMs);
  return security::make_channel(address, args, security);
}

}  // namespace

Client::Client(std::string address, const Security& security)
    : address_(std::move(address)),
      stub_(proto::Bootstrap::NewStub(bootstrap_channel(address_, security))) {}

Result<bool> Client::register_rank(const proto::RankInfo& rank, std::chrono::milliseconds timeout) {
  proto::RegisterRankRequest request;
  request.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  *request.mutable_rank() = rank;
  proto::RegisterRankReply reply;
  grpc::ClientContext ctx;
  set_deadline(ctx, timeout);
  ctx.set_wait_for_ready(true);  // the service may still be starting
  const grpc::Status s = stub_->RegisterRank(&ctx, request, &reply);
  if (!s.ok()) return from_grpc(s, fmt::format("bootstrap {} RegisterRank", address_));
  return reply.replaced();
}

Result<std::vector<proto::RankInfo>> Client::topology(const std::string& engine_id,
                                                      uint32_t dp_rank,
                                                      std::chrono::milliseconds timeout) {
  proto::TopologyRequest request;
  request.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  request.set_engine_id(engine_id);
  request.set_dp_rank(dp_rank);
  proto::TopologyReply reply;
  grpc::ClientContext ctx;
  set_deadline(ctx, timeout);
  const grpc::Status s = stub_->GetTopology(&ctx, request, &reply);
  if (!s.ok()) return from_grpc(s, fmt::format("bootstrap {} GetTopology", address_));
  return std::vector<proto::RankInfo>(reply.ranks().begin(), reply.ranks().end());
}

}  // namespace pdkv::bootstrap

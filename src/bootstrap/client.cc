#include "bootstrap/client.h"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "grpc_status.h"

namespace pdkv::bootstrap {
namespace {

void set_deadline(grpc::ClientContext& ctx, std::chrono::milliseconds timeout) {
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
}

}  // namespace

Client::Client(std::string address)
    : address_(std::move(address)),
      stub_(proto::Bootstrap::NewStub(
          grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()))) {}

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

Result<std::vector<proto::RankInfo>> Client::wait_for_topology(
    const std::string& engine_id, uint32_t dp_rank, std::chrono::milliseconds timeout,
    const std::function<bool()>& cancelled) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::chrono::milliseconds backoff{10};
  Status last;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    if (cancelled && cancelled())
      return Status::aborted("topology lookup cancelled: shutting down");
    auto ranks = topology(engine_id, dp_rank, std::min(left, std::chrono::milliseconds{1000}));
    if (ranks.is_ok()) return ranks;
    last = ranks.status();
    // Not registered yet, or not even one rank yet: both resolve with time.
    const bool retry = last.code() == StatusCode::kUnavailable ||
                       last.code() == StatusCode::kNotFound ||
                       last.code() == StatusCode::kDeadlineExceeded;
    if (!retry) return last;
    std::this_thread::sleep_for(std::min(backoff, left));  // retry pacing, not synchronisation
    backoff = std::min(backoff * 2, std::chrono::milliseconds{200});
  }
  return Status::deadline_exceeded(
      fmt::format("topology of engine '{}' dp {} not complete after {} ms; last answer: {}",
                  engine_id, dp_rank, timeout.count(), last.message()));
}

}  // namespace pdkv::bootstrap

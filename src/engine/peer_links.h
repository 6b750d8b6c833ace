// Control connections to peer ranks, one per (control address, incarnation).
//
// Each link owns a gRPC channel with keepalive and keeps a Watch stream open
// on a thread of its own. The stream ending (the peer process died, its host
// went silent past keepalive, or it shut down) is how a dead peer is seen:
// the link reports it once through the `lost` callback and then refuses
// calls at once, without waiting for any request timeout.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "pdkv.grpc.pb.h"
#include "pdkv/status.h"

namespace pdkv::engine {

class PeerLink {
 public:
  PeerLink(std::string key, std::string address, std::string name,
           std::chrono::milliseconds keepalive);
  ~PeerLink();

  const std::string& key() const { return key_; }
  const std::string& name() const { return name_; }  // "decode-a dp 0 tp 1 pp 0 (127.0.0.1:5000)"
  proto::Control::Stub& stub() { return *stub_; }
  // Ok while the peer is alive; afterwards the reason it was declared lost.
  Status alive() const;

  // Connects (retrying for up to `connect_timeout`) and opens the Watch
  // stream; `lost` runs once, on the link's thread, if either fails for any
  // reason other than stop().
  void watch(const proto::RankRef& self, std::chrono::milliseconds connect_timeout,
             std::function<void(const Status&)> lost);
  void stop();

  // Runs one unary call `rpc(ctx)` with a deadline, riding out reconnects;
  // refused at once for a lost link, and cancelled if the link is lost (or
  // stopped) while the call waits.
  template <typename Rpc>
  grpc::Status call(std::chrono::milliseconds timeout, Rpc&& rpc) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    ctx.set_wait_for_ready(true);
    {
      std::lock_guard lock(mu_);
      if (!lost_reason_.is_ok()) return {grpc::StatusCode::UNAVAILABLE, lost_reason_.message()};
      if (stopping_) return {grpc::StatusCode::CANCELLED, "link stopped"};
      calls_.insert(&ctx);
    }
    grpc::Status status = rpc(ctx);
    std::lock_guard lock(mu_);
    calls_.erase(&ctx);
    return status;
  }

 private:
  const std::string key_, address_, name_;
  const std::chrono::milliseconds keepalive_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<proto::Control::Stub> stub_;
  void cancel_calls();  // mu_ held

  mutable std::mutex mu_;
  Status lost_reason_;
  std::set<grpc::ClientContext*> calls_;  // unary calls in flight
  grpc::ClientContext watch_ctx_;
  std::thread watcher_;
  std::atomic<bool> stopping_{false};
};

class PeerLinks {
 public:
  PeerLinks(proto::RankRef self, std::chrono::milliseconds keepalive,
            std::chrono::milliseconds connect_timeout,
            std::function<void(const std::string& key, const Status& reason)> on_lost);
  ~PeerLinks();

  static std::string key_of(const std::string& address, uint64_t incarnation);
  static std::string key_of(const proto::RankInfo& rank) {
    return key_of(rank.control_address(), rank.incarnation());
  }
  // The link for this peer, created (and watched) on first use.
  std::shared_ptr<PeerLink> get(const std::string& address, uint64_t incarnation,
                                const std::string& name);
  void stop_all();

 private:
  const proto::RankRef self_;
  const std::chrono::milliseconds keepalive_;
  const std::chrono::milliseconds connect_timeout_;
  std::function<void(const std::string&, const Status&)> on_lost_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<PeerLink>> links_;
  bool stopped_ = false;
};

// Server-side channel arguments: keepalive matching the links' (gRPC refuses
// pings more frequent than the server allows, so both ends are set together),
// and a port of its own (no SO_REUSEPORT).
void configure_server(grpc::ServerBuilder& builder, std::chrono::milliseconds keepalive);

}  // namespace pdkv::engine

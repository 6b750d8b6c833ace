#include "engine/topology_lookups.h"

#include <fmt/format.h>

#include "engine/peer_registry.h"
#include "grpc_status.h"

namespace pdkv::engine {
namespace {

constexpr auto kMaxBackoff = std::chrono::milliseconds(200);
constexpr auto kAttemptLimit = std::chrono::milliseconds(1000);

// Not registered yet, or not even one rank yet: both resolve with time.
bool worth_retrying(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kNotFound ||
         s.code() == StatusCode::kDeadlineExceeded;
}

}  // namespace

TopologyLookups::TopologyLookups(EventLoop& loop, CallTracker& tracker,
                                 const std::string& bootstrap_address, const EngineConfig& self)
    : loop_(loop), tracker_(tracker), bootstrap_(bootstrap_address, self.security), self_(self) {}

std::optional<const PeerEngine*> TopologyLookups::want(const EngineKey& engine, Done done) {
  if (lookups_.count(engine) == 0 && pending_ >= self_.limits.pending_lookups) {
    // Every message naming an engine nobody registered would start one.
    loop_.post([done, engine, limit = self_.limits.pending_lookups] {
      done(Status::resource_exhausted(
          fmt::format("engine '{}' dp {} not looked up: {} lookups are waiting already "
                      "(Limits::pending_lookups)",
                      engine.first, engine.second, limit)));
    });
    return std::nullopt;
  }
  auto [it, fresh] = lookups_.try_emplace(engine);
  Lookup& lookup = it->second;
  if (lookup.ready) return &lookup.engine;
  if (stopped_) {
    loop_.post([done] { done(Status::aborted("topology lookup cancelled: shutting down")); });
    return std::nullopt;
  }
  lookup.waiting.push_back(std::move(done));
  if (fresh) {
    ++pending_;
    start(engine);
  }
  return std::nullopt;
}

void TopologyLookups::start(const EngineKey& engine) {
  const auto deadline = Clock::now() + self_.timeouts.bootstrap;
  lookups_[engine].deadline = deadline;
  fetch(engine, engine, deadline,
        [this, engine, deadline](Result<std::vector<proto::RankInfo>> theirs) {
          if (!theirs.is_ok()) return finish(engine, theirs.status());
          if (own_) return finish(engine, link_up(engine, std::move(theirs).value()));
          const EngineKey mine{self_.engine_id, self_.dp_rank};
          fetch(engine, mine, deadline,
                [this, engine, theirs = std::move(theirs).value()](
                    Result<std::vector<proto::RankInfo>> ours) mutable {
                  if (!ours.is_ok()) return finish(engine, ours.status());
                  own_ = Topology{std::move(ours).value()};
                  finish(engine, link_up(engine, std::move(theirs)));
                });
        });
}

void TopologyLookups::fetch(const EngineKey& wanted, const EngineKey& engine,
                            Clock::time_point deadline, Fetched done,
                            std::chrono::milliseconds backoff, Status last) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (stopped_) return done(Status::aborted("topology lookup cancelled: shutting down"));
  if (left.count() <= 0) {
    return done(Status::deadline_exceeded(fmt::format(
        "topology of engine '{}' dp {} not complete after {} ms; last answer: {}", engine.first,
        engine.second, self_.timeouts.bootstrap.count(), last.message())));
  }
  proto::TopologyRequest request;
  request.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  request.set_engine_id(engine.first);
  request.set_dp_rank(engine.second);
  auto& stub = bootstrap_.stub();
  start_unary<proto::TopologyRequest, proto::TopologyReply>(
      loop_, tracker_, /*group=*/0, std::min(left, kAttemptLimit), /*wait_for_ready=*/false,
      std::move(request),
      [&stub](auto* ctx, auto* req, auto* rep, auto cb) {
        stub.async()->GetTopology(ctx, req, rep, std::move(cb));
      },
      [this, wanted, engine, deadline, done = std::move(done), backoff](
          const grpc::Status& s, const proto::TopologyReply& reply) mutable {
        if (s.ok()) {
          return done(std::vector<proto::RankInfo>(reply.ranks().begin(), reply.ranks().end()));
        }
        Status why = from_grpc(s, fmt::format("bootstrap {} GetTopology", bootstrap_.address()));
        if (!worth_retrying(why) || stopped_) return done(why);
        if (auto it = lookups_.find(wanted); it != lookups_.end()) {
          it->second.last_answer = why.message();
        }
        // Retry pacing, on a timer: the loop goes on meanwhile.
        loop_.after(backoff, [this, wanted, engine, deadline, done = std::move(done), backoff,
                              why = std::move(why)]() mutable {
          fetch(wanted, engine, deadline, std::move(done), std::min(backoff * 2, kMaxBackoff),
                std::move(why));
        });
      });
}

Result<PeerEngine> TopologyLookups::link_up(const EngineKey& engine,
                                            std::vector<proto::RankInfo> theirs) const {
  Topology peer{std::move(theirs)};
  const bool peer_is_decode = peer.ranks.front().role() == proto::ROLE_DECODE;
  const bool i_am_prefill = self_.role == Role::kPrefill;
  if (peer_is_decode != i_am_prefill) {
    return Status::invalid_argument(
        fmt::format("engine '{}' is a {} engine, but a {} rank needs a {} engine", engine.first,
                    peer_is_decode ? "decode" : "prefill", i_am_prefill ? "prefill" : "decode",
                    i_am_prefill ? "decode" : "prefill"));
  }
  const Topology& prefill = i_am_prefill ? *own_ : peer;
  const Topology& decode = i_am_prefill ? peer : *own_;
  auto links = compute_links(prefill, decode);
  if (!links.is_ok()) {
    return links.status().with_context(
        fmt::format("{} cannot exchange KV with engine '{}'", self_.engine_id, engine.first));
  }
  PeerEngine out;
  out.notices = engine_notices(prefill, decode, *links);
  out.links = std::move(links).value();
  out.topology = std::move(peer);
  return out;
}

void TopologyLookups::finish(const EngineKey& engine, Result<PeerEngine> result) {
  auto it = lookups_.find(engine);
  if (it == lookups_.end()) return;
  --pending_;
  std::vector<Done> waiting = std::move(it->second.waiting);
  if (result.is_ok()) {
    it->second.ready = true;
    it->second.engine = std::move(result).value();
    for (Done& done : waiting) done(&it->second.engine);
    return;
  }
  lookups_.erase(it);  // not cached: the next want() looks again
  for (Done& done : waiting) done(result.status());
}

void TopologyLookups::forget_peer(const std::string& peer_key) {
  for (auto it = lookups_.begin(); it != lookups_.end();) {
    bool stale = false;
    for (const auto& r : it->second.engine.topology.ranks) {
      stale |= PeerRegistry::key_of(r) == peer_key;
    }
    // Only answers: a lookup in flight still has waiters to answer.
    it = stale && it->second.ready ? lookups_.erase(it) : std::next(it);
  }
}

void TopologyLookups::stop() { stopped_ = true; }

std::string TopologyLookups::last_answer(const EngineKey& engine) const {
  const auto it = lookups_.find(engine);
  return it == lookups_.end() || it->second.ready ? "" : it->second.last_answer;
}

}  // namespace pdkv::engine

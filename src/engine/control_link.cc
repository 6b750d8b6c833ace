#include "engine/control_link.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <mutex>

#include "engine/control_service.h"
#include "security/grpc_security.h"

namespace pdkv::engine {
namespace {

constexpr auto kRetryRefused = std::chrono::milliseconds(50);
// The most report bytes in one ReportStatuses call: a quarter of what gRPC
// receives in one message by default (4 MiB), so that reports with long
// reasons never make a call the peer refuses whole.
constexpr size_t kMaxReportBytesPerCall = 1 << 20;

// gRPC orders a reactor's construction before the callbacks it runs on
// threads of its own, but inside its core, where tools (ThreadSanitizer)
// cannot see it: this lock, taken after construction and at the top of each
// callback, states the order where they can.
std::mutex& reactor_order() {
  static std::mutex mu;
  return mu;
}
void ordered_after_construction() { std::lock_guard lock(reactor_order()); }

// What is left of the earliest deadline, at least 1 ms (a deadline already
// passed still makes a call, which gRPC ends as DEADLINE_EXCEEDED).
std::chrono::milliseconds time_left(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

// Item `i`'s answer in a ReportStatuses reply: the call's status when the
// call failed, else the item's own code and message.
grpc::Status item_status(const grpc::Status& call, const proto::ControlReplies& reply, int i,
                         int items, const std::string& peer) {
  if (!call.ok()) return call;
  if (reply.items_size() != items) {
    return {grpc::StatusCode::INTERNAL,
            fmt::format("{} answered {} of {} reports", peer, reply.items_size(), items)};
  }
  const proto::ItemReply& item = reply.items(i);
  if (item.code() > static_cast<uint32_t>(grpc::StatusCode::UNAUTHENTICATED)) {
    return {grpc::StatusCode::INTERNAL,
            fmt::format("{} answered report {} with unknown code {}", peer, i, item.code())};
  }
  return {static_cast<grpc::StatusCode>(item.code()), item.message()};
}

std::shared_ptr<grpc::Channel> control_channel(const std::string& address,
                                               std::chrono::milliseconds keepalive,
                                               const Security& security) {
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
  return security::make_channel(address, args, security);
}

}  // namespace

// The client end of one Watch stream, made on the loop's thread. Its events
// reach the link through the loop, if the link still exists then; when gRPC
// is done with it (OnDone), the loop deletes it too, on the thread that made
// it (shutdown stops the loop only after every OnDone has posted).
class ControlLink::WatchStream final
    : public grpc::ClientBidiReactor<proto::Heartbeat, proto::Heartbeat> {
 public:
  WatchStream(std::weak_ptr<ControlLink> link, EventLoop& loop, CallTracker& tracker,
              CallTracker::Group group, proto::Control::Stub& stub, const proto::RankRef& self)
      : link_(std::move(link)), loop_(loop), tracker_(tracker) {
    // Not wait-for-ready: a peer that refuses must be seen refusing.
    ctx_->set_wait_for_ready(false);
    hello_.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
    *hello_.mutable_from() = self;
    call_ = tracker_.begin(group, ctx_, CallTracker::Kind::kStream);
    ordered_after_construction();
    stub.async()->Watch(ctx_.get(), this);
    StartRead(&in_);
    StartWrite(&hello_);
    StartCall();
  }

  void OnReadInitialMetadataDone(bool ok) override {
    ordered_after_construction();
    if (!ok) return;  // OnDone follows
    up_ = true;
    post([](ControlLink& l) { l.on_stream_up(); });
  }
  void OnReadDone(bool ok) override {
    ordered_after_construction();
    if (ok) StartRead(&in_);  // the peer sends nothing; keep the stream open
  }
  void OnDone(const grpc::Status& status) override {
    ordered_after_construction();
    CallTracker& tracker = tracker_;
    const uint64_t call = call_;
    loop_.post(
        [link = link_, status, was_up = up_.load(), self = std::shared_ptr<WatchStream>(this)] {
          if (auto l = link.lock()) l->on_stream_done(status, was_up);
        });
    // Last: until now shutdown waits, with the loop running, for this post.
    tracker.end(call);
  }

 private:
  template <typename F>
  void post(F&& f) {
    loop_.post([link = link_, f = std::forward<F>(f)] {
      if (auto l = link.lock()) f(*l);
    });
  }

  const std::weak_ptr<ControlLink> link_;
  EventLoop& loop_;
  CallTracker& tracker_;
  std::shared_ptr<grpc::ClientContext> ctx_ = std::make_shared<grpc::ClientContext>();
  proto::Heartbeat hello_, in_;
  uint64_t call_ = 0;
  std::atomic<bool> up_{false};
};

ControlLink::ControlLink(EventLoop& loop, CallTracker& tracker, std::string address,
                         std::string name, proto::RankRef self, const Security& security,
                         std::chrono::milliseconds keepalive,
                         std::chrono::milliseconds connect_timeout, Events events)
    : loop_(loop),
      tracker_(tracker),
      address_(std::move(address)),
      name_(std::move(name)),
      self_(std::move(self)),
      keepalive_(keepalive),
      connect_timeout_(connect_timeout),
      events_(std::move(events)),
      group_(new_call_group()),
      channel_(control_channel(address_, keepalive, security)),
      stub_(proto::Control::NewStub(channel_)) {}

ControlLink::~ControlLink() { stop(); }

void ControlLink::start() {
  if (state_ != State::kIdle) return;
  state_ = State::kConnecting;
  connect_deadline_ = Clock::now() + connect_timeout_;
  std::weak_ptr<ControlLink> self = weak_from_this();
  connect_timer_ = loop_.at(connect_deadline_, [self] {
    auto l = self.lock();
    if (!l || l->state_ != State::kConnecting) return;
    l->declare_lost(Status::unavailable(fmt::format("control connection to {} lost: cannot "
                                                    "connect within {} ms",
                                                    l->name_, l->connect_timeout_.count())),
                    /*cancel_calls=*/true);
  });
  open_stream();
}

void ControlLink::stop() {
  if (state_ == State::kStopped) return;
  state_ = State::kStopped;
  loop_.cancel(retry_timer_);
  loop_.cancel(connect_timer_);
  tracker_.cancel(group_);
}

void ControlLink::open_stream() {
  retry_timer_ = 0;
  if (state_ != State::kConnecting) return;
  new WatchStream(weak_from_this(), loop_, tracker_, group_, *stub_, self_);  // owns itself
}

void ControlLink::on_stream_up() {
  if (state_ != State::kConnecting) return;
  state_ = State::kUp;
  loop_.cancel(connect_timer_);
  connect_timer_ = 0;
  if (events_.up) events_.up();
}

void ControlLink::on_stream_done(const grpc::Status& s, bool was_up) {
  if (state_ == State::kLost || state_ == State::kStopped) return;
  if (!was_up) {
    // An attempt to connect ended. A peer that keeps refusing (its process
    // is gone) is dead after one keepalive period of refusals; one that
    // answers but will not watch (another protocol version) at once.
    const auto now = Clock::now();
    std::string why;
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE) {
      why = fmt::format("the peer refused the stream: {}", s.error_message());
    } else if (!refused_since_) {
      refused_since_ = now;
    }
    if (why.empty() && now - *refused_since_ >= keepalive_) {
      why = fmt::format("unreachable for {} ms", keepalive_.count());
    }
    if (why.empty() && now + kRetryRefused >= connect_deadline_) {
      why = fmt::format("cannot connect within {} ms", connect_timeout_.count());
    }
    if (!why.empty()) {
      declare_lost(
          Status::unavailable(fmt::format("control connection to {} lost: {}", name_, why)),
          /*cancel_calls=*/true);
      return;
    }
    std::weak_ptr<ControlLink> self = weak_from_this();
    retry_timer_ = loop_.after(kRetryRefused, [self] {
      if (auto l = self.lock()) l->open_stream();
    });
    return;
  }
  // A peer shutting down ends the stream itself (OK or CANCELLED): replies
  // it already decided are still on their way, so calls in flight finish on
  // their own. Any other end (reset, keepalive timeout) is a death.
  const bool leaving = s.ok() || s.error_code() == grpc::StatusCode::CANCELLED;
  declare_lost(Status::unavailable(fmt::format("control connection to {} lost: {}", name_,
                                               s.ok() ? "the peer closed it" : s.error_message())),
               /*cancel_calls=*/!leaving);
}

void ControlLink::declare_lost(const Status& reason, bool cancel_calls) {
  // A peer leaving in good order still answers calls: reports made before
  // it left go out, as calls of their own would have gone already.
  if (!cancel_calls) flush_reports();
  state_ = State::kLost;
  loop_.cancel(retry_timer_);
  loop_.cancel(connect_timer_);
  retry_timer_ = connect_timer_ = 0;
  if (cancel_calls) tracker_.cancel(group_);
  if (events_.lost) events_.lost(reason);
}

template <typename Request, typename Reply>
void ControlLink::call(Request request, std::chrono::milliseconds timeout,
                       const UnaryLaunch<Request, Reply>& launch,
                       std::function<void(const grpc::Status&, const Reply&)> done) {
  if (state_ == State::kLost || state_ == State::kStopped) {
    loop_.post([done = std::move(done), name = name_] {
      done({grpc::StatusCode::UNAVAILABLE, fmt::format("control connection to {} is lost", name)},
           Reply{});
    });
    return;
  }
  start_unary<Request, Reply>(loop_, tracker_, group_, timeout, /*wait_for_ready=*/true,
                              std::move(request), launch, std::move(done));
}

template <typename Request>
void ControlLink::call(Request request, std::chrono::milliseconds timeout,
                       const UnaryLaunch<Request, proto::ControlReply>& launch, Done done) {
  call<Request, proto::ControlReply>(
      std::move(request), timeout, launch,
      [done = std::move(done)](const grpc::Status& s, const proto::ControlReply&) { done(s); });
}

void ControlLink::send_transfer_info(proto::TransferInfo info, std::chrono::milliseconds timeout,
                                     Done done) {
  call<proto::TransferInfo>(
      std::move(info), timeout,
      [stub = stub_.get()](auto* ctx, auto* req, auto* rep, auto cb) {
        stub->async()->SendTransferInfo(ctx, req, rep, std::move(cb));
      },
      std::move(done));
}

void ControlLink::report_status(proto::RoomStatus status, std::chrono::milliseconds timeout,
                                Done done) {
  reports_.push_back({std::move(status), Clock::now() + timeout, std::move(done)});
  if (std::exchange(flush_posted_, true)) return;
  loop_.post([self = shared_from_this()] { self->flush_reports(); });
}

void ControlLink::flush_reports() {
  flush_posted_ = false;
  std::vector<PendingReport> ready = std::exchange(reports_, {});
  std::span<PendingReport> left(ready);
  while (!left.empty()) {
    // Up to kMaxStatusesPerCall reports and kMaxReportBytesPerCall bytes a
    // call (a long reason travels alone), at least one.
    size_t n = 1, bytes = left[0].status.ByteSizeLong();
    while (n < left.size() && n < static_cast<size_t>(kMaxStatusesPerCall)) {
      bytes += left[n].status.ByteSizeLong();
      if (bytes > kMaxReportBytesPerCall) break;
      ++n;
    }
    send_reports(left.first(n));
    left = left.subspan(n);
  }
}

void ControlLink::send_reports(std::span<PendingReport> reports) {
  auto earliest = std::min_element(reports.begin(), reports.end(),
                                   [](auto& a, auto& b) { return a.deadline < b.deadline; });
  const std::chrono::milliseconds timeout = time_left(earliest->deadline);
  if (reports.size() == 1) {
    return call<proto::RoomStatus>(
        std::move(reports[0].status), timeout,
        [stub = stub_.get()](auto* ctx, auto* req, auto* rep, auto cb) {
          stub->async()->ReportStatus(ctx, req, rep, std::move(cb));
        },
        std::move(reports[0].done));
  }
  proto::RoomStatuses batch;
  batch.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  std::vector<Done> dones;
  for (PendingReport& r : reports) {
    *batch.add_statuses() = std::move(r.status);
    dones.push_back(std::move(r.done));
  }
  call<proto::RoomStatuses, proto::ControlReplies>(
      std::move(batch), timeout,
      [stub = stub_.get()](auto* ctx, auto* req, auto* rep, auto cb) {
        stub->async()->ReportStatuses(ctx, req, rep, std::move(cb));
      },
      [dones = std::move(dones), peer = name_](const grpc::Status& s,
                                               const proto::ControlReplies& reply) {
        const int items = static_cast<int>(dones.size());
        for (int i = 0; i < items; ++i) dones[i](item_status(s, reply, i, items, peer));
      });
}

void ControlLink::abort_room(proto::AbortRequest request, std::chrono::milliseconds timeout,
                             Done done) {
  call<proto::AbortRequest>(
      std::move(request), timeout,
      [stub = stub_.get()](auto* ctx, auto* req, auto* rep, auto cb) {
        stub->async()->AbortRoom(ctx, req, rep, std::move(cb));
      },
      std::move(done));
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

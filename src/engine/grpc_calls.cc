#include "engine/grpc_calls.h"

#include <atomic>

#include <vector>

namespace pdkv::engine {

CallTracker::Group new_call_group() {
  static std::atomic<CallTracker::Group> next{1};
  return next.fetch_add(1);
}

uint64_t CallTracker::begin(Group group, std::weak_ptr<grpc::ClientContext> ctx, Kind kind) {
  std::lock_guard lock(mu_);
  const uint64_t id = next_++;
  calls_.emplace(id, Entry{group, std::move(ctx), kind});
  return id;
}

void CallTracker::end(uint64_t call) {
  std::lock_guard lock(mu_);
  calls_.erase(call);
  idle_.notify_all();
}

bool CallTracker::idle(std::optional<Kind> kind) const {
  if (!kind) return calls_.empty();
  for (const auto& [id, e] : calls_) {
    if (e.kind == *kind) return false;
  }
  return true;
}

void CallTracker::cancel(Group group) {
  cancel_if([group](const Entry& e) { return e.group == group; });
}

void CallTracker::cancel_all() {
  cancel_if([](const Entry&) { return true; });
}

void CallTracker::cancel_if(const std::function<bool(const Entry&)>& pick) {
  std::vector<std::shared_ptr<grpc::ClientContext>> picked;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, e] : calls_) {
      if (!pick(e)) continue;
      if (auto ctx = e.ctx.lock()) picked.push_back(std::move(ctx));
    }
  }
  // Outside the lock: the strong references keep each context alive even if
  // its call completes meanwhile.
  for (auto& ctx : picked) ctx->TryCancel();
}

bool CallTracker::wait_idle(std::chrono::milliseconds limit, std::optional<Kind> kind) {
  std::unique_lock lock(mu_);
  return idle_.wait_for(lock, limit, [&] { return idle(kind); });
}

size_t CallTracker::in_flight() const {
  std::lock_guard lock(mu_);
  return calls_.size();
}

}  // namespace pdkv::engine

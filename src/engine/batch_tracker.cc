#include "engine/batch_tracker.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace pdkv::engine {

void BatchTracker::add(BatchId batch, Ended ended, Failing failing) {
  batches_.emplace(batch, Tracked{std::move(ended), std::move(failing)});
  backoff_ = kFirstPoll;
  if (timer_ != 0) return;
  // Announced ends need no poll now; otherwise the next iteration: many
  // complete at once.
  arm(events_ ? std::chrono::microseconds(kBackstopPoll) : std::chrono::microseconds(0));
}

void BatchTracker::on_batch_end_event() {
  if (!batches_.empty()) poll_all();
}

void BatchTracker::arm(std::chrono::microseconds delay) {
  timer_ = loop_.after(delay, [this] {
    timer_ = 0;
    poll_all();
  });
}

void BatchTracker::poll_all() {
  std::vector<std::pair<Ended, BatchStatus>> ended;
  std::vector<std::pair<Failing, Status>> failing;
  for (auto it = batches_.begin(); it != batches_.end();) {
    BatchStatus status = transport_.poll(it->first);
    if (status.state == BatchState::kInProgress) {
      if (!status.error.is_ok() && it->second.failing) {
        failing.emplace_back(std::exchange(it->second.failing, {}), std::move(status.error));
      }
      ++it;
      continue;
    }
    ended.emplace_back(std::move(it->second.ended), std::move(status));
    it = batches_.erase(it);
  }
  // After the scan: a callback may post new batches.
  backoff_ = ended.empty() ? std::min(backoff_ * 2, kMaxPoll) : kFirstPoll;
  for (auto& [callback, error] : failing) callback(error);
  for (auto& [callback, status] : ended) callback(status);
  if (batches_.empty() || timer_ != 0) return;
  arm(events_ ? std::chrono::microseconds(kBackstopPoll) : backoff_);
}

}  // namespace pdkv::engine

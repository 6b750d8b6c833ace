// A backend's side of Transport::set_batch_end_callback: the caller's
// callback, and whether a batch ended since it last ran.
//
// A backend marks when it ends a batch (any thread, under its own locks: an
// atomic store), and announces from one of its threads at a point where it
// holds none of its locks (after the lock scope that ended the batch, or
// after a progress pass). Marks between two announcements call the callback
// once: the caller polls every batch it has in flight anyway.
//
// Thread-safety: every member from any thread; the callback runs on the
// announcing thread, with only this helper's own lock released first.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>

#include "pdkv/transport.h"

namespace pdkv {

class BatchEndSignal {
 public:
  void set(Transport::BatchEndCallback callback) {
    auto shared = std::make_shared<const Transport::BatchEndCallback>(std::move(callback));
    std::lock_guard lock(mu_);
    callback_ = std::move(shared);
  }
  void mark() { marked_.store(true, std::memory_order_release); }
  // Runs the callback if a batch ended since the last announcement.
  void announce() {
    if (!marked_.exchange(false, std::memory_order_acq_rel)) return;
    std::shared_ptr<const Transport::BatchEndCallback> callback;
    {
      std::lock_guard lock(mu_);
      callback = callback_;
    }
    if (callback && *callback) (*callback)();
  }

 private:
  std::atomic<bool> marked_{false};
  std::mutex mu_;  // guards callback_: set once, copied by each announcement
  std::shared_ptr<const Transport::BatchEndCallback> callback_;
};

}  // namespace pdkv

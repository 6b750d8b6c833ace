// A backend's side of a Transport callback that says something happened,
// not what (set_batch_end_callback: a batch ended; set_notification_callback:
// a notification arrived): the caller's callback, and whether the event
// happened since it last ran.
//
// A backend marks when the event happens (any thread, under its own locks:
// an atomic store), and announces from one of its threads at a point where
// it holds none of its locks (after the lock scope that ended the batch or
// queued the notification, or after a progress pass). Marks between two
// announcements call the callback once: the caller looks at everything
// (polls every batch in flight, takes every notification) anyway.
//
// Thread-safety: every member from any thread; the callback runs on the
// announcing thread, with only this helper's own lock released first.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>

#include "pdkv/transport.h"

namespace pdkv {

class TransportSignal {
 public:
  void set(Transport::EventCallback callback) {
    auto shared = std::make_shared<const Transport::EventCallback>(std::move(callback));
    std::lock_guard lock(mu_);
    callback_ = std::move(shared);
  }
  void mark() { marked_.store(true, std::memory_order_release); }
  // Runs the callback if the event happened since the last announcement.
  void announce() {
    if (!marked_.exchange(false, std::memory_order_acq_rel)) return;
    std::shared_ptr<const Transport::EventCallback> callback;
    {
      std::lock_guard lock(mu_);
      callback = callback_;
    }
    if (callback && *callback) (*callback)();
  }

 private:
  std::atomic<bool> marked_{false};
  std::mutex mu_;  // guards callback_: set once, copied by each announcement
  std::shared_ptr<const Transport::EventCallback> callback_;
};

}  // namespace pdkv

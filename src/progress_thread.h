// The progress thread of a backend whose transport library wants one thread
// to own it (a UCX worker in UCS_THREAD_MODE_SINGLE, libfabric endpoints in
// manual progress): every call into the library runs there.
//
// Who runs what:
//  - API threads hand it work with post() (fire and forget) or run() (wait
//    for the result). run() on the progress thread itself would wait for
//    itself forever: it refuses, with kFailedPrecondition, instead.
//  - The thread runs, in turn and with no lock of its own held: the tasks
//    queued, one pass of the backend's progress function, and the peer
//    failures reported since (PeerFailures). A backend therefore never calls
//    its user back while it holds its own lock, and a callback may call into
//    the backend again (post() from it is always safe).
//  - Nothing in flight and no task queued, it sleeps: on its condition
//    variable, or in the backend's own sleep (a poll on the library's file
//    descriptors), for a short tick, because libraries on manual progress
//    move what arrives unasked (inbound bytes, keepalives) only when polled.
//    After any activity it ticks faster for a while, so that a transfer is
//    not held up by a sleeping target.
//
// Locks: the helper's own mutex guards only its queue; it is never held
// while anything else runs, so a backend may post() under its own lock.
//
// A thread stuck for good inside a library call (mori: libfabric 1.17's shm
// provider spinning on a lock that a killed peer held) can be abandoned:
// its queue is dropped, later post()s and run()s are refused, run()s
// waiting are answered, and stop() no longer waits for it. Its owner keeps
// alive whatever the stuck call may still touch. The driver's `stuck`
// check, asked by whoever waits on the thread, is what decides it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>

#include "pdkv/status.h"

namespace pdkv {

class ProgressThread {
 public:
  struct Driver {
    // One pass over the library's progress, on the progress thread; true
    // when it did something (a completion, inbound traffic).
    std::function<bool()> progress;
    // Whether operations are in flight: the thread polls instead of sleeping.
    std::function<bool()> busy;
    // Optional: sleeps at most `limit`, returning early once wake() is
    // called; for libraries with file descriptors worth waiting on.
    std::function<void(std::chrono::microseconds limit)> sleep;
    std::function<void()> wake;  // with `sleep`
    std::chrono::microseconds idle_tick{2000}, hot_tick{50}, hot_window{5000};
    // Optional: asked every 100 ms by a caller that waits for the thread
    // (run(), stop()); true once the thread is stuck for good, and then it
    // is abandoned. Runs on the caller's thread, no lock of this helper held.
    std::function<bool()> stuck;
  };

  explicit ProgressThread(std::string name) : name_(std::move(name)) {}
  ~ProgressThread() { stop(); }
  ProgressThread(const ProgressThread&) = delete;
  ProgressThread& operator=(const ProgressThread&) = delete;

  void start(Driver driver);
  // Runs what is queued, lets what is in flight finish (busy() false, or
  // `drain_limit` passed), then joins. Later post()s are dropped, later
  // run()s answer kAborted. False when the thread was abandoned, before or
  // as stop() waited for it (the driver's `stuck` check said so).
  bool stop(std::chrono::milliseconds drain_limit = std::chrono::seconds(2));

  // Gives the thread up (see above); the tasks queued are dropped unrun.
  // For the owner only, once it knows the thread cannot come back.
  void abandon();
  bool abandoned() const;

  bool on_this_thread() const { return std::this_thread::get_id() == id_; }
  // Queues `task`; false (and it is dropped) once stopping or abandoned.
  bool post(std::function<void()> task);

  // Runs `task` on the progress thread and returns its result: a Status or a
  // Result<T>, so that refusals can be answered in the same type.
  template <typename F>
  auto run(F&& task) -> decltype(task()) {
    using R = decltype(task());
    static_assert(std::is_constructible_v<R, Status>, "run() tasks return Status or Result<T>");
    if (on_this_thread()) {
      return R(Status::failed_precondition(
          name_ + ": run() called on its own progress thread (it would wait for itself)"));
    }
    std::packaged_task<R()> job(std::forward<F>(task));
    auto result = job.get_future();
    if (!post([&job] { job(); })) return R(refusal());
    // Woken now and then to see whether the thread was abandoned meanwhile
    // (its queue, with this job, is then dropped unrun).
    while (result.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
      if (given_up()) return R(refusal());
    }
    return result.get();
  }

 private:
  void loop();
  bool given_up();  // abandoned, or now found stuck (and abandoned)
  Status refusal() const;

  const std::string name_;
  Driver driver_;
  std::thread::id id_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  bool abandoned_ = false;
  std::chrono::steady_clock::time_point drain_until_;  // set before stopping_
  std::promise<void> exited_;                          // set by the thread as it leaves its loop
  std::future<void> left_loop_;
  std::thread thread_;
};

// The failures of a backend's peers, each reported once: the record of
// which peers failed and why (later writes to them are refused with that
// reason), and the delivery of the user's callback on the progress thread,
// with no backend lock held (or, once that thread is abandoned, by its
// owner: deliver_pending()). Its delivery tasks point at it: the thread
// must be stopped (or abandoned) before it goes. The record keeps the most recent kKept
// failures, so that it does not grow with every peer a long-lived process
// ever lost; peers' keys are never reused unless the backend says so
// (forget()).
template <typename PeerKey>
class PeerFailures {
 public:
  using Callback = std::function<void(const PeerKey& peer, const Status& reason)>;
  static constexpr size_t kKept = 4096;

  explicit PeerFailures(ProgressThread& thread) : thread_(thread) {}

  void set_callback(Callback callback) {
    std::lock_guard lock(mu_);
    callback_ = std::make_shared<Callback>(std::move(callback));
  }
  // Records the first failure of `peer` and queues its report; false when
  // it had failed already (nothing is reported again).
  bool report(const PeerKey& peer, const Status& reason) {
    std::shared_ptr<Callback> callback;
    {
      std::lock_guard lock(mu_);
      if (!failed_.emplace(peer, reason).second) return false;
      order_.push_back(peer);
      if (order_.size() > kKept) {
        failed_.erase(order_.front());
        order_.pop_front();
      }
      callback = callback_;
      if (callback && *callback) pending_.push_back({callback, peer, reason});
    }
    if (callback && *callback) thread_.post([this] { deliver_pending(); });
    return true;
  }
  // Runs the callback for each failure reported and not yet delivered, on
  // the calling thread: the progress thread, or the owner of an abandoned
  // one, with no backend lock held.
  void deliver_pending() {
    std::deque<Pending> due;
    {
      std::lock_guard lock(mu_);
      due.swap(pending_);
    }
    for (const auto& p : due) (*p.callback)(p.peer, p.reason);
  }
  std::optional<Status> failure(const PeerKey& peer) const {
    std::lock_guard lock(mu_);
    auto it = failed_.find(peer);
    if (it == failed_.end()) return std::nullopt;
    return it->second;
  }
  // The key names a new peer from now on (mori: an engine registered again).
  void forget(const PeerKey& peer) {
    std::lock_guard lock(mu_);
    if (failed_.erase(peer) == 0) return;
    std::erase(order_, peer);
  }

 private:
  ProgressThread& thread_;
  mutable std::mutex mu_;
  std::shared_ptr<Callback> callback_;
  std::map<PeerKey, Status> failed_;
  std::deque<PeerKey> order_;  // oldest first
  // Reported, not yet delivered, each with the callback set when it was.
  struct Pending {
    std::shared_ptr<Callback> callback;
    PeerKey peer;
    Status reason;
  };
  std::deque<Pending> pending_;
};

}  // namespace pdkv

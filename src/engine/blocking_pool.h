// A fixed set of threads for the few calls that block and cannot be made
// asynchronous (Transport::connect), and for copies of gigabytes (a staged
// route's gather and scatter): they run here, so that the loop never waits
// on a peer or on memory, and hand their outcome back with EventLoop::post.
// The number of threads is fixed at construction, whatever the number of
// peers or rooms.
//
// Thread-safety: run() from any thread; stop() once, not from a pool thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace pdkv::engine {

class BlockingPool {
 public:
  BlockingPool(std::string name, size_t threads);
  ~BlockingPool();  // stop()

  // Queues `job`; jobs not started when stop() is called are dropped.
  void run(std::function<void()> job);
  // Waits for the jobs running now, drops the rest, joins the threads.
  void stop();
  size_t threads() const { return threads_.size(); }

 private:
  void work();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace pdkv::engine

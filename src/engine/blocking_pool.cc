#include "engine/blocking_pool.h"

#include <pthread.h>

namespace pdkv::engine {

BlockingPool::BlockingPool(std::string name, size_t threads) {
  for (size_t i = 0; i < threads; ++i) {
    threads_.emplace_back([this, name] {
      pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
      work();
    });
  }
}

BlockingPool::~BlockingPool() { stop(); }

void BlockingPool::run(std::function<void()> job) {
  std::lock_guard lock(mu_);
  if (stopping_) return;
  jobs_.push_back(std::move(job));
  cv_.notify_one();
}

void BlockingPool::stop() {
  std::deque<std::function<void()>> dropped;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    dropped.swap(jobs_);
    cv_.notify_all();
  }
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void BlockingPool::work() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
    if (stopping_) return;
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    job();
    job = nullptr;
    lock.lock();
  }
}

}  // namespace pdkv::engine

// Storage kept from one batch for the next: the lists a batch is built
// from (its ops, a transport's requests) are megabytes for a long request
// written directly (65,536 ops of 512 bytes each for 1k tokens of
// llama3-8b at 2 -> 4). Freed after each batch, glibc hands such blocks back
// to the kernel (an arena's top is trimmed past 128 KiB), and the next batch
// faults every page in again: that cost more than building the list (the
// engine's loop spent half its time so; with UCX's hooks on the unmapping,
// more). A SpareVectors keeps a few lists, emptied but with their
// capacity, for the next take().
//
// Thread-safety: any thread (one lock, held only to move a vector in or out).
#pragma once

#include <cstddef>
#include <mutex>
#include <utility>
#include <vector>

namespace pdkv {

template <typename T>
class SpareVectors {
 public:
  // Kept at most: enough lists for the batches in flight at once, and
  // kMaxKeptBytes of storage in all, so that a burst of long requests does
  // not leave the process holding hundreds of MiB; a list that does not fit
  // (a 32k-token request's) is freed, since its copying outweighs its faults.
  static constexpr size_t kMaxKept = 4;
  static constexpr size_t kMaxKeptBytes = size_t{64} << 20;

  // A vector taken for one scope, given back as the scope ends.
  class Lease {
   public:
    explicit Lease(SpareVectors& from) : from_(from), v_(from.take()) {}
    ~Lease() { from_.give_back(std::move(v_)); }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    std::vector<T>& operator*() { return v_; }
    std::vector<T>* operator->() { return &v_; }

   private:
    SpareVectors& from_;
    std::vector<T> v_;
  };

  // An empty vector: a kept one (with its capacity) if there is one.
  std::vector<T> take() {
    std::lock_guard lock(mu_);
    if (kept_.empty()) return {};
    std::vector<T> v = std::move(kept_.back());
    kept_.pop_back();
    kept_bytes_ -= v.capacity() * sizeof(T);
    return v;
  }

  // Empties `v` and keeps it for a later take(), unless it does not fit.
  void give_back(std::vector<T>&& v) {
    v.clear();
    const size_t bytes = v.capacity() * sizeof(T);
    if (bytes == 0 || bytes > kMaxKeptBytes) return;
    std::vector<T> dropped;  // freed outside the lock
    std::lock_guard lock(mu_);
    if (kept_.size() < kMaxKept && kept_bytes_ + bytes <= kMaxKeptBytes) {
      kept_bytes_ += bytes;
      kept_.push_back(std::move(v));
    } else {
      dropped = std::move(v);
    }
  }

 private:
  std::mutex mu_;
  std::vector<std::vector<T>> kept_;
  size_t kept_bytes_ = 0;  // the storage of kept_'s lists
};

}  // namespace pdkv

// Holds up whichever thread first touches one page of memory, until the test
// lets it go: the kernel's userfaultfd, so that no hook in the code under
// test is needed. The page's bytes are kept and put back on release(); the
// thread that touched it then carries on as if nothing happened.
//
// For a test that must hold a copy (a gather, a scatter) in the middle and
// look at what the rest of the engine does meanwhile.
//
// Thread-safety: one test thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace pdkv::testing {

class PageStall {
 public:
  // Stalls the first whole page at or after `inside`, which must lie, with
  // that page, in private anonymous memory (a heap buffer of a few pages
  // or more). error() says why when it could not be set up.
  explicit PageStall(const void* inside);
  ~PageStall();  // release()
  PageStall(const PageStall&) = delete;
  PageStall& operator=(const PageStall&) = delete;

  const std::string& error() const { return error_; }
  // The kernel or its policy (a seccomp profile) allows no userfaultfd here.
  bool unavailable() const { return unavailable_; }
  // The first byte of the stalled page.
  const std::byte* page() const { return page_; }
  // Waits up to `limit` for a thread to touch the page; its thread id, once
  // one is held there.
  std::optional<pid_t> wait_for_touch(std::chrono::milliseconds limit);
  // Puts the page's bytes back and lets the held thread (if any) go on.
  void release();

 private:
  int fd_ = -1;
  std::byte* page_ = nullptr;
  std::vector<std::byte> saved_;
  std::string error_;
  bool unavailable_ = false;
};

// The name a thread of this process gave itself (/proc/self/task/TID/comm).
std::string thread_name(pid_t tid);

}  // namespace pdkv::testing

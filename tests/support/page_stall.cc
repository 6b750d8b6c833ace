#include "support/page_stall.h"

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

namespace pdkv::testing {
namespace {

std::string failed(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

}  // namespace

PageStall::PageStall(const void* inside) {
  const auto size = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto at = (reinterpret_cast<uintptr_t>(inside) + size - 1) / size * size;
  page_ = reinterpret_cast<std::byte*>(at);
  saved_.assign(page_, page_ + size);
  // User-mode faults are all a copy makes, and all that an unprivileged
  // process may catch (vm.unprivileged_userfaultfd = 0); a kernel before 5.11
  // knows no such flag.
  fd_ = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY));
  if (fd_ < 0 && errno == EINVAL)
    fd_ = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
  if (fd_ < 0) {
    unavailable_ = true;
    error_ = failed("userfaultfd");
    return;
  }
  uffdio_api api{};
  api.api = UFFD_API;
  api.features = UFFD_FEATURE_THREAD_ID;  // who touched it
  if (ioctl(fd_, UFFDIO_API, &api) != 0) {
    error_ = failed("UFFDIO_API");
    return;
  }
  // The page goes (private anonymous memory reads back as missing), and its
  // next touch waits for us.
  if (madvise(page_, size, MADV_DONTNEED) != 0) {
    error_ = failed("madvise(MADV_DONTNEED)");
    return;
  }
  uffdio_register reg{};
  reg.range = {at, size};
  reg.mode = UFFDIO_REGISTER_MODE_MISSING;
  if (ioctl(fd_, UFFDIO_REGISTER, &reg) != 0) {
    error_ = failed("UFFDIO_REGISTER");
    release();  // the bytes back, at least
  }
}

PageStall::~PageStall() { release(); }

std::optional<pid_t> PageStall::wait_for_touch(std::chrono::milliseconds limit) {
  if (fd_ < 0) return std::nullopt;
  pollfd p{fd_, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(limit.count())) != 1) return std::nullopt;
  uffd_msg msg{};
  if (read(fd_, &msg, sizeof msg) != static_cast<ssize_t>(sizeof msg) ||
      msg.event != UFFD_EVENT_PAGEFAULT) {
    return std::nullopt;
  }
  return static_cast<pid_t>(msg.arg.pagefault.feat.ptid);
}

void PageStall::release() {
  if (page_ == nullptr) return;
  if (fd_ >= 0) {
    // Fills the page with its old bytes and wakes whoever waits on it.
    uffdio_copy copy{};
    copy.dst = reinterpret_cast<uintptr_t>(page_);
    copy.src = reinterpret_cast<uintptr_t>(saved_.data());
    copy.len = saved_.size();
    if (ioctl(fd_, UFFDIO_COPY, &copy) != 0 && errno != EEXIST) {
      // Not registered (setup failed part-way): plain stores do.
      std::memcpy(page_, saved_.data(), saved_.size());
    }
    close(fd_);  // unregisters the range
    fd_ = -1;
  } else {
    std::memcpy(page_, saved_.data(), saved_.size());
  }
  page_ = nullptr;
}

std::string thread_name(pid_t tid) {
  std::ifstream comm("/proc/self/task/" + std::to_string(tid) + "/comm");
  std::string name;
  std::getline(comm, name);
  return name;
}

}  // namespace pdkv::testing

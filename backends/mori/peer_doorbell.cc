// PeerDoorbell (peer_doorbell.h): taking a peer's eventfd, proving it is the
// one described, and ringing it.
#include "peer_doorbell.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "shared_pool.h"

namespace pdkv::backends::mori {

uint64_t PeerDoorbell::id_of(int fd) {
  const std::string path = fmt::format("/proc/self/fdinfo/{}", fd);
  FILE* info = std::fopen(path.c_str(), "re");
  if (info == nullptr) return 0;
  uint64_t id = 0;
  char line[128];
  while (std::fgets(line, sizeof line, info) != nullptr) {
    unsigned long long value = 0;
    if (std::sscanf(line, "eventfd-id: %llu", &value) == 1) {
      id = value;
      break;
    }
  }
  std::fclose(info);
  return id;
}

Result<std::unique_ptr<PeerDoorbell>> PeerDoorbell::take(int pidfd, int32_t number, uint64_t id) {
  PDKV_ASSIGN_OR_RETURN(const int fd, take_peer_fd(pidfd, number, "doorbell"));
  std::unique_ptr<PeerDoorbell> bell(new PeerDoorbell(fd));  // closes it on every return
  const uint64_t found = id_of(fd);
  if (found == 0) {
    return Status::invalid_argument(fmt::format("its doorbell {} is no eventfd", number));
  }
  if (id == 0 || found != id) {
    return Status::invalid_argument(
        fmt::format("its doorbell {} is eventfd {}, not the eventfd {} its descriptor names",
                    number, found, id));
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || (flags & O_NONBLOCK) == 0) {
    return Status::invalid_argument(
        fmt::format("its doorbell {} would block a ring (no O_NONBLOCK)", number));
  }
  return bell;
}

PeerDoorbell::~PeerDoorbell() { ::close(fd_); }

void PeerDoorbell::ring() const {
  const uint64_t one = 1;
  (void)!::write(fd_, &one, sizeof one);
}

}  // namespace pdkv::backends::mori

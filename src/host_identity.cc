#include "host_identity.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <fstream>

namespace pdkv {

std::string local_host_identity() {
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  struct stat pid_ns {};
  struct stat ipc_ns {};
  if (boot_id.empty() || ::stat("/proc/self/ns/pid", &pid_ns) != 0 ||
      ::stat("/proc/self/ns/ipc", &ipc_ns) != 0) {
    return {};
  }
  return fmt::format("{}/pidns:{}/ipcns:{}", boot_id, pid_ns.st_ino, ipc_ns.st_ino);
}

}  // namespace pdkv

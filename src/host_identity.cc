#include "host_identity.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>

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

uint64_t process_start_time(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Field 22; the command name (field 2) may hold spaces, so count after its ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i == 22) return std::stoull(field);
  }
  return 0;
}

}  // namespace pdkv

#include "cli/parent_watch.h"

#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <string_view>

extern char** environ;

namespace pdkv::cli {

void stop_with_parent() {
  const char* value = std::getenv(kParentPidVariable);
  if (value == nullptr) return;
  const pid_t parent = static_cast<pid_t>(std::strtol(value, nullptr, 10));
  ::unsetenv(kParentPidVariable);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  // The parent may have ended before the request above was made.
  if (::getppid() != parent) std::raise(SIGTERM);
}

std::vector<std::string> child_environment() {
  const std::string_view prefix = kParentPidVariable;
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (entry.size() > prefix.size() && entry.substr(0, prefix.size()) == prefix &&
        entry[prefix.size()] == '=') {
      continue;
    }
    env.emplace_back(entry);
  }
  env.push_back(std::string(kParentPidVariable) + "=" + std::to_string(::getpid()));
  return env;
}

}  // namespace pdkv::cli

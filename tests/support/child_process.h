// A helper process for tests: started with posix_spawn, its stdout read line
// by line, killed (SIGKILL) and reaped when this object goes away.
#pragma once

#include <sys/types.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace pdkv::testing {

class ChildProcess {
 public:
  // argv[0] is the program's path. `extra_env` is added to this process's
  // environment. pid() is -1 when the spawn failed.
  explicit ChildProcess(const std::vector<std::string>& argv,
                        const std::map<std::string, std::string>& extra_env = {});
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // The next line of its stdout without the newline; "" at EOF.
  std::string read_line();
  // Sends SIGKILL and reaps it; idempotent.
  void kill_now();

 private:
  pid_t pid_ = -1;
  FILE* stdout_ = nullptr;
};

// pdkv_backend_peer prints its transport's descriptor in hex; the bytes.
std::string from_hex(const std::string& hex);

}  // namespace pdkv::testing

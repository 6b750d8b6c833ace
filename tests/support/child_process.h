// A helper process for tests: started with posix_spawn, its stdin written
// and its stdout read line by line, killed (SIGKILL) and reaped when this
// object goes away.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
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
  // The next line of its stdout without the newline; "" at EOF or when
  // `limit` passes first.
  std::string read_line(std::chrono::milliseconds limit = std::chrono::seconds(60));
  // A line to its stdin (a newline is added); false if it cannot take it.
  bool write_line(const std::string& line);
  // Sends `sig` (SIGSTOP, SIGCONT, ...).
  void signal(int sig);
  // Reaps it once it exits; its wait status (-1 if there is none).
  int wait();
  // As wait(), for at most `limit`; nullopt (and the process killed and
  // reaped) when it has not exited by then.
  std::optional<int> wait_for(std::chrono::milliseconds limit);
  // Sends SIGKILL and reaps it; idempotent.
  void kill_now();

 private:
  pid_t pid_ = -1;
  int stdin_ = -1, stdout_ = -1;
  std::string buffer_;  // read but not yet returned
};

// pdkv_backend_peer prints its transport's descriptor in hex; the bytes.
std::string from_hex(const std::string& hex);

}  // namespace pdkv::testing

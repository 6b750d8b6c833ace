#include "support/child_process.h"

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace pdkv::testing {

ChildProcess::ChildProcess(const std::vector<std::string>& argv,
                           const std::map<std::string, std::string>& extra_env) {
  int out[2], in[2];
  if (pipe(out) != 0) return;
  if (pipe(in) != 0) {
    close(out[0]);
    close(out[1]);
    return;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  posix_spawn_file_actions_addclose(&actions, in[1]);
  std::vector<std::string> args = argv, env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  for (const auto& [k, v] : extra_env) env.push_back(k + "=" + v);
  std::vector<char*> arg_ptrs, env_ptrs;
  for (auto& a : args) arg_ptrs.push_back(a.data());
  for (auto& e : env) env_ptrs.push_back(e.data());
  arg_ptrs.push_back(nullptr);
  env_ptrs.push_back(nullptr);
  if (posix_spawn(&pid_, args[0].c_str(), &actions, nullptr, arg_ptrs.data(), env_ptrs.data()) !=
      0) {
    pid_ = -1;
  }
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  close(in[0]);
  stdout_ = out[0];
  stdin_ = in[1];
}

ChildProcess::~ChildProcess() {
  kill_now();
  if (stdout_ >= 0) close(stdout_);
  if (stdin_ >= 0) close(stdin_);
}

std::string ChildProcess::read_line(std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (true) {
    const size_t nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    if (stdout_ < 0 || left.count() <= 0) return "";
    pollfd fd{stdout_, POLLIN, 0};
    if (::poll(&fd, 1, static_cast<int>(left.count())) <= 0) continue;
    char chunk[4096];
    const ssize_t n = read(stdout_, chunk, sizeof chunk);
    if (n <= 0) return "";
    buffer_.append(chunk, static_cast<size_t>(n));
  }
}

bool ChildProcess::write_line(const std::string& line) {
  if (stdin_ < 0) return false;
  const std::string bytes = line + "\n";
  return write(stdin_, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size());
}

void ChildProcess::signal(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

int ChildProcess::wait() {
  if (pid_ <= 0) return -1;
  int status = 0;
  if (waitpid(pid_, &status, 0) != pid_) status = -1;
  pid_ = -1;
  return status;
}

std::optional<int> ChildProcess::wait_for(std::chrono::milliseconds limit) {
  if (pid_ <= 0) return -1;
  // A pidfd becomes readable when the process exits: no polling loop.
  const int fd = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
  if (fd >= 0) {
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(limit.count()));
    close(fd);
    if (ready == 0) {
      kill_now();
      return std::nullopt;
    }
  }
  return wait();
}

void ChildProcess::kill_now() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

std::string from_hex(const std::string& hex) {
  std::string bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    bytes.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return bytes;
}

}  // namespace pdkv::testing

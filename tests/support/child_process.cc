#include "support/child_process.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace pdkv::testing {

ChildProcess::ChildProcess(const std::vector<std::string>& argv,
                           const std::map<std::string, std::string>& extra_env) {
  int out[2];
  if (pipe(out) != 0) return;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, out[0]);
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
  stdout_ = fdopen(out[0], "r");
}

ChildProcess::~ChildProcess() {
  kill_now();
  if (stdout_) fclose(stdout_);
}

std::string ChildProcess::read_line() {
  std::string line;
  if (stdout_ == nullptr) return line;
  for (int c; (c = fgetc(stdout_)) != EOF && c != '\n';) line.push_back(static_cast<char>(c));
  return line;
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

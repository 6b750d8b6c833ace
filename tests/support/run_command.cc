#include "support/run_command.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace pdkv::testing {

CommandResult run_command(const std::string& command_line) {
  // stderr goes to a file per call, so parallel tests never share one.
  const std::string err_path =
      ::testing::TempDir() + "pdkv_stderr_" + std::to_string(getpid()) + ".txt";
  const std::string cmd = command_line + " 2>" + err_path;
  CommandResult r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) {
    r.err = "popen failed";
    return r;
  }
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream err(err_path);
  std::stringstream ss;
  ss << err.rdbuf();
  r.err = ss.str();
  std::remove(err_path.c_str());
  return r;
}

}  // namespace pdkv::testing

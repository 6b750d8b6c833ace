// Runs a command line through the shell and captures what a user would see.
#pragma once

#include <string>

namespace pdkv::testing {

struct CommandResult {
  int exit_code = -1;  // -1 when the command did not exit normally
  std::string out;
  std::string err;
};

CommandResult run_command(const std::string& command_line);

}  // namespace pdkv::testing

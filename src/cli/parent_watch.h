// The processes `pdkv run` and `pdkv bench` start end with them. A signal
// that stops only the router (a `kill` of its pid, a supervisor's SIGTERM;
// Ctrl-C reaches the whole process group anyway) would otherwise leave
// its bootstrap and worker processes running, holding ports and memory.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace pdkv::cli {

// The variable that names the starting process to its children.
inline constexpr char kParentPidVariable[] = "PDKV_PARENT_PID";

// In a process started by run_cluster (kParentPidVariable set): asks the
// kernel for SIGTERM when that parent ends, and ends at once if it ended
// already. The variable is removed, so that what this process starts in
// turn does not inherit it. Call first thing in main().
void stop_with_parent();

// This process's environment plus kParentPidVariable naming it, for a child.
std::vector<std::string> child_environment();

}  // namespace pdkv::cli

// Who "this host" is, for backends that take a shortcut to peers on the same
// machine (mooncake's process_vm_writev, mori's shm provider).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace pdkv {

// The kernel's boot id and this process's PID and IPC namespaces: two
// processes with equal identities can reach each other's memory through the
// kernel (given permission) and share /dev/shm. "" when unknown, which never
// equals anything.
std::string local_host_identity();

// A process's start time (clock ticks since boot, from /proc/PID/stat); 0 if
// it does not exist. With a pid, it names one process: a pid reused by a
// later process comes with a later start time.
uint64_t process_start_time(pid_t pid);

}  // namespace pdkv

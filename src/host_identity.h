// Who "this host" is, for backends that take a shortcut to peers on the same
// machine (mooncake's process_vm_writev, mori's shm provider).
#pragma once

#include <string>

namespace pdkv {

// The kernel's boot id and this process's PID and IPC namespaces: two
// processes with equal identities can reach each other's memory through the
// kernel (given permission) and share /dev/shm. "" when unknown, which never
// equals anything.
std::string local_host_identity();

}  // namespace pdkv

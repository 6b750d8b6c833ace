// This process's thread count, from /proc/self/task.
#pragma once

#include <dirent.h>

#include <cstddef>

namespace pdkv::testing {

inline size_t thread_count() {
  size_t n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

}  // namespace pdkv::testing

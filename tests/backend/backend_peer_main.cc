// pdkv_backend_peer: one transport of a backend in its own process, for the
// backend tests that need a peer that can die or that the kernel treats as a
// stranger.
//   pdkv_backend_peer BACKEND REGION_BYTES [KEY=VALUE...]
// Registers one region (byte i holds i * 37 + 11), prints the transport's
// descriptor (hex) on one line, then waits to be killed. With
// PDKV_TEST_UNDUMPABLE=1 in its environment it first makes itself
// non-dumpable, so that only a process with CAP_SYS_PTRACE may read or write
// its memory with process_vm_readv/writev.
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "pdkv/transport.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s BACKEND REGION_BYTES [KEY=VALUE...]\n", argv[0]);
    return 2;
  }
  if (const char* v = std::getenv("PDKV_TEST_UNDUMPABLE"); v && std::string_view(v) == "1") {
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  }
  pdkv::TransportOptions options;
  for (int i = 3; i < argc; ++i) {
    const std::string kv = argv[i];
    options[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
  }
  auto transport = pdkv::create_transport(argv[1], options);
  if (!transport.is_ok()) {
    std::fprintf(stderr, "%s\n", transport.status().to_string().c_str());
    return 1;
  }
  std::vector<unsigned char> region(std::stoull(argv[2]));
  for (size_t i = 0; i < region.size(); ++i) region[i] = static_cast<unsigned char>(i * 37 + 11);
  auto key = (*transport)->register_region({region.data(), region.size()});
  if (!key.is_ok()) {
    std::fprintf(stderr, "%s\n", key.status().to_string().c_str());
    return 1;
  }
  for (unsigned char c : (*transport)->descriptor()) std::printf("%02x", c);
  std::printf("\n");
  std::fflush(stdout);
  while (true) pause();
}

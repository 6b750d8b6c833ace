// pdkv_backend_peer: one transport of a backend in its own process, for the
// conformance suite's peer-death test.
//   pdkv_backend_peer BACKEND REGION_BYTES [KEY=VALUE]
// Registers one region, prints its descriptor (hex) on one line, then waits
// to be killed.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "pdkv/transport.h"

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: %s BACKEND REGION_BYTES [KEY=VALUE]\n", argv[0]);
    return 2;
  }
  pdkv::TransportOptions options;
  if (argc == 4) {
    const std::string kv = argv[3];
    options[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
  }
  auto transport = pdkv::create_transport(argv[1], options);
  if (!transport.is_ok()) {
    std::fprintf(stderr, "%s\n", transport.status().to_string().c_str());
    return 1;
  }
  std::vector<char> region(std::stoull(argv[2]));
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

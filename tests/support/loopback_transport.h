// The test-only `loopback` transport (see loopback_transport.cc).
#pragma once

namespace pdkv::testing {

// Orders every loopback write completed so far before what the caller does
// next, as a NIC's completion does for the CPU. A test that reads a pool after
// learning of completion through another channel (a gRPC message, which
// ThreadSanitizer cannot see through) calls this first.
void loopback_fence();

}  // namespace pdkv::testing

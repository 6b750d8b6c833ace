// The test-only `loopback` transport (see loopback_transport.cc).
#pragma once

#include <functional>

namespace pdkv::testing {

// Orders every loopback write completed so far before what the caller does
// next, as a NIC's completion does for the CPU. A test that reads a pool after
// learning of completion through another channel (a gRPC message, which
// ThreadSanitizer cannot see through) calls this first.
void loopback_fence();

// Runs `hook` at the start of every loopback acquire_remote_writes() of any
// engine (an empty function: none), on the caller's thread: a decode engine
// calls it on its loop once a source reported success, before it makes the
// source's bytes visible and scatters staged ones.
void set_acquire_hook(std::function<void()> hook);

}  // namespace pdkv::testing

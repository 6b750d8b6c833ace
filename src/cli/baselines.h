// The ceilings `pdkv bench` measures in the same run, so that every result
// is a ratio on this machine, today: one core's memcpy, UCX's own put
// bandwidth (ucx_perftest), and TCP over loopback (iperf3).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace pdkv::cli {

// GB/s of one core copying `bytes` (best of a few passes, warm buffers).
double memcpy_gbps(uint64_t bytes);

// GB/s of `ucx_perftest -t ucp_put_bw` at `message_bytes` between two
// processes on loopback; nullopt (with `why`) when it cannot be run.
std::optional<double> ucx_put_gbps(uint64_t message_bytes, std::string& why);

// GB/s of one iperf3 TCP stream over 127.0.0.1 for `seconds`; nullopt (with
// `why`) when it cannot be run.
std::optional<double> iperf3_gbps(double seconds, std::string& why);

}  // namespace pdkv::cli

// Which network interface owns an address: how a backend whose library picks
// its network by device name (UCX's NET_DEVICES) is pointed at the rank's
// address (the transport option `host`).
#pragma once

#include <optional>
#include <string>

namespace pdkv {

// The name of the interface that holds IPv4 or IPv6 address `address`
// ("lo", "eth0", "veth-a"), or nullopt when none does (or it is a name).
std::optional<std::string> interface_of(const std::string& address);

}  // namespace pdkv

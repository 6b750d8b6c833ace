// A raw mooncake client for tests that break the wire rules on purpose:
// the target's CHALLENGE read off a socket, and a HELLO answering it built
// from the documented layout (docs/backends.md), not by the backend's rail.
#pragma once

#include <sys/socket.h>

#include <string>

#include "crypto.h"
#include "wire.h"

namespace pdkv::testing {

// The CHALLENGE frame the target sends first (header and nonce); shorter
// when the target sent less before its receive timeout.
inline std::string read_challenge(int fd) {
  namespace wire = backends::mooncake::wire;
  std::string challenge(sizeof(wire::FrameHeader) + wire::kNonceBytes, '\0');
  size_t got = 0;
  ssize_t n;
  while (got < challenge.size() &&
         (n = ::recv(fd, challenge.data() + got, challenge.size() - got, 0)) > 0) {
    got += static_cast<size_t>(n);
  }
  challenge.resize(got);
  return challenge;
}

// HELLO answering `challenge` (the nonce) under `secret`: an initiator nonce,
// HMAC-SHA256(secret; "pdkv-mooncake-hello", challenge, nonce, name) with each
// part length-prefixed, then the name.
inline std::string hello_answering(const std::string& secret, const std::string& challenge,
                                   const std::string& name) {
  namespace wire = backends::mooncake::wire;
  const std::string nonce(wire::kNonceBytes, 'i');
  const std::string mac(
      crypto::view(crypto::hmac(secret, {"pdkv-mooncake-hello", challenge, nonce, name})));
  const wire::FrameHeader h =
      wire::frame(wire::FrameType::kHello, 0, 0, 0, nonce.size() + mac.size() + name.size());
  return std::string(reinterpret_cast<const char*>(&h), sizeof h) + nonce + mac + name;
}

}  // namespace pdkv::testing

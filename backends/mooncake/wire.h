// The `mooncake` backend's TCP wire format. Every frame is a fixed 40-byte
// header, then `payload` bytes. An initiator opens a connection ("rail");
// the target sends CHALLENGE (a fresh nonce), the initiator answers HELLO
// (its own nonce and an HMAC of both under the target's session secret) and
// the target HELLO_OK (an HMAC proving it holds the secret too), so that the
// secret never crosses the wire and no captured HELLO opens another
// connection. The initiator then pipelines WRITE and READ frames numbered by
// `seq`; the target applies them in order and answers with
// cumulative ACKs (every seq up to this one is in memory) and READ_DATA.
// Anything unexpected is answered with REFUSE (a reason) and a closed
// connection. Both ends are little-endian hosts (checked at compile time).
#pragma once

#include <bit>
#include <cstdint>
#include <string>
#include <string_view>

#include "crypto.h"

namespace pdkv::backends::mooncake::wire {

static_assert(std::endian::native == std::endian::little, "the wire format is little-endian");

constexpr uint32_t kMagic = 0x4d4b4450;  // "PDKM"

enum class FrameType : uint16_t {
  kHello = 1,  // payload: initiator nonce, hello_mac(), the initiator's segment name
  kHelloOk,    // payload: hello_ok_mac(); the HELLO proved the secret
  kRefuse,     // payload: the reason; the sender closes the connection
  kWrite,      // payload: `length` bytes for target address `addr`
  kAck,        // every WRITE up to `seq` is in the target's memory
  kRead,       // asks for `length` bytes at `addr`; no payload
  kReadData,   // payload: the bytes READ `seq` asked for
  kNotify,     // payload: a notification for the target's application; ACKed like a WRITE
  kChallenge,  // target -> initiator, first: payload: the target's nonce
};

struct FrameHeader {
  uint32_t magic = kMagic;
  uint16_t type = 0;
  uint16_t flags = 0;
  uint64_t seq = 0;
  uint64_t addr = 0;     // a virtual address in the target process
  uint64_t length = 0;   // bytes the operation covers
  uint64_t payload = 0;  // bytes that follow this header
};
static_assert(sizeof(FrameHeader) == 40);

inline FrameHeader frame(FrameType type, uint64_t seq, uint64_t addr, uint64_t length,
                         uint64_t payload) {
  return FrameHeader{kMagic, static_cast<uint16_t>(type), 0, seq, addr, length, payload};
}

constexpr size_t kSecretBytes = 32;
constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = crypto::kMacBytes;
constexpr uint64_t kMaxHelloPayload = 4096;
constexpr uint64_t kMaxRefusePayload = 1024;
constexpr uint64_t kMaxSliceBytes = 64ull << 20;  // bounds what one frame may claim
constexpr uint64_t kMaxNotifyPayload = 512;

inline std::string_view frame_type_name(uint16_t type) {
  switch (static_cast<FrameType>(type)) {
    case FrameType::kHello:
      return "HELLO";
    case FrameType::kHelloOk:
      return "HELLO_OK";
    case FrameType::kRefuse:
      return "REFUSE";
    case FrameType::kWrite:
      return "WRITE";
    case FrameType::kAck:
      return "ACK";
    case FrameType::kRead:
      return "READ";
    case FrameType::kReadData:
      return "READ_DATA";
    case FrameType::kNotify:
      return "NOTIFY";
    case FrameType::kChallenge:
      return "CHALLENGE";
  }
  return "unknown";
}

// What HELLO carries after the initiator's nonce: it binds this connection's
// challenge, the initiator's nonce and name to the secret.
inline std::string hello_mac(std::string_view secret, std::string_view target_nonce,
                             std::string_view initiator_nonce, std::string_view name) {
  return std::string(crypto::view(
      crypto::hmac(secret, {"pdkv-mooncake-hello", target_nonce, initiator_nonce, name})));
}

// HELLO_OK's payload: the target holds the secret too.
inline std::string hello_ok_mac(std::string_view secret, std::string_view initiator_nonce,
                                std::string_view target_nonce) {
  return std::string(crypto::view(
      crypto::hmac(secret, {"pdkv-mooncake-hello-ok", initiator_nonce, target_nonce})));
}

}  // namespace pdkv::backends::mooncake::wire

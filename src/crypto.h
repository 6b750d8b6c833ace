// The few cryptographic primitives pdkv uses, over OpenSSL's libcrypto:
// HMAC-SHA256, random bytes from the kernel, constant-time comparison.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "pdkv/status.h"

namespace pdkv::crypto {

constexpr size_t kMacBytes = 32;
using Mac = std::array<uint8_t, kMacBytes>;

// HMAC-SHA256 under `key` of the parts, each prefixed with its length (so
// that no two different part lists give the same input).
Mac hmac(std::string_view key, std::initializer_list<std::string_view> parts);

// `n` bytes from getrandom(2); an error only when the kernel has none.
Result<std::string> random_bytes(size_t n);

// Equal contents, in time that depends only on the sizes.
bool equal(std::string_view a, std::string_view b);

inline std::string_view view(const Mac& mac) {
  return {reinterpret_cast<const char*>(mac.data()), mac.size()};
}
std::string to_hex(std::string_view bytes);
// False on an odd length or a non-hex digit.
bool from_hex(std::string_view hex, std::string* out);

}  // namespace pdkv::crypto

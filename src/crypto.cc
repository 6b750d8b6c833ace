#include "crypto.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <sys/random.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include <fmt/format.h>

namespace pdkv::crypto {
namespace {

struct MacDeleter {
  void operator()(EVP_MAC* m) const { EVP_MAC_free(m); }
  void operator()(EVP_MAC_CTX* c) const { EVP_MAC_CTX_free(c); }
};

// OpenSSL's HMAC implementation, fetched once (thread-safe to share).
EVP_MAC* hmac_algorithm() {
  static const std::unique_ptr<EVP_MAC, MacDeleter> mac(EVP_MAC_fetch(nullptr, "HMAC", nullptr));
  return mac.get();
}

}  // namespace

Mac hmac(std::string_view key, std::initializer_list<std::string_view> parts) {
  std::unique_ptr<EVP_MAC_CTX, MacDeleter> ctx(EVP_MAC_CTX_new(hmac_algorithm()));
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                               OSSL_PARAM_END};
  Mac out{};
  size_t length = 0;
  // A failure here is a broken libcrypto or no memory: rather than hand out
  // a MAC that might match another failed one, the process stops.
  bool ok = ctx && EVP_MAC_init(ctx.get(), reinterpret_cast<const unsigned char*>(key.data()),
                                key.size(), params) == 1;
  for (std::string_view part : parts) {
    const uint64_t size = part.size();
    ok = ok &&
         EVP_MAC_update(ctx.get(), reinterpret_cast<const unsigned char*>(&size), sizeof size) == 1;
    ok = ok && EVP_MAC_update(ctx.get(), reinterpret_cast<const unsigned char*>(part.data()),
                              part.size()) == 1;
  }
  ok = ok && EVP_MAC_final(ctx.get(), out.data(), &length, out.size()) == 1;
  if (!ok || length != out.size()) {
    std::fprintf(stderr, "pdkv: HMAC-SHA256 failed in libcrypto\n");
    std::abort();
  }
  return out;
}

Result<std::string> random_bytes(size_t n) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    const ssize_t r = getrandom(out.data() + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return Status::internal(fmt::format("getrandom: {}", std::strerror(errno)));
    got += static_cast<size_t>(r);
  }
  return out;
}

bool equal(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string to_hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

bool from_hex(std::string_view hex, std::string* out) {
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (hex.size() % 2 != 0) return false;
  out->clear();
  for (size_t i = 0; i < hex.size(); i += 2) {
    const int hi = digit(hex[i]), lo = digit(hex[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out->push_back(static_cast<char>(hi << 4 | lo));
  }
  return true;
}

}  // namespace pdkv::crypto

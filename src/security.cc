// Reading the operator's secret and TLS files (pdkv/security.h).
#include "pdkv/security.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "crypto.h"

namespace pdkv {
namespace {

constexpr size_t kMinSecretBytes = 16;

Result<std::string> read_file(const std::string& what, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return Status::invalid_argument(
        fmt::format("{} '{}' cannot be read: {}", what, path, std::strerror(errno)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

Result<std::string> read_secret_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return Status::invalid_argument(
        fmt::format("secret file '{}': {}", path, std::strerror(errno)));
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    return Status::invalid_argument(
        fmt::format("secret file '{}' is open to other users (mode {:o}): chmod 600 it", path,
                    st.st_mode & 0777));
  }
  PDKV_ASSIGN_OR_RETURN(std::string secret, read_file("secret file", path));
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (secret.size() < kMinSecretBytes) {
    return Status::invalid_argument(
        fmt::format("secret file '{}' holds {} bytes; a cluster secret needs at least {}", path,
                    secret.size(), kMinSecretBytes));
  }
  return secret;
}

Result<std::string> read_pem_file(const std::string& path) { return read_file("PEM file", path); }

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

Result<Security> load_security(const std::string& secret_file, const std::string& tls_cert_file,
                               const std::string& tls_key_file, const std::string& tls_ca_file) {
  Security s;
  if (!secret_file.empty()) {
    PDKV_ASSIGN_OR_RETURN(s.secret, read_secret_file(secret_file));
  }
  if (tls_cert_file.empty() != tls_key_file.empty()) {
    return Status::invalid_argument(
        fmt::format("TLS needs both a certificate and a key (--tls-cert '{}', --tls-key '{}')",
                    tls_cert_file, tls_key_file));
  }
  if (!tls_ca_file.empty() && tls_cert_file.empty()) {
    return Status::invalid_argument(
        fmt::format("--tls-ca '{}' without --tls-cert and --tls-key", tls_ca_file));
  }
  if (!tls_cert_file.empty()) {
    PDKV_ASSIGN_OR_RETURN(s.tls_cert, read_file("TLS certificate", tls_cert_file));
    PDKV_ASSIGN_OR_RETURN(s.tls_key, read_file("TLS key", tls_key_file));
  }
  if (!tls_ca_file.empty()) {
    PDKV_ASSIGN_OR_RETURN(s.tls_ca, read_file("TLS CA", tls_ca_file));
  }
  return s;
}

Result<Security> security_from_environment() {
  return load_security(env("PDKV_SECRET_FILE"), env("PDKV_TLS_CERT"), env("PDKV_TLS_KEY"),
                       env("PDKV_TLS_CA"));
}

Status write_new_secret_file(const std::string& path) {
  PDKV_ASSIGN_OR_RETURN(const std::string bytes, crypto::random_bytes(32));
  const std::string text = crypto::to_hex(bytes) + "\n";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return Status::invalid_argument(
        fmt::format("cannot create secret file '{}': {}", path, std::strerror(errno)));
  }
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  if (!written) return Status::internal(fmt::format("cannot write secret file '{}'", path));
  return Status::ok();
}

}  // namespace pdkv

#include "cli/security_flags.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace pdkv::cli {

Result<Security> SecurityFlags::load() const {
  return load_security(secret_file, tls_cert, tls_key, tls_ca);
}

std::vector<std::string> SecurityFlags::arguments() const {
  std::vector<std::string> out;
  auto add = [&](const char* flag, const std::string& value) {
    if (value.empty()) return;
    out.push_back(flag);
    out.push_back(value);
  };
  add("--secret-file", secret_file);
  add("--tls-cert", tls_cert);
  add("--tls-key", tls_key);
  add("--tls-ca", tls_ca);
  return out;
}

void add_security_flags(CLI::App& cmd, SecurityFlags& flags) {
  cmd.add_option("--secret-file", flags.secret_file,
                 "The cluster secret (a file of at least 16 bytes, mode 600): every call to and "
                 "from this process is authenticated with it (docs/security.md)")
      ->envname("PDKV_SECRET_FILE")
      ->group("Security");
  cmd.add_option("--tls-cert", flags.tls_cert, "PEM certificate: gRPC over TLS")
      ->envname("PDKV_TLS_CERT")
      ->group("Security");
  cmd.add_option("--tls-key", flags.tls_key, "PEM private key of --tls-cert")
      ->envname("PDKV_TLS_KEY")
      ->group("Security");
  cmd.add_option("--tls-ca", flags.tls_ca,
                 "PEM CA: peers must present a certificate it signed (mutual TLS)")
      ->envname("PDKV_TLS_CA")
      ->group("Security");
}

Result<RunSecret> RunSecret::make(SecurityFlags& flags) {
  RunSecret secret;
  if (!flags.secret_file.empty()) return secret;
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = fmt::format("{}/pdkv-run-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (::mkdtemp(pattern.data()) == nullptr) {
    return Status::internal(fmt::format("cannot make a directory for the run's secret ({}): {}",
                                        pattern, std::strerror(errno)));
  }
  secret.dir_ = pattern;
  secret.file_ = pattern + "/secret";
  PDKV_RETURN_IF_ERROR(write_new_secret_file(secret.file_));
  flags.secret_file = secret.file_;
  return secret;
}

RunSecret::RunSecret(RunSecret&& other) noexcept
    : dir_(std::exchange(other.dir_, {})), file_(std::exchange(other.file_, {})) {}

RunSecret::~RunSecret() {
  if (!file_.empty()) ::unlink(file_.c_str());
  if (!dir_.empty()) ::rmdir(dir_.c_str());
}

}  // namespace pdkv::cli

// The security flags every pdkv command takes (pdkv/security.h):
// --secret-file, --tls-cert, --tls-key, --tls-ca, each also read from its
// environment variable (PDKV_SECRET_FILE, PDKV_TLS_CERT, PDKV_TLS_KEY,
// PDKV_TLS_CA) when not given.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "pdkv/security.h"

namespace pdkv::cli {

struct SecurityFlags {
  std::string secret_file, tls_cert, tls_key, tls_ca;

  Result<Security> load() const;
  // The same flags for a child process's command line.
  std::vector<std::string> arguments() const;
};

void add_security_flags(CLI::App& cmd, SecurityFlags& flags);

// `pdkv run` and `pdkv bench`: a fresh secret for one local cluster, in a
// private directory removed with this object, unless the user named one.
class RunSecret {
 public:
  // Fills flags.secret_file when it is empty.
  static Result<RunSecret> make(SecurityFlags& flags);
  RunSecret(RunSecret&& other) noexcept;
  RunSecret& operator=(RunSecret&&) = delete;
  ~RunSecret();

 private:
  RunSecret() = default;
  std::string dir_, file_;  // empty: the user's own secret, nothing to remove
};

}  // namespace pdkv::cli

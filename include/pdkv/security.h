// Who may talk to a rank (DESIGN §11, docs/security.md).
//
// With a cluster secret, every bootstrap and control call carries an
// HMAC-SHA256 of its method, time, a fresh nonce and its request bytes; a
// call without a valid one is refused (UNAUTHENTICATED) and logged with the
// caller's address. Without a secret nothing is authenticated: anyone who
// reaches a rank's ports may read its descriptors and write its pools (the
// library says so in a warning at start). Optionally, gRPC's TLS encrypts the
// control plane too, with mutual TLS when a CA is given.
//
// Limits bound what any caller, authenticated or not, can make a rank hold.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "pdkv/status.h"

namespace pdkv {

struct Security {
  std::string secret;  // the cluster secret's bytes (at least 16); empty: none
  // PEM text (not paths) for TLS: cert + key turn TLS on; a CA makes it
  // mutual (peers must show a certificate it signed) and verifies servers.
  std::string tls_cert, tls_key, tls_ca;
  // How far a call's time may be from this host's clock; a call is refused
  // outside it, and its nonce is remembered that long (replays refused).
  std::chrono::milliseconds clock_skew{30'000};

  bool authenticated() const { return !secret.empty(); }
  bool tls() const { return !tls_cert.empty(); }
};

// The files an operator names (`--secret-file`, `--tls-cert`, `--tls-key`,
// `--tls-ca`; empty: not given), read and checked: a secret file shorter than
// 16 bytes, unreadable, or readable by other users is refused, naming it.
Result<Security> load_security(const std::string& secret_file, const std::string& tls_cert_file,
                               const std::string& tls_key_file, const std::string& tls_ca_file);

// One file each: a secret file as load_security checks it; a PEM file's text.
Result<std::string> read_secret_file(const std::string& path);
Result<std::string> read_pem_file(const std::string& path);

// The environment's variables of the same names, for embedders:
// PDKV_SECRET_FILE, PDKV_TLS_CERT, PDKV_TLS_KEY, PDKV_TLS_CA.
Result<Security> security_from_environment();

// Writes a fresh random secret (32 bytes, hex) to `path`, readable by its
// owner only (`pdkv run` makes one per run).
Status write_new_secret_file(const std::string& path);

// What a caller can make a rank hold; exceeding one is refused with an error
// naming the limit (RESOURCE_EXHAUSTED or INVALID_ARGUMENT).
struct Limits {
  uint32_t ranks_per_engine = 4096;  // bootstrap: registrations per engine id
  uint32_t engines = 1024;           // bootstrap: engine ids it knows
  uint32_t pending_lookups = 1024;   // topology lookups of one rank waiting for an answer
  uint32_t early_rooms = 65'536;     // prefill: rooms known only from early messages
  uint32_t page_list = 1u << 20;     // pages in one TransferInfo
  uint32_t watches_per_peer = 8;     // Watch streams one peer rank may hold open here
  uint32_t control_calls = 65'536;   // control requests being served at once (each report of a
                                     // ReportStatuses counts)
  uint32_t replay_cache = 1u << 20;  // nonces remembered (one clock_skew window's calls)
};

}  // namespace pdkv

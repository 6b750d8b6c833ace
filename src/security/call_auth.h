// Authenticated gRPC calls under the cluster secret (DESIGN §11).
//
// A call carries one metadata entry, `pdkv-auth: <unix ms>.<nonce>.<mac>`,
// where mac = HMAC-SHA256(secret, method, time, nonce, request bytes) (a
// stream's: its opening, without messages). The server recomputes it over
// the request it parsed, checks the time against its clock (Security::
// clock_skew) and refuses a nonce it has seen within that window, so a
// captured call can be neither replayed nor given another body.
//
// Thread-safety: CallAuthenticator from any thread (one lock around the
// nonce cache and the log's rate, never held across a call out).
#pragma once

#include <google/protobuf/message_lite.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_set>

#include "pdkv/security.h"

namespace pdkv::security {

inline constexpr char kAuthMetadata[] = "pdkv-auth";
inline constexpr size_t kNonceBytes = 16;

// The metadata value of a call of `method` ("/pdkv.proto.Control/AbortRoom").
std::string sign_call(std::string_view secret, std::string_view method, std::string_view body,
                      int64_t unix_ms, std::string_view nonce);

class CallAuthenticator {
 public:
  // `service` names the server in its log lines ("bootstrap", "control").
  CallAuthenticator(Security security, uint32_t replay_cache, std::string service);

  // OK, or UNAUTHENTICATED naming what was wrong (logged with the caller's
  // address, at most a few lines a second). The work is bounded by the
  // request's size, which gRPC already bounded when it parsed it. With no
  // secret configured every call passes.
  grpc::Status check(const grpc::ServerContextBase& ctx, std::string_view method,
                     const google::protobuf::MessageLite* request);

 private:
  Status verify(std::string_view value, std::string_view method, std::string_view body);
  // False when the nonce was seen in the window (or the cache is full).
  Status remember(std::string nonce, int64_t unix_ms, int64_t now_ms);
  void log_refusal(const std::string& peer, std::string_view method, const Status& why);

  const Security security_;
  const uint32_t replay_cache_;
  const std::string service_;

  std::mutex mu_;
  std::unordered_set<std::string> nonces_;               // seen within the window
  std::deque<std::pair<int64_t, std::string>> by_time_;  // (expiry ms, nonce), oldest first
  int64_t log_second_ = 0;
  uint32_t logged_this_second_ = 0;
  uint64_t suppressed_ = 0;
};

// Unix time in milliseconds (the clock calls are signed with).
int64_t unix_ms_now();

}  // namespace pdkv::security

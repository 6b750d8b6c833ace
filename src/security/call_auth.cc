#include "security/call_auth.h"

#include <fmt/format.h>

#include <charconv>

#include "crypto.h"
#include "grpc_status.h"
#include "log.h"

namespace pdkv::security {
namespace {

constexpr uint32_t kLogLinesPerSecond = 5;

std::string time_text(int64_t unix_ms) { return std::to_string(unix_ms); }

crypto::Mac mac_of(std::string_view secret, std::string_view method, std::string_view time,
                   std::string_view nonce, std::string_view body) {
  return crypto::hmac(secret, {"pdkv-call-v1", method, time, nonce, body});
}

}  // namespace

int64_t unix_ms_now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string sign_call(std::string_view secret, std::string_view method, std::string_view body,
                      int64_t unix_ms, std::string_view nonce) {
  const std::string time = time_text(unix_ms);
  return fmt::format("{}.{}.{}", time, crypto::to_hex(nonce),
                     crypto::to_hex(crypto::view(mac_of(secret, method, time, nonce, body))));
}

CallAuthenticator::CallAuthenticator(Security security, uint32_t replay_cache, std::string service)
    : security_(std::move(security)), replay_cache_(replay_cache), service_(std::move(service)) {}

grpc::Status CallAuthenticator::check(const grpc::ServerContextBase& ctx, std::string_view method,
                                      const google::protobuf::MessageLite* request) {
  if (!security_.authenticated()) return grpc::Status::OK;
  const auto& metadata = ctx.client_metadata();
  auto [first, last] = metadata.equal_range(kAuthMetadata);
  Status why = Status::ok();
  if (first == last) {
    why = Status::unauthenticated(
        fmt::format("{} call {} carries no credentials ({})", service_, method, kAuthMetadata));
  } else if (std::next(first) != last) {
    why = Status::unauthenticated(
        fmt::format("{} call {} carries {} twice", service_, method, kAuthMetadata));
  } else {
    const std::string body = request ? request->SerializeAsString() : std::string();
    why = verify(std::string_view(first->second.data(), first->second.size()), method, body);
  }
  if (why.is_ok()) return grpc::Status::OK;
  log_refusal(ctx.peer(), method, why);
  return to_grpc(why);
}

Status CallAuthenticator::verify(std::string_view value, std::string_view method,
                                 std::string_view body) {
  // <decimal ms>.<32 hex nonce>.<64 hex mac>; anything else is malformed.
  const size_t dot1 = value.find('.');
  const size_t dot2 = dot1 == std::string_view::npos ? dot1 : value.find('.', dot1 + 1);
  if (dot2 == std::string_view::npos || value.size() > 128) {
    return Status::unauthenticated(fmt::format("malformed {} on {}", kAuthMetadata, method));
  }
  const std::string_view time = value.substr(0, dot1);
  int64_t unix_ms = 0;
  const auto [end, ec] = std::from_chars(time.data(), time.data() + time.size(), unix_ms);
  std::string nonce, mac;
  if (ec != std::errc() || end != time.data() + time.size() ||
      !crypto::from_hex(value.substr(dot1 + 1, dot2 - dot1 - 1), &nonce) ||
      nonce.size() != kNonceBytes || !crypto::from_hex(value.substr(dot2 + 1), &mac)) {
    return Status::unauthenticated(fmt::format("malformed {} on {}", kAuthMetadata, method));
  }
  const auto expected = mac_of(security_.secret, method, time, nonce, body);
  if (!crypto::equal(mac, crypto::view(expected))) {
    return Status::unauthenticated(fmt::format(
        "{} call {}: wrong credentials (not signed with this cluster's secret)", service_, method));
  }
  const int64_t now = unix_ms_now();
  const int64_t skew = security_.clock_skew.count();
  if (unix_ms < now - skew || unix_ms > now + skew) {
    return Status::unauthenticated(
        fmt::format("{} call {} signed at {} ms, {} ms from this host's clock (allowed: {} ms)",
                    service_, method, unix_ms, unix_ms - now, skew));
  }
  return remember(std::move(nonce), unix_ms, now);
}

Status CallAuthenticator::remember(std::string nonce, int64_t unix_ms, int64_t now_ms) {
  std::lock_guard lock(mu_);
  while (!by_time_.empty() && by_time_.front().first < now_ms) {
    nonces_.erase(by_time_.front().second);
    by_time_.pop_front();
  }
  if (nonces_.count(nonce) != 0) {
    return Status::unauthenticated(
        fmt::format("{}: a replayed call (nonce seen before)", service_));
  }
  if (nonces_.size() >= replay_cache_) {
    return Status::resource_exhausted(
        fmt::format("{}: {} calls within {} ms fill the replay cache (Limits::replay_cache {})",
                    service_, nonces_.size(), security_.clock_skew.count() * 2, replay_cache_));
  }
  // Remembered until its time can no longer pass the clock check.
  const int64_t expiry = unix_ms + security_.clock_skew.count();
  nonces_.insert(nonce);
  // Expiries arrive nearly in order; one out of order only stays a little longer.
  by_time_.emplace_back(std::max(expiry, by_time_.empty() ? expiry : by_time_.back().first),
                        std::move(nonce));
  return Status::ok();
}

void CallAuthenticator::log_refusal(const std::string& peer, std::string_view method,
                                    const Status& why) {
  const int64_t second = unix_ms_now() / 1000;
  uint64_t suppressed = 0;
  {
    std::lock_guard lock(mu_);
    if (second != log_second_) {
      log_second_ = second;
      logged_this_second_ = 0;
      suppressed = std::exchange(suppressed_, 0);
    }
    if (logged_this_second_ >= kLogLinesPerSecond) {
      ++suppressed_;
      return;
    }
    ++logged_this_second_;
  }
  logger(service_)->warn(
      "refused {} from {}: {}{}", method, peer, why.message(),
      suppressed ? fmt::format(" ({} more refusals not logged)", suppressed) : std::string());
}

}  // namespace pdkv::security

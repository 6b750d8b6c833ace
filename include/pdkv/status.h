// Status and Result<T>: how every pdkv call reports failure.
//
// No exception crosses the public API. A function that can fail returns a
// Status (or a Result<T> carrying either a value or a Status), and its message
// names the offending value so that an operator can act on it without reading
// the source. Both types are [[nodiscard]]: ignoring a failure is a compile
// error under -Werror.
//
// Thread-safety: values; distinct objects may be used from distinct threads.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>

namespace pdkv {

enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument,     // the caller passed something that can never work
  kOutOfRange,          // an index beyond a pool, a rank beyond a world size
  kNotFound,            // an unknown room, engine or backend
  kAlreadyExists,       // a duplicate room or registration
  kFailedPrecondition,  // the call is valid but not in the object's current state
  kUnavailable,         // not yet (e.g. a topology still bootstrapping): retry
  kDeadlineExceeded,    // a configured timeout expired
  kAborted,             // the peer or the caller aborted the room
  kInternal,            // a transport or library failure
  kUnauthenticated,     // the caller did not prove it holds the cluster secret
  kResourceExhausted,   // a configured bound (pdkv::Limits) would be exceeded
};

// Stable, lower-case name of a code ("invalid_argument"), for logs and JSON.
const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  static Status invalid_argument(std::string m) {
    return {StatusCode::kInvalidArgument, std::move(m)};
  }
  static Status out_of_range(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
  static Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status already_exists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
  static Status failed_precondition(std::string m) {
    return {StatusCode::kFailedPrecondition, std::move(m)};
  }
  static Status unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
  static Status deadline_exceeded(std::string m) {
    return {StatusCode::kDeadlineExceeded, std::move(m)};
  }
  static Status aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
  static Status internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
  static Status unauthenticated(std::string m) {
    return {StatusCode::kUnauthenticated, std::move(m)};
  }
  static Status resource_exhausted(std::string m) {
    return {StatusCode::kResourceExhausted, std::move(m)};
  }

  bool is_ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid_argument: 8 KV heads cannot be split over TP 3 ..." or "ok".
  std::string to_string() const;

  // Prefixes the message with where it happened, keeping the code.
  Status with_context(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Either a T or a non-ok Status. Accessing value() of an error is a bug and
// aborts with the status message (it never throws).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : state_(std::move(status)) {  // NOLINT: implicit by design
    if (std::get<Status>(state_).is_ok()) state_ = Status::internal("Result built from ok Status");
  }

  bool is_ok() const { return std::holds_alternative<T>(state_); }
  const Status& status() const {
    static const Status kOkStatus;
    return is_ok() ? kOkStatus : std::get<Status>(state_);
  }
  T& value() & {
    check();
    return std::get<T>(state_);
  }
  const T& value() const& {
    check();
    return std::get<T>(state_);
  }
  T&& value() && {
    check();
    return std::get<T>(std::move(state_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  void check() const;
  std::variant<T, Status> state_;
};

[[noreturn]] void die_on_bad_result_access(const Status& status);

template <typename T>
void Result<T>::check() const {
  if (!is_ok()) die_on_bad_result_access(std::get<Status>(state_));
}

}  // namespace pdkv

#define PDKV_CONCAT_INNER(a, b) a##b
#define PDKV_CONCAT(a, b) PDKV_CONCAT_INNER(a, b)

// Returns the Status of `expr` from the enclosing function if it is not ok.
#define PDKV_RETURN_IF_ERROR(expr)                  \
  do {                                              \
    ::pdkv::Status pdkv_status_ = (expr);           \
    if (!pdkv_status_.is_ok()) return pdkv_status_; \
  } while (0)

// `PDKV_ASSIGN_OR_RETURN(auto x, f());` declares x from a Result or returns its error.
#define PDKV_ASSIGN_OR_RETURN(lhs, expr) \
  PDKV_ASSIGN_OR_RETURN_IMPL(PDKV_CONCAT(pdkv_result_, __LINE__), lhs, expr)
#define PDKV_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.is_ok()) return tmp.status();           \
  lhs = std::move(tmp).value()

#include "pdkv/status.h"

#include <cstdio>
#include <cstdlib>

namespace pdkv {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid_argument";
    case StatusCode::kOutOfRange:
      return "out_of_range";
    case StatusCode::kNotFound:
      return "not_found";
    case StatusCode::kAlreadyExists:
      return "already_exists";
    case StatusCode::kFailedPrecondition:
      return "failed_precondition";
    case StatusCode::kUnavailable:
      return "unavailable";
    case StatusCode::kDeadlineExceeded:
      return "deadline_exceeded";
    case StatusCode::kAborted:
      return "aborted";
    case StatusCode::kInternal:
      return "internal";
    case StatusCode::kUnauthenticated:
      return "unauthenticated";
    case StatusCode::kResourceExhausted:
      return "resource_exhausted";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  return std::string(status_code_name(code_)) + ": " + message_;
}

Status Status::with_context(const std::string& context) const {
  if (is_ok()) return *this;
  return Status(code_, context + ": " + message_);
}

void die_on_bad_result_access(const Status& status) {
  std::fprintf(stderr, "pdkv: value() of a failed Result: %s\n", status.to_string().c_str());
  std::abort();
}

}  // namespace pdkv

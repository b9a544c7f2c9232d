#include "ina/base/status.h"

#include <cerrno>
#include <cstring>

namespace ina {

std::string_view status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kAlreadyExists: return "ALREADY_EXISTS";
    case StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kAborted: return "ABORTED";
    case StatusCode::kDataLoss: return "DATA_LOSS";
    case StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case StatusCode::kInternal: return "INTERNAL";
  }
  return "UNKNOWN";
}

std::string Status::to_string() const {
  std::string s(status_code_name(code_));
  if (!message_.empty()) {
    s += ": ";
    s += message_;
  }
  return s;
}

Status errno_status(std::string_view what, int err) {
  std::string msg(what);
  msg += ": ";
  msg += std::strerror(err);
  StatusCode code = StatusCode::kInternal;
  switch (err) {
    case EINVAL:
    case EAFNOSUPPORT: code = StatusCode::kInvalidArgument; break;
    case ECONNREFUSED:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ECONNRESET:
    case EPIPE: code = StatusCode::kUnavailable; break;
    case ETIMEDOUT: code = StatusCode::kDeadlineExceeded; break;
    case ENOMEM:
    case ENOBUFS:
    case EMFILE:
    case ENFILE: code = StatusCode::kResourceExhausted; break;
    case EADDRINUSE: code = StatusCode::kAlreadyExists; break;
    case ENOENT: code = StatusCode::kNotFound; break;
    default: break;
  }
  return {code, std::move(msg)};
}

}  // namespace ina

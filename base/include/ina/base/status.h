// Status and Result: the error currency of every I/O path in INA.
//
// Canonical codes follow abseil's (kUnavailable drives the fallback, kDeadlineExceeded is a
// collective that could not finish in time). No exceptions cross module boundaries: functions
// that can fail return Status or Result<T>.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace ina {

enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument,   // a bad config, argument or input; names the field
  kDeadlineExceeded,  // a collective or wait ran past its deadline
  kUnavailable,       // the peer or aggregator cannot be reached (retryable, drives fallback)
  kNotFound,
  kAlreadyExists,
  kResourceExhausted,  // out of memory, slots, ports
  kFailedPrecondition,
  kAborted,  // a peer reported an error
  kDataLoss,
  kUnimplemented,
  kInternal,  // a bug
};

std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "DEADLINE_EXCEEDED: allreduce: ranks 3 did not contribute"
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status ok_status() { return Status(); }
inline Status invalid_argument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status deadline_exceeded(std::string m) {
  return {StatusCode::kDeadlineExceeded, std::move(m)};
}
inline Status unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status resource_exhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
inline Status failed_precondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
// errno-based error: "<what>: <strerror(err)>", mapped to a code.
Status errno_status(std::string_view what, int err);

// Result<T>: a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace ina

#define INA_CONCAT_INNER_(a, b) a##b
#define INA_CONCAT_(a, b) INA_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function when `expr` is not OK.
#define INA_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::ina::Status ina_status_ = (expr);        \
    if (!ina_status_.ok()) return ina_status_; \
  } while (0)

// INA_ASSIGN_OR_RETURN(auto x, f()): unwraps a Result or returns its Status.
#define INA_ASSIGN_OR_RETURN(lhs, expr) \
  INA_ASSIGN_OR_RETURN_IMPL_(INA_CONCAT_(ina_result_, __LINE__), lhs, expr)
#define INA_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()

// Internal error values. Every fallible internal function returns Status or Result<T>; they are
// converted to ncclResult_t only at the C boundary (bindings/c).
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace tutti {

// Values match ncclResult_t so the conversion at the boundary is a cast.
enum class Code : int {
  kOk = 0,
  kCudaError = 1,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,
  kInProgress = 7,
  kTimeout = 8,
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

  // Adds context in front of the message ("bootstrap: " + "connect ...").
  Status withContext(const std::string& context) const {
    return ok() ? *this : Status(code_, context + ": " + message_);
  }

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

inline Status invalidArgument(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
inline Status invalidUsage(std::string m) { return {Code::kInvalidUsage, std::move(m)}; }
inline Status systemError(std::string m) { return {Code::kSystemError, std::move(m)}; }
inline Status internalError(std::string m) { return {Code::kInternalError, std::move(m)}; }
inline Status remoteError(std::string m) { return {Code::kRemoteError, std::move(m)}; }
inline Status timeoutError(std::string m) { return {Code::kTimeout, std::move(m)}; }

// errno-carrying system error: "what: strerror(err)".
Status errnoStatus(const std::string& what, int err);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}  // NOLINT

  bool ok() const { return std::holds_alternative<T>(v_); }
  T& value() { return std::get<T>(v_); }
  const T& value() const { return std::get<T>(v_); }
  T&& take() { return std::move(std::get<T>(v_)); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace tutti

// Returns early from the enclosing function when a Status is not ok.
#define TUTTI_TRY(expr)                                    \
  do {                                                     \
    ::tutti::Status tutti_try_status_ = (expr);            \
    if (!tutti_try_status_.ok()) return tutti_try_status_; \
  } while (0)

// Declares `var` from a Result<T>, returning its Status early on failure.
#define TUTTI_ASSIGN(var, expr)                                     \
  auto tutti_assign_##var = (expr);                                 \
  if (!tutti_assign_##var.ok()) return tutti_assign_##var.status(); \
  auto var = tutti_assign_##var.take()

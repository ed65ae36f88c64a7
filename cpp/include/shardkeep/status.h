// Error values for the shardkeep core. The core never throws: every fallible
// function returns a Status or a Result<T>, and the Python binding maps the
// code to one exception class in exactly one place.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace shardkeep {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // the caller asked for something malformed
  kNotFound,         // a checkpoint, file or leaf does not exist
  kCorruption,       // stored bytes fail a checksum or a format check
  kIncompatible,     // shape/dtype/tree mismatch, unsupported version or cast
  kTimeout,          // a barrier or wait ran past its deadline
  kStorage,          // the storage backend failed (I/O error, full disk...)
  kResourceExhausted,  // out of memory or threads (std::bad_alloc and the like)
  kAlreadyExists,    // refusing to overwrite a committed checkpoint
  kCancelled,        // another participant failed; this one stopped
  kInternal,         // a bug in shardkeep
  kOutOfSpace,       // the storage is full (a kind of storage failure)
  kCommitStateUnknown,  // a save failed where its checkpoint may or may not
                        // have been committed; check before retrying
  kLeaseLost,        // a save in flight lost its lease (or its files) to
                     // another process that judged it dead; nothing was
                     // committed
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message)
      : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "Corruption: <message>", or "OK".
  std::string ToString() const;

  // Returns a copy whose message is prefixed with `context` ("ctx: msg").
  Status WithContext(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

Status InvalidArgumentError(std::string message);
Status NotFoundError(std::string message);
Status CorruptionError(std::string message);
Status IncompatibleError(std::string message);
Status TimeoutError(std::string message);
Status StorageError(std::string message);
Status ResourceExhaustedError(std::string message);
Status AlreadyExistsError(std::string message);
Status CancelledError(std::string message);
Status InternalError(std::string message);
Status OutOfSpaceError(std::string message);
Status CommitStateUnknownError(std::string message);
Status LeaseLostError(std::string message);
// A StorageError built from errno: "<what>: <strerror(err)>".
Status ErrnoError(const std::string& what, int err);

namespace internal {
// Ends the process with a message naming `status`: value() of a Result
// holding an error is a bug in the caller, reported rather than left
// undefined.
[[noreturn]] void DieOfValueOnError(const Status& status);
}  // namespace internal

// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    if (status_.ok()) status_ = InternalError("Result built from OK status");
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  // The value. On a Result holding an error, every accessor ends the
  // process with a message naming the error (check ok() first).
  T& value() & { return Checked(), *value_; }
  const T& value() const& { return Checked(), *value_; }
  T&& value() && { return Checked(), std::move(*value_); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  void Checked() const {
    if (!value_.has_value()) internal::DieOfValueOnError(status_);
  }

  Status status_;
  std::optional<T> value_;
};

}  // namespace shardkeep

#define SK_CONCAT_INNER_(a, b) a##b
#define SK_CONCAT_(a, b) SK_CONCAT_INNER_(a, b)

#define SK_RETURN_IF_ERROR(expr)                   \
  do {                                             \
    ::shardkeep::Status sk_status_ = (expr);       \
    if (!sk_status_.ok()) return sk_status_;       \
  } while (0)

#define SK_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

// SK_ASSIGN_OR_RETURN(auto x, FunctionReturningResult());
#define SK_ASSIGN_OR_RETURN(lhs, expr) \
  SK_ASSIGN_OR_RETURN_IMPL_(SK_CONCAT_(sk_result_, __LINE__), lhs, expr)

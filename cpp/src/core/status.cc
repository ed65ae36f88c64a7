#include "shardkeep/status.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace shardkeep {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kCorruption: return "Corruption";
    case StatusCode::kIncompatible: return "Incompatible";
    case StatusCode::kTimeout: return "Timeout";
    case StatusCode::kStorage: return "Storage";
    case StatusCode::kResourceExhausted: return "ResourceExhausted";
    case StatusCode::kAlreadyExists: return "AlreadyExists";
    case StatusCode::kCancelled: return "Cancelled";
    case StatusCode::kInternal: return "Internal";
    case StatusCode::kOutOfSpace: return "OutOfSpace";
    case StatusCode::kCommitStateUnknown: return "CommitStateUnknown";
    case StatusCode::kLeaseLost: return "LeaseLost";
  }
  return "Unknown";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

Status Status::WithContext(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_);
}

Status InvalidArgumentError(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
Status NotFoundError(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
Status CorruptionError(std::string m) { return {StatusCode::kCorruption, std::move(m)}; }
Status IncompatibleError(std::string m) { return {StatusCode::kIncompatible, std::move(m)}; }
Status TimeoutError(std::string m) { return {StatusCode::kTimeout, std::move(m)}; }
Status StorageError(std::string m) { return {StatusCode::kStorage, std::move(m)}; }
Status ResourceExhaustedError(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
Status AlreadyExistsError(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
Status CancelledError(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
Status InternalError(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
Status OutOfSpaceError(std::string m) { return {StatusCode::kOutOfSpace, std::move(m)}; }
Status CommitStateUnknownError(std::string m) {
  return {StatusCode::kCommitStateUnknown, std::move(m)};
}
Status LeaseLostError(std::string m) { return {StatusCode::kLeaseLost, std::move(m)}; }

Status ErrnoError(const std::string& what, int err) {
  char buffer[256];
  // GNU strerror_r returns the message pointer (maybe not `buffer`).
  const char* text = strerror_r(err, buffer, sizeof(buffer));
  return StorageError(what + ": " + text);
}

namespace internal {

void DieOfValueOnError(const Status& status) {
  std::fprintf(stderr, "shardkeep: Result::value() called on an error: %s\n",
               status.ToString().c_str());
  std::abort();
}

}  // namespace internal

}  // namespace shardkeep

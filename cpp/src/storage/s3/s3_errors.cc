#include "storage/s3/s3_errors.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string_view>

namespace shardkeep::s3 {
namespace {

bool CodeIn(const S3Failure& failure,
            std::initializer_list<std::string_view> codes) {
  if (!failure.error) return false;
  return std::find(codes.begin(), codes.end(), failure.error->code) !=
         codes.end();
}

// "PutObject s3://bucket/key: HTTP 403 AccessDenied: Access Denied
// (request id 4442587FB7D0A2F9)".
std::string Describe(const S3Failure& failure) {
  std::string out = failure.operation + " s3://" + failure.bucket;
  if (!failure.key.empty()) out += "/" + failure.key;
  if (failure.transport != http::Transport::kAnswered) {
    return out + ": " + http::TransportFailureText(failure.transport, failure.transport_detail);
  }
  out += ": HTTP " + std::to_string(failure.http_status);
  if (failure.error) {
    out.append(" ").append(http::Printable(failure.error->code));
    if (!failure.error->message.empty()) {
      out.append(": ").append(http::Printable(failure.error->message));
    }
    if (!failure.error->request_id.empty()) {
      out.append(" (request id ")
          .append(http::Printable(failure.error->request_id))
          .append(")");
    }
  }
  return out;
}

std::string KeyIdHint(const S3Failure& failure) {
  return failure.access_key_id.empty()
             ? std::string("no access key id was configured")
             : "access key id '" + http::Printable(failure.access_key_id) + "'";
}

}  // namespace

bool IsRetryable(const S3Failure& failure) {
  if (const std::optional<bool> transient = http::TransientTransport(failure.transport)) {
    return *transient;
  }
  // Codes first: CompleteMultipartUpload reports InternalError under 200.
  // A body that does not match its Content-MD5 (BadDigest) or its signed
  // SHA-256 (XAmzContentSHA256Mismatch) was damaged on the way and not
  // stored: sending it again is the fix.
  if (CodeIn(failure, {"SlowDown", "RequestTimeout", "InternalError",
                       "ServiceUnavailable", "Throttling",
                       "ThrottlingException", "RequestLimitExceeded",
                       "TooManyRequests", "ConditionalRequestConflict",
                       "OperationAborted", "BadDigest",
                       "XAmzContentSHA256Mismatch"})) {
    return true;
  }
  const int status = failure.http_status;
  // 501 is a feature the server lacks (such as conditional PUT).
  return (status >= 500 && status != 501) || status == 429 || status == 408;
}

Status ToStatus(const S3Failure& failure) {
  const std::string what = Describe(failure);
  if (failure.transport != http::Transport::kAnswered) return StorageError(what);
  const int status = failure.http_status;
  // Not "nothing stored here": a caller that takes NotFound for an empty
  // prefix (the manager resuming a run) would start from scratch on a
  // mistyped bucket name.
  if (CodeIn(failure, {"NoSuchBucket"})) {
    return InvalidArgumentError(
        what + "; the bucket does not exist: check the URL and the endpoint, "
               "or create it");
  }
  if (status == 404 || CodeIn(failure, {"NoSuchKey", "NoSuchUpload"})) {
    return NotFoundError(what);
  }
  if (status == 412 || CodeIn(failure, {"PreconditionFailed"})) {
    return AlreadyExistsError(
        what + "; the object exists already (another writer came first)");
  }
  if (CodeIn(failure, {"InvalidAccessKeyId", "SignatureDoesNotMatch",
                       "ExpiredToken", "InvalidToken",
                       "TokenRefreshRequired"})) {
    return InvalidArgumentError(
        what + "; the server rejects the credentials of " +
        KeyIdHint(failure) +
        ": check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and "
        "AWS_SESSION_TOKEN, or the profile's credentials");
  }
  if (CodeIn(failure, {"RequestTimeTooSkewed"})) {
    return InvalidArgumentError(
        what + "; this machine's clock differs too much from the server's");
  }
  if (CodeIn(failure, {"AuthorizationHeaderMalformed"})) {
    return InvalidArgumentError(
        what + "; check the region (AWS_REGION) and the endpoint");
  }
  if (status == 507 ||
      CodeIn(failure, {"QuotaExceeded", "XMinioStorageFull",
                       "XMinioAdminBucketQuotaExceeded"})) {
    return OutOfSpaceError(what);
  }
  if (CodeIn(failure, {"EntityTooLarge"})) {
    return InvalidArgumentError(
        what + "; the object or part is larger than the store accepts");
  }
  if (status == 403 || CodeIn(failure, {"AccessDenied"})) {
    return StorageError(what + "; " + KeyIdHint(failure) +
                        " lacks permission for " + failure.operation +
                        " on bucket '" + failure.bucket + "'");
  }
  return StorageError(what);
}

}  // namespace shardkeep::s3

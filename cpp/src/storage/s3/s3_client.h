// Signed S3 requests to one bucket, retried the way s3_errors.h classifies
// their failures, each request bounded by a deadline (timeout_s).
//
// Every attempt is signed afresh (SigV4's date must be current), sent
// through an HttpTransport, and judged: a 2xx answer (or one of the
// statuses the caller says it handles itself) is returned; a retryable
// failure waits BackoffBeforeRetry's full-jitter time and tries again while
// the deadline allows; anything else becomes ToStatus's error, which names
// the operation, bucket, key and the server's code and message, and never
// the secret. Every request with a body sends its MD5 (Content-MD5), which
// the store checks before storing anything: a body damaged on the way is
// refused (BadDigest) and sent again, never stored as it arrived. The
// clock, sleep and random source are injectable so retry schedules are
// tested exactly.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardkeep/status.h"
#include "storage/http/backoff.h"
#include "storage/http/http_transport.h"
#include "storage/s3/s3_errors.h"
#include "storage/s3/s3_location.h"
#include "storage/s3/s3_xml.h"

namespace shardkeep::s3 {

// Default of S3Overrides::timeout_s.
inline constexpr double kDefaultTimeoutS = 600;
// The largest object one CopyObject request may copy (5 GiB).
inline constexpr uint64_t kMaxCopyObjectBytes = uint64_t{5} << 30;

struct RetryClock {
  std::function<double()> now_s;              // a monotonic clock
  std::function<void(double)> sleep_s;        // waits that long
  std::function<double()> uniform01;          // [0, 1)
  std::function<std::chrono::system_clock::time_point()> wall;  // signing
};
// The steady clock, real sleeps, a per-thread random engine.
RetryClock RealRetryClock();

struct S3ClientOptions {
  double timeout_s = kDefaultTimeoutS;  // per request, retries included
  http::BackoffPolicy backoff;
};

struct S3Request {
  std::string operation;  // "GetObject": names the request in errors
  std::string method;
  std::string key;        // empty: the bucket itself
  http::HeaderList query;       // decoded
  http::HeaderList headers;     // sent and signed
  std::string_view body;  // not owned
  // Sign the body's SHA-256; false sends UNSIGNED-PAYLOAD, which spares
  // hashing large parts with SHA-256 (their Content-MD5, which every body
  // carries, lets the store check their bytes).
  bool sign_body = true;
  char* dst = nullptr;  // see http::HttpRequest::dst
  size_t dst_capacity = 0;
  // Non-2xx statuses the caller handles itself: returned as answers, not
  // retried or mapped (HEAD's 404, a conditional PUT's 412, ...).
  std::vector<int> handled_statuses;
  // For answers that report failure in a 2xx body (CompleteMultipartUpload):
  // returns the Error document when there is one.
  std::function<std::optional<ErrorDocument>(const http::HttpResponse&)>
      error_in_answer;
};

struct S3Answer {
  http::HttpResponse response;
  int attempts = 1;
  // An earlier attempt failed in a way that may have left its effect
  // (the connection dropped after sending, a 5xx): a conditional PUT
  // answered 412 now may have lost only to itself.
  bool earlier_attempt_may_have_applied = false;
};

class S3Client {
 public:
  S3Client(S3Config config, std::string bucket,
           std::shared_ptr<http::HttpTransport> transport, S3ClientOptions options,
           RetryClock clock = RealRetryClock());

  Result<S3Answer> Execute(const S3Request& request) const;

  const std::string& bucket() const { return bucket_; }
  const S3ClientOptions& options() const { return options_; }
  // "s3://bucket/key", for messages.
  std::string Url(const std::string& key) const;

  // The S3 operations the storage uses. Keys are passed as they are.
  // GET of `size` bytes at `offset` into dst; 416 is returned as an answer.
  Result<S3Answer> GetRange(const std::string& key, uint64_t offset,
                            uint64_t size, char* dst) const;
  Result<std::string> GetObject(const std::string& key) const;
  // The object's size; nullopt when it does not exist (404).
  Result<std::optional<uint64_t>> HeadObject(const std::string& key) const;
  Status PutObject(const std::string& key, std::string_view data) const;
  // Copies the object `from` to `to` on the server: no byte passes through
  // this host. False when the server does not implement copies (501
  // NotImplemented, as some S3-compatible stores answer); NotFound when
  // `from` does not exist. One request copies at most kMaxCopyObjectBytes
  // (S3's limit).
  Result<bool> CopyObject(const std::string& from, const std::string& to) const;
  Status DeleteObject(const std::string& key) const;
  // Deletes up to 1000 keys in one DeleteObjects request.
  Status DeleteObjects(const std::vector<std::string>& keys) const;
  // One ListObjectsV2 page.
  Result<ListObjectsPage> ListPage(const std::string& prefix,
                                   const std::string& delimiter,
                                   int max_keys,
                                   const std::string& continuation) const;
  // Every object and common prefix under `prefix`, all pages.
  Result<ListObjectsPage> ListAll(const std::string& prefix,
                                  const std::string& delimiter) const;

  Result<std::string> CreateMultipartUpload(const std::string& key) const;
  // Returns the part's ETag.
  Result<std::string> UploadPart(const std::string& key,
                                 const std::string& upload_id, int number,
                                 std::string_view data) const;
  // CommitStateUnknown when the upload is gone (404) after an attempt
  // whose answer was lost, which may have completed it.
  Status CompleteMultipartUpload(const std::string& key,
                                 const std::string& upload_id,
                                 const std::vector<CompletedPart>& parts) const;
  Status AbortMultipartUpload(const std::string& key,
                              const std::string& upload_id) const;
  // The multipart uploads in progress whose keys start with `prefix`.
  Result<std::vector<MultipartUploadsPage::Upload>> ListMultipartUploads(
      const std::string& prefix) const;

 private:
  // The Error document a HEAD could not carry, from a one-byte GET.
  std::optional<ErrorDocument> DiagnoseHead(const std::string& key) const;

  S3Config config_;
  std::string bucket_;
  std::shared_ptr<http::HttpTransport> transport_;
  S3ClientOptions options_;
  RetryClock clock_;
};

}  // namespace shardkeep::s3

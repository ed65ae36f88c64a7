// What a failed S3 request means to shardkeep: the Status it becomes, and
// whether trying again can help. Pure functions of the outcome (transport,
// HTTP status, decoded Error document); the client owns the loop, the clock
// and the random source, so retry schedules are testable exactly.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "shardkeep/status.h"
#include "storage/s3/s3_xml.h"

namespace shardkeep::s3 {

// How the HTTP exchange ended, as the client's transport reports it.
enum class Transport {
  kAnswered,          // the server sent a status line; see http_status
  kConnectFailed,     // refused or unreachable (a server restarting)
  kConnectionReset,   // dropped mid-request or mid-answer
  kTimedOut,          // no progress within the transfer timeout
  kResolveFailed,     // the endpoint's host name does not resolve
  kTlsFailed,         // handshake or certificate verification failed
};

// One failed request: what it was, and how it failed.
struct S3Failure {
  std::string operation;      // "PutObject", "ListObjectsV2", ...
  std::string bucket;
  std::string key;            // empty for bucket-level requests
  std::string access_key_id;  // named in credential hints; never the secret
  Transport transport = Transport::kAnswered;
  std::string transport_detail;  // the transport's own words
  int http_status = 0;           // when transport == kAnswered
  // The decoded Error body; absent for HEAD requests and bodies that did
  // not decode.
  std::optional<ErrorDocument> error;
};

// True when the same request may succeed later: 5xx except 501, 429,
// throttling and timeout codes, conflicting conditional requests in
// progress, and lost connections. Not for 4xx answers such as 400, 403,
// 404 and 412, nor for a host name that does not resolve or a failed TLS
// handshake, which waiting does not fix.
bool IsRetryable(const S3Failure& failure);

// The shardkeep Status for a failure; the message names the operation,
// s3://bucket/key, the HTTP status, the server's code, message and request
// id. NotFound for 404/NoSuchKey/NoSuchUpload; InvalidArgument for
// NoSuchBucket (a configuration error, not an empty prefix); AlreadyExists
// for 412 PreconditionFailed (a conditional PUT lost to another writer);
// InvalidArgument with a hint for credentials the server rejects;
// OutOfSpace where the store says it is full or over quota; Storage for
// everything else.
Status ToStatus(const S3Failure& failure);

struct BackoffPolicy {
  double initial_s = 0.05;  // upper bound of the first wait
  double max_s = 5.0;       // no wait exceeds this
};

// The wait before retry number `retry` (1 for the first): "full jitter",
// uniform in [0, min(max_s, initial_s * 2^(retry-1))), drawn from
// `uniform01`, which returns values in [0, 1). Returns nullopt when the
// wait would not end before `remaining_s` (the time left of the caller's
// timeout_s), so the caller gives up and reports the last failure.
std::optional<double> BackoffBeforeRetry(
    const BackoffPolicy& policy, int retry, double remaining_s,
    const std::function<double()>& uniform01);

}  // namespace shardkeep::s3

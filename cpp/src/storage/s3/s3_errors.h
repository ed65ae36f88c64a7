// What a failed S3 request means to shardkeep: the Status it becomes, and
// whether trying again can help. Pure functions of the outcome (transport,
// HTTP status, decoded Error document); the client owns the loop, the clock
// and the random source, so retry schedules are testable exactly.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "shardkeep/status.h"
#include "storage/http/http_transport.h"
#include "storage/s3/s3_xml.h"

namespace shardkeep::s3 {

// One failed request: what it was, and how it failed.
struct S3Failure {
  std::string operation;      // "PutObject", "ListObjectsV2", ...
  std::string bucket;
  std::string key;            // empty for bucket-level requests
  std::string access_key_id;  // named in credential hints; never the secret
  http::Transport transport = http::Transport::kAnswered;
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

}  // namespace shardkeep::s3

// What a failed GCS request means to shardkeep: the Status it becomes, and
// whether trying again can help, as GCS's own retry strategy says (408,
// 429, 5xx and lost connections; never 4xx otherwise). Pure functions of
// the outcome; the client owns the loop.
#pragma once

#include <optional>
#include <string>

#include "shardkeep/status.h"
#include "storage/http/http_transport.h"

namespace shardkeep::gcs {

// GCS's JSON error body: {"error": {"code": 404, "message": "...",
// "errors": [{"reason": "notFound", ...}]}}.
struct GcsErrorBody {
  std::string reason;  // the first error's reason
  std::string message;
};
std::optional<GcsErrorBody> DecodeGcsError(const std::string& body);

struct GcsFailure {
  std::string operation;  // "objects.insert", ...
  std::string bucket;
  std::string object;     // empty for bucket-level requests
  std::string principal;  // who asked (Credentials::Principal)
  http::Transport transport = http::Transport::kAnswered;
  std::string transport_detail;
  int http_status = 0;
  std::optional<GcsErrorBody> error;
};

bool IsRetryable(const GcsFailure& failure);
// The same rule for any request to Google (token endpoints, the metadata
// server): 408, 429, 5xx but 501, and lost connections.
bool IsRetryable(http::Transport transport, int http_status);

// NotFound for 404 on an object, InvalidArgument for a bucket that does not
// exist, AlreadyExists for 412, InvalidArgument naming the principal for
// 401 and 403, OutOfSpace for quota, Storage otherwise. The message names
// the operation, gs://bucket/object, the status and Google's reason and
// message.
Status ToStatus(const GcsFailure& failure);

}  // namespace shardkeep::gcs

// Requests to one GCS bucket over its JSON API, authorized by Credentials,
// retried as GCS's retry strategy says, each bounded by timeout_s.
//
// Which requests are retried: GCS retries only idempotent ones. Reads,
// listings, deletes and compose/rewrite into a save's own new objects are;
// so are uploads, either guarded by a generation precondition or writing an
// object of this save's own with fixed bytes (a repeat stores the same
// object). A 401 drops the cached token and tries once more with a new one.
//
// Integrity: every upload carries its CRC32C, which GCS checks before it
// stores anything; every whole-object download is checked against the
// x-goog-hash GCS sends with it (ranged reads are covered by the chunks'
// own checksums).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardkeep/status.h"
#include "storage/gcs/gcs_credentials.h"
#include "storage/gcs/gcs_errors.h"
#include "storage/http/backoff.h"
#include "storage/http/http_transport.h"

namespace shardkeep::gcs {

inline constexpr double kDefaultTimeoutS = 600;
inline constexpr const char* kDefaultEndpoint = "https://storage.googleapis.com";
// Compose joins at most this many objects in one request.
inline constexpr size_t kMaxComposeSources = 32;

struct GcsClientOptions {
  double timeout_s = kDefaultTimeoutS;  // per request, retries included
  http::BackoffPolicy backoff;
};

struct GcsRequest {
  std::string operation;  // "objects.get": names the request in errors
  std::string method;
  std::string object;     // for messages; empty for bucket-level requests
  std::string url;        // complete, percent-encoded
  http::HeaderList headers;
  std::string body_head;  // see HttpRequest::body
  std::string_view body;  // not owned
  std::string body_tail;
  char* dst = nullptr;    // see HttpRequest::dst
  size_t dst_capacity = 0;
  // Non-2xx statuses the caller handles itself (404 of a lookup, 412 of a
  // create-only upload), returned as answers.
  std::vector<int> handled_statuses;
};

struct GcsAnswer {
  http::HttpResponse response;
  // An earlier attempt may have taken effect before its answer was lost.
  bool earlier_attempt_may_have_applied = false;
};

struct ObjectInfo {
  uint64_t size = 0;
  int64_t generation = 0;
  std::string crc32c;  // base64, as GCS reports it
};

struct ListPage {
  std::vector<std::pair<std::string, uint64_t>> objects;  // name, size
  std::vector<std::string> prefixes;
  std::string next_page_token;
};

class GcsClient {
 public:
  GcsClient(std::string endpoint, std::string bucket,
            std::shared_ptr<Credentials> credentials,
            std::shared_ptr<http::HttpTransport> transport,
            GcsClientOptions options, TokenClock clock = RealTokenClock());

  Result<GcsAnswer> Execute(const GcsRequest& request) const;

  const std::string& bucket() const { return bucket_; }
  // "gs://bucket/object", for messages.
  std::string Url(const std::string& object) const;

  // `size` bytes at `offset` into dst; 416 is returned as an answer.
  Result<GcsAnswer> GetRange(const std::string& object, uint64_t offset,
                             uint64_t size, char* dst) const;
  // The whole object, checked against its x-goog-hash CRC32C.
  Result<std::string> GetObject(const std::string& object) const;
  // nullopt when it does not exist.
  Result<std::optional<ObjectInfo>> GetInfo(const std::string& object) const;
  // Stores `data` as `object` with its CRC32C. With if_generation_match,
  // only when the object's generation is that (0: only when absent);
  // AlreadyExists otherwise.
  Result<ObjectInfo> Upload(const std::string& object, std::string_view data,
                            std::optional<int64_t> if_generation_match) const;
  // NotFound when absent.
  Status Delete(const std::string& object) const;
  // A server-side copy, however many rewrite calls it takes.
  Status Rewrite(const std::string& from, const std::string& to) const;
  // Joins up to kMaxComposeSources objects, in order, into `to`.
  Result<ObjectInfo> Compose(const std::vector<std::string>& sources,
                             const std::string& to) const;
  Result<ListPage> ListPageOf(const std::string& prefix, const std::string& delimiter,
                              int max_results, const std::string& page_token) const;
  // Every object and prefix under `prefix`, all pages.
  Result<ListPage> ListAll(const std::string& prefix, const std::string& delimiter) const;

 private:
  std::string ObjectUrl(const std::string& object) const;

  std::string endpoint_;
  std::string bucket_;
  std::shared_ptr<Credentials> credentials_;
  std::shared_ptr<http::HttpTransport> transport_;
  GcsClientOptions options_;
  TokenClock clock_;
};

// Percent-encodes all but RFC 3986's unreserved characters: an object name
// as one path segment or query value.
std::string EncodeComponent(std::string_view text);

}  // namespace shardkeep::gcs

// The HTTP exchange under the S3 client, behind a small interface so that
// the client's retry logic is tested with a scripted fake and the real
// transport (libcurl, curl_transport.h) is swapped in for servers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "storage/s3/s3_errors.h"
#include "storage/s3/sigv4.h"

namespace shardkeep::s3 {

struct HttpRequest {
  std::string method;  // "GET", "HEAD", "PUT", "POST", "DELETE"
  std::string url;     // fully percent-encoded, query included
  HeaderList headers;  // sent as given (the signer's among them)
  // The body of PUT and POST, read straight from the caller's memory; it
  // must stay valid until Perform returns.
  std::string_view body;
  // When set, the body of a 2xx answer is written here (at most
  // dst_capacity bytes) instead of into HttpResponse::body, so that a
  // ranged GET lands in the caller's buffer without a copy.
  char* dst = nullptr;
  size_t dst_capacity = 0;
  // The whole exchange must end within this many seconds (0: no limit).
  double timeout_s = 0;
};

struct HttpResponse {
  Transport transport = Transport::kAnswered;
  std::string transport_detail;  // the transport's own words on a failure
  int status = 0;                // when transport == kAnswered
  // A non-2xx body (an Error document, cut at kMaxErrorBody), or a 2xx
  // body when the request has no dst.
  std::string body;
  size_t dst_bytes = 0;       // bytes written into HttpRequest::dst
  bool dst_overflow = false;  // the answer was longer than dst_capacity
  std::string etag;           // the ETag header, quotes kept
  std::optional<uint64_t> content_length;
};

// Error documents are small; a longer non-2xx body is cut here.
inline constexpr size_t kMaxErrorBody = size_t{1} << 20;

class HttpTransport {
 public:
  virtual ~HttpTransport() = default;
  // Performs one exchange on the calling thread; failures are reported in
  // `response`, never thrown. Safe to call from many threads at once.
  virtual void Perform(const HttpRequest& request, HttpResponse* response) = 0;
};

}  // namespace shardkeep::s3

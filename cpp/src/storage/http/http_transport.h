// The HTTP exchange under the object-store clients (S3, GCS), behind a small
// interface so that each client's retry logic is tested with a scripted
// fake and the real transport (libcurl, curl_transport.h) is swapped in for
// servers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <utility>
#include <vector>

#include "shardkeep/status.h"

namespace shardkeep::http {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

// How the HTTP exchange ended, as the transport reports it.
enum class Transport {
  kAnswered,          // the server sent a status line; see HttpResponse::status
  kConnectFailed,     // refused or unreachable (a server restarting)
  kConnectionReset,   // dropped mid-request or mid-answer
  kTimedOut,          // no progress within the transfer timeout
  kResolveFailed,     // the endpoint's host name does not resolve
  kTlsFailed,         // handshake or certificate verification failed
};

// "connection reset", for messages.
const char* TransportName(Transport transport);

// Whether a request that ended this way may succeed if sent again; nullopt
// when the server answered, and its answer decides. Refused, reset and
// timed-out connections may (a server restarting, a network hiccup); a host
// name that does not resolve or a failed TLS handshake, which waiting does
// not fix, may not.
std::optional<bool> TransientTransport(Transport transport);

// "connection reset: <the transport's own words>", for messages of a request
// that got no answer.
std::string TransportFailureText(Transport transport, const std::string& detail);

// Text from a server (an error's message, a request id) as it may appear in
// messages and logs: at most 256 characters, on one line.
std::string Printable(std::string_view text);


struct HttpRequest {
  std::string method;  // "GET", "HEAD", "PUT", "POST", "DELETE"
  std::string url;     // fully percent-encoded, query included
  HeaderList headers;  // sent as given (the signer's among them)
  // The body of PUT and POST, read straight from the caller's memory; it
  // must stay valid until Perform returns. It is sent between body_head
  // and body_tail, so that a multipart request wraps the caller's bytes
  // without copying them.
  std::string body_head;
  std::string_view body;
  std::string body_tail;
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
  // Every other header of the final answer, names in lower case
  // ("x-goog-hash", "location"), values without surrounding blanks.
  HeaderList headers;
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

// The value of the answer's header `name` (lower case), if it has one.
std::optional<std::string> FindHeader(const HttpResponse& response,
                                      std::string_view name);

// Corruption naming `url` unless `response`, to a ranged GET of `size` bytes
// at `offset` into HttpRequest::dst, is those bytes: a 206, or a 200 of the
// whole object read from offset 0, that filled exactly `size` bytes.
Status CheckRangedRead(const HttpResponse& response, const std::string& url,
                       uint64_t offset, uint64_t size);

}  // namespace shardkeep::http

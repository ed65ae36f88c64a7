// AWS Signature Version 4 for requests to S3 and S3-compatible servers.
//
// shardkeep signs its requests itself rather than through libcurl's
// CURLOPT_AWS_SIGV4, because the libcurl of Debian 12 (7.88) does not sort
// the query parameters of the canonical request, so any request with two or
// more parameters (a listing, a multipart part upload) fails the server's
// signature check.
//
// The signing steps (all pure functions of their inputs):
//   1. Canonical request: method, canonical URI, canonical query string,
//      canonical headers, signed header names, payload hash, one per line.
//      S3 rules: the path is URI-encoded once, segment by segment ('/' kept),
//      and is never normalised ("a//b" and "a/./b" are distinct keys).
//      Query names and values are URI-encoded ('/' too) and sorted by
//      encoded name, then encoded value.
//      Header names are lower-cased and sorted; values are trimmed, runs of
//      spaces become one space, and repeated names join their values with
//      ',' in the order given.
//   2. String to sign: algorithm, request time, scope
//      (date/region/service/aws4_request), SHA-256 of the canonical request.
//   3. Signing key: HMAC-SHA256 chain over "AWS4"+secret, date, region,
//      service, "aws4_request"; the signature is the HMAC of the string to
//      sign under that key.
//
// Thread-safety: every function here is reentrant.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shardkeep/status.h"
#include "storage/http/http_transport.h"

namespace shardkeep::s3 {

// The payload hash of a request whose body is not hashed (a streamed part):
// the signature then covers the headers but not the body.
inline constexpr std::string_view kUnsignedPayload = "UNSIGNED-PAYLOAD";
// SHA-256 of the empty string: the payload hash of GET, HEAD and DELETE.
inline constexpr std::string_view kEmptyPayloadSha256 =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

// Long-term or temporary (STS) credentials. The secret and the session
// token must never be written to an error message or a log.
struct AwsCredentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // empty: long-term credentials
};

struct HttpRequestToSign {
  std::string method;  // "GET", "PUT", ...
  // The Host header as sent: "bucket.s3.us-east-1.amazonaws.com",
  // "127.0.0.1:8333".
  std::string host;
  // The decoded path, starting with '/': "/bucket/dir/key name" for
  // path-style addressing. Encoded here; an empty path signs as "/".
  std::string path;
  // Decoded query parameters in any order; a parameter without value
  // ("?uploads") has an empty value.
  http::HeaderList query;
  // Further headers to sign, in any case and order (range, content-type,
  // if-none-match, ...). Must not contain host, x-amz-date,
  // x-amz-content-sha256, x-amz-security-token or authorization, which the
  // signer sets.
  http::HeaderList headers;
  // Lower-case hex SHA-256 of the body, or kUnsignedPayload.
  std::string payload_sha256 = std::string(kEmptyPayloadSha256);
};

struct SigningContext {
  AwsCredentials credentials;
  std::string region;   // "us-east-1"
  std::string service;  // "s3"
  std::chrono::system_clock::time_point time;
};

struct SigV4Signature {
  // Intermediate texts, for tests and for diagnosing a server's
  // SignatureDoesNotMatch (which returns its own string to sign). The
  // canonical request holds the session token when there is one: log
  // neither it nor `headers_to_add`.
  std::string canonical_request;
  std::string string_to_sign;
  std::string signature;  // lower-case hex
  // Headers the caller adds to the request besides those it passed in:
  // x-amz-date, x-amz-content-sha256 (SignS3Request only),
  // x-amz-security-token (temporary credentials), authorization.
  http::HeaderList headers_to_add;
};

// Signs `request` for any SigV4 service: the signed headers are host,
// x-amz-date, x-amz-security-token (when the credentials have a session
// token) and request.headers. InvalidArgument when a header name is empty
// or reserved, a name or value holds a control character (which could
// smuggle a header), or the method, host or a credential is empty.
Result<SigV4Signature> SignRequest(const HttpRequestToSign& request,
                                   const SigningContext& context);

// As SignRequest, and also signs and returns x-amz-content-sha256 (set to
// request.payload_sha256), which S3 requires on every request.
Result<SigV4Signature> SignS3Request(const HttpRequestToSign& request,
                                     const SigningContext& context);

// RFC 3986 percent-encoding as SigV4 wants it: every byte except
// A-Z a-z 0-9 - . _ ~ becomes %XX (upper-case hex); '/' is kept when
// `keep_slash`.
std::string UriEncode(std::string_view text, bool keep_slash);

// Lower-case hex SHA-256 of `data`.
std::string Sha256Hex(std::string_view data);

}  // namespace shardkeep::s3

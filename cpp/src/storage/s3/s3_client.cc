#include "storage/s3/s3_client.h"

#include <openssl/evp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>
#include <utility>

#include "storage/read_counter.h"

namespace shardkeep::s3 {
namespace {

// Bodies up to this size are hashed into the signature; larger ones (parts,
// big objects) go as UNSIGNED-PAYLOAD.
constexpr size_t kMaxSignedBody = size_t{1} << 20;

std::string QueryString(const http::HeaderList& query) {
  std::vector<std::string> pairs;
  pairs.reserve(query.size());
  for (const auto& [name, value] : query) {
    pairs.push_back(UriEncode(name, false) + "=" + UriEncode(value, false));
  }
  std::sort(pairs.begin(), pairs.end());
  std::string out;
  for (const std::string& pair : pairs) {
    out += out.empty() ? "?" : "&";
    out += pair;
  }
  return out;
}

bool Is2xx(int status) { return status >= 200 && status < 300; }

std::string FormatSeconds(double s) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.1f", s);
  return buffer;
}

// Base64 of the MD5 of `data`: the Content-MD5 header of a body.
Result<std::string> ContentMd5(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(data.data(), data.size(), digest, &length, EVP_md5(),
                 nullptr) != 1) {
    return InternalError("MD5 of a request body failed");
  }
  std::string out(4 * ((length + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                digest, static_cast<int>(length));
  out.resize(static_cast<size_t>(n));
  return out;
}

}  // namespace

RetryClock RealRetryClock() {
  RetryClock clock;
  clock.now_s = [] {
    return std::chrono::duration<double>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  clock.sleep_s = [](double s) {
    std::this_thread::sleep_for(std::chrono::duration<double>(s));
  };
  clock.uniform01 = [] {
    thread_local std::mt19937_64 engine{std::random_device{}()};
    return std::uniform_real_distribution<double>(0.0, 1.0)(engine);
  };
  clock.wall = [] { return std::chrono::system_clock::now(); };
  return clock;
}

S3Client::S3Client(S3Config config, std::string bucket,
                   std::shared_ptr<http::HttpTransport> transport,
                   S3ClientOptions options, RetryClock clock)
    : config_(std::move(config)),
      bucket_(std::move(bucket)),
      transport_(std::move(transport)),
      options_(options),
      clock_(std::move(clock)) {}

std::string S3Client::Url(const std::string& key) const {
  return "s3://" + bucket_ + (key.empty() ? "" : "/" + key);
}

Result<S3Answer> S3Client::Execute(const S3Request& request) const {
  const S3ObjectAddress address = AddressObject(config_, bucket_, request.key);
  const std::string url = address.base_url + UriEncode(address.path, true) +
                          QueryString(request.query);
  std::string payload_hash(kEmptyPayloadSha256);
  http::HeaderList headers = request.headers;
  if (!request.body.empty()) {
    payload_hash = request.sign_body && request.body.size() <= kMaxSignedBody
                       ? Sha256Hex(request.body)
                       : std::string(kUnsignedPayload);
    // Computed once, sent with every attempt: the store refuses a body
    // that does not match it (BadDigest, retried) instead of storing it.
    SK_ASSIGN_OR_RETURN(std::string md5, ContentMd5(request.body));
    headers.emplace_back("Content-MD5", std::move(md5));
  }
  S3Failure failure;
  failure.operation = request.operation;
  failure.bucket = bucket_;
  failure.key = request.key;
  failure.access_key_id = config_.credentials.access_key_id;

  const double start = clock_.now_s();
  const double deadline = start + options_.timeout_s;
  S3Answer answer;
  for (int attempt = 1;; ++attempt) {
    HttpRequestToSign to_sign;
    to_sign.method = request.method;
    to_sign.host = address.host;
    to_sign.path = address.path;
    to_sign.query = request.query;
    to_sign.headers = headers;
    to_sign.payload_sha256 = payload_hash;
    const SigningContext context{config_.credentials, config_.region, "s3",
                                 clock_.wall()};
    SK_ASSIGN_OR_RETURN(SigV4Signature signature,
                        SignS3Request(to_sign, context));

    http::HttpRequest http;
    http.method = request.method;
    http.url = url;
    http.headers = headers;
    // The Host signed, port included, whatever curl would have sent.
    http.headers.emplace_back("Host", address.host);
    for (auto& header : signature.headers_to_add) {
      http.headers.push_back(std::move(header));
    }
    http.body = request.body;
    http.dst = request.dst;
    http.dst_capacity = request.dst_capacity;
    http.timeout_s = std::max(0.001, deadline - clock_.now_s());
    transport_->Perform(http, &answer.response);
    answer.attempts = attempt;

    const http::HttpResponse& response = answer.response;
    failure.transport = response.transport;
    failure.transport_detail = response.transport_detail;
    failure.http_status = response.status;
    failure.error.reset();
    if (response.transport == http::Transport::kAnswered) {
      if (response.dst_overflow) {
        return CorruptionError(request.operation + " " + Url(request.key) +
                               ": the answer is longer than the " +
                               std::to_string(request.dst_capacity) +
                               " bytes asked for");
      }
      if (Is2xx(response.status)) {
        if (request.error_in_answer) failure.error = request.error_in_answer(response);
        if (!failure.error) return answer;
      } else if (std::find(request.handled_statuses.begin(),
                           request.handled_statuses.end(),
                           response.status) != request.handled_statuses.end()) {
        return answer;
      } else if (!response.body.empty()) {
        Result<ErrorDocument> document = DecodeErrorDocument(
            response.body, request.operation + " " + Url(request.key));
        if (document.ok()) failure.error = std::move(document).value();
      } else if (request.method == "HEAD" && response.status >= 400 &&
                 response.status < 500) {
        // HEAD answers carry no Error document; a one-byte GET of the
        // same object says what is wrong (a wrong secret, say).
        failure.error = DiagnoseHead(request.key);
      }
    }
    if (!IsRetryable(failure)) {
      const Status status = ToStatus(failure);
      if (attempt == 1) return status;
      return Status(status.code(), status.message() + " (after " +
                                       std::to_string(attempt) + " attempts)");
    }
    // Only a request that never reached the server surely had no effect.
    if (failure.transport != http::Transport::kConnectFailed) {
      answer.earlier_attempt_may_have_applied = true;
    }
    const std::optional<double> wait =
        http::BackoffBeforeRetry(options_.backoff, attempt, deadline - clock_.now_s(),
                           clock_.uniform01);
    if (!wait) {
      const Status status = ToStatus(failure);
      return Status(status.code(),
                    status.message() + " (gave up after " +
                        std::to_string(attempt) + " attempts in " +
                        FormatSeconds(clock_.now_s() - start) +
                        " s; timeout_s is " +
                        FormatSeconds(options_.timeout_s) + ")");
    }
    clock_.sleep_s(*wait);
  }
}

std::optional<ErrorDocument> S3Client::DiagnoseHead(
    const std::string& key) const {
  const S3ObjectAddress address = AddressObject(config_, bucket_, key);
  HttpRequestToSign to_sign;
  to_sign.method = "GET";
  to_sign.host = address.host;
  to_sign.path = address.path;
  to_sign.headers = {{"Range", "bytes=0-0"}};
  const SigningContext context{config_.credentials, config_.region, "s3",
                               clock_.wall()};
  Result<SigV4Signature> signature = SignS3Request(to_sign, context);
  if (!signature.ok()) return std::nullopt;
  http::HttpRequest http;
  http.method = "GET";
  http.url = address.base_url + UriEncode(address.path, true);
  http.headers = to_sign.headers;
  http.headers.emplace_back("Host", address.host);
  for (auto& header : signature->headers_to_add) {
    http.headers.push_back(std::move(header));
  }
  char byte = 0;
  http.dst = &byte;
  http.dst_capacity = 1;
  http.timeout_s = std::min(10.0, options_.timeout_s);
  http::HttpResponse response;
  transport_->Perform(http, &response);
  if (response.transport != http::Transport::kAnswered || response.body.empty()) {
    return std::nullopt;
  }
  Result<ErrorDocument> document =
      DecodeErrorDocument(response.body, "GetObject " + Url(key));
  if (!document.ok()) return std::nullopt;
  return std::move(document).value();
}

Result<S3Answer> S3Client::GetRange(const std::string& key, uint64_t offset,
                                    uint64_t size, char* dst) const {
  S3Request request;
  request.operation = "GetObject";
  request.method = "GET";
  request.key = key;
  request.headers.emplace_back("Range", "bytes=" + std::to_string(offset) +
                                            "-" +
                                            std::to_string(offset + size - 1));
  request.dst = dst;
  request.dst_capacity = size;
  request.handled_statuses = {416};  // InvalidRange: starts past the end
  SK_ASSIGN_OR_RETURN(S3Answer answer, Execute(request));
  CountStorageBytesRead(answer.response.dst_bytes);
  return answer;
}

Result<std::string> S3Client::GetObject(const std::string& key) const {
  S3Request request;
  request.operation = "GetObject";
  request.method = "GET";
  request.key = key;
  SK_ASSIGN_OR_RETURN(S3Answer answer, Execute(request));
  CountStorageBytesRead(answer.response.body.size());
  return std::move(answer.response.body);
}

Result<std::optional<uint64_t>> S3Client::HeadObject(
    const std::string& key) const {
  S3Request request;
  request.operation = "HeadObject";
  request.method = "HEAD";
  request.key = key;
  request.handled_statuses = {404};
  SK_ASSIGN_OR_RETURN(S3Answer answer, Execute(request));
  if (answer.response.status == 404) return std::optional<uint64_t>();
  if (!answer.response.content_length) {
    return StorageError("HeadObject " + Url(key) +
                        ": the answer has no Content-Length");
  }
  return std::optional<uint64_t>(*answer.response.content_length);
}

Status S3Client::PutObject(const std::string& key,
                           std::string_view data) const {
  S3Request request;
  request.operation = "PutObject";
  request.method = "PUT";
  request.key = key;
  request.body = data;
  return Execute(request).status();
}

Result<bool> S3Client::CopyObject(const std::string& from,
                                  const std::string& to) const {
  S3Request request;
  request.operation = "CopyObject";
  request.method = "PUT";
  request.key = to;
  request.headers = {{"x-amz-copy-source",
                      "/" + bucket_ + "/" + UriEncode(from, /*keep_slash=*/true)}};
  // A copy that fails once begun is answered 200 with an Error document.
  request.error_in_answer =
      [](const http::HttpResponse& response) -> std::optional<ErrorDocument> {
    Result<ErrorDocument> error = DecodeErrorDocument(response.body, "");
    if (error.ok()) return std::move(error).value();
    return std::nullopt;
  };
  request.handled_statuses = {404, 501};
  SK_ASSIGN_OR_RETURN(S3Answer answer, Execute(request));
  if (answer.response.status == 404) {
    return NotFoundError("CopyObject " + Url(from) + " to " + Url(to) + ": " +
                         Url(from) + " does not exist");
  }
  return answer.response.status != 501;
}

Status S3Client::DeleteObject(const std::string& key) const {
  S3Request request;
  request.operation = "DeleteObject";
  request.method = "DELETE";
  request.key = key;
  request.handled_statuses = {404};  // gone already
  return Execute(request).status();
}

Status S3Client::DeleteObjects(const std::vector<std::string>& keys) const {
  SK_ASSIGN_OR_RETURN(std::string body, EncodeDeleteObjects(keys));
  S3Request request;
  request.operation = "DeleteObjects";
  request.method = "POST";
  request.query = {{"delete", ""}};
  request.body = body;  // Execute adds the Content-MD5 it requires
  SK_ASSIGN_OR_RETURN(S3Answer answer, Execute(request));
  const std::string what = "DeleteObjects " + Url("");
  SK_ASSIGN_OR_RETURN(std::vector<DeleteError> errors,
                      DecodeDeleteObjects(answer.response.body, what));
  for (const DeleteError& error : errors) {
    if (error.error.code == "NoSuchKey") continue;  // gone already
    S3Failure failure;
    failure.operation = "DeleteObjects";
    failure.bucket = bucket_;
    failure.key = error.key;
    failure.access_key_id = config_.credentials.access_key_id;
    failure.http_status = answer.response.status;
    failure.error = error.error;
    return ToStatus(failure);
  }
  return Status::Ok();
}

Result<ListObjectsPage> S3Client::ListPage(
    const std::string& prefix, const std::string& delimiter, int max_keys,
    const std::string& continuation) const {
  S3Request request;
  request.operation = "ListObjectsV2";
  request.method = "GET";
  request.query = {{"list-type", "2"}, {"encoding-type", "url"}};
  request.query.emplace_back("prefix", prefix);
  if (!delimiter.empty()) request.query.emplace_back("delimiter", delimiter);
  if (max_keys > 0) {
    request.query.emplace_back("max-keys", std::to_string(max_keys));
  }
  if (!continuation.empty()) {
    request.query.emplace_back("continuation-token", continuation);
  }
  SK_ASSIGN_OR_RETURN(S3Answer answer, Execute(request));
  return DecodeListObjectsV2(answer.response.body,
                             "ListObjectsV2 " + Url(prefix));
}

Result<ListObjectsPage> S3Client::ListAll(const std::string& prefix,
                                          const std::string& delimiter) const {
  ListObjectsPage all;
  std::string continuation;
  do {
    SK_ASSIGN_OR_RETURN(ListObjectsPage page,
                        ListPage(prefix, delimiter, 0, continuation));
    for (ListedObject& object : page.objects) {
      all.objects.push_back(std::move(object));
    }
    for (std::string& common : page.common_prefixes) {
      all.common_prefixes.push_back(std::move(common));
    }
    continuation = page.is_truncated ? page.next_continuation_token : "";
  } while (!continuation.empty());
  return all;
}

Result<std::string> S3Client::CreateMultipartUpload(
    const std::string& key) const {
  S3Request request;
  request.operation = "CreateMultipartUpload";
  request.method = "POST";
  request.key = key;
  request.query = {{"uploads", ""}};
  SK_ASSIGN_OR_RETURN(S3Answer answer, Execute(request));
  return DecodeInitiateMultipartUpload(
      answer.response.body, "CreateMultipartUpload " + Url(key));
}

Result<std::string> S3Client::UploadPart(const std::string& key,
                                         const std::string& upload_id,
                                         int number,
                                         std::string_view data) const {
  S3Request request;
  request.operation = "UploadPart " + std::to_string(number);
  request.method = "PUT";
  request.key = key;
  request.query = {{"partNumber", std::to_string(number)},
                   {"uploadId", upload_id}};
  request.body = data;
  request.sign_body = false;
  SK_ASSIGN_OR_RETURN(S3Answer answer, Execute(request));
  if (answer.response.etag.empty()) {
    return StorageError(request.operation + " " + Url(key) +
                        ": the answer has no ETag");
  }
  return std::move(answer.response.etag);
}

Status S3Client::CompleteMultipartUpload(
    const std::string& key, const std::string& upload_id,
    const std::vector<CompletedPart>& parts) const {
  SK_ASSIGN_OR_RETURN(std::string body, EncodeCompleteMultipartUpload(parts));
  const std::string what = "CompleteMultipartUpload " + Url(key);
  S3Request request;
  request.operation = "CompleteMultipartUpload";
  request.method = "POST";
  request.key = key;
  request.query = {{"uploadId", upload_id}};
  request.body = body;
  request.error_in_answer =
      [&what](const http::HttpResponse& response) -> std::optional<ErrorDocument> {
    Result<CompleteMultipartUploadAnswer> decoded =
        DecodeCompleteMultipartUpload(response.body, what);
    if (decoded.ok() && decoded->error) return decoded->error;
    return std::nullopt;
  };
  request.handled_statuses = {404};
  SK_ASSIGN_OR_RETURN(S3Answer answer, Execute(request));
  if (answer.response.status == 404) {
    if (answer.earlier_attempt_may_have_applied) {
      return CommitStateUnknownError(
          what + ": the upload is gone after an attempt whose answer was "
          "lost; that attempt may have completed it");
    }
    return NotFoundError(what + ": HTTP 404, no such upload");
  }
  return DecodeCompleteMultipartUpload(answer.response.body, what).status();
}

Status S3Client::AbortMultipartUpload(const std::string& key,
                                      const std::string& upload_id) const {
  S3Request request;
  request.operation = "AbortMultipartUpload";
  request.method = "DELETE";
  request.key = key;
  request.query = {{"uploadId", upload_id}};
  request.handled_statuses = {404};  // NoSuchUpload: aborted or completed
  return Execute(request).status();
}

Result<std::vector<MultipartUploadsPage::Upload>>
S3Client::ListMultipartUploads(const std::string& prefix) const {
  std::vector<MultipartUploadsPage::Upload> uploads;
  std::string key_marker;
  std::string upload_id_marker;
  while (true) {
    S3Request request;
    request.operation = "ListMultipartUploads";
    request.method = "GET";
    request.query = {{"uploads", ""}, {"prefix", prefix}};
    if (!key_marker.empty()) request.query.emplace_back("key-marker", key_marker);
    if (!upload_id_marker.empty()) {
      request.query.emplace_back("upload-id-marker", upload_id_marker);
    }
    SK_ASSIGN_OR_RETURN(S3Answer answer, Execute(request));
    SK_ASSIGN_OR_RETURN(
        MultipartUploadsPage page,
        DecodeListMultipartUploads(answer.response.body,
                                   "ListMultipartUploads " + Url(prefix)));
    for (auto& upload : page.uploads) uploads.push_back(std::move(upload));
    if (!page.is_truncated) return uploads;
    key_marker = page.next_key_marker;
    upload_id_marker = page.next_upload_id_marker;
  }
}

}  // namespace shardkeep::s3

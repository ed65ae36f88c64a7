#include "storage/http/curl_transport.h"

#include <curl/curl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace shardkeep::http {
namespace {

// Idle handles kept beyond this are closed; more threads than this rarely
// talk to one store at once.
constexpr size_t kMaxIdleHandles = 64;
// A stalled transfer (a server that stopped answering mid-body) counts as
// timed out after this long without progress, well before timeout_s.
constexpr long kStallSeconds = 30;
constexpr long kConnectTimeoutMs = 10000;

void GlobalInitOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// What the callbacks of one exchange share.
struct Exchange {
  CURL* handle = nullptr;
  const HttpRequest* request = nullptr;
  HttpResponse* response = nullptr;
  size_t body_sent = 0;
};

bool Is2xx(CURL* handle) {
  long code = 0;
  curl_easy_getinfo(handle, CURLINFO_RESPONSE_CODE, &code);
  return code >= 200 && code < 300;
}

size_t OnBody(char* data, size_t one, size_t n, void* user) {
  auto* exchange = static_cast<Exchange*>(user);
  const size_t size = one * n;
  HttpResponse& response = *exchange->response;
  const HttpRequest& request = *exchange->request;
  if (request.dst != nullptr && Is2xx(exchange->handle)) {
    if (size > request.dst_capacity - response.dst_bytes) {
      response.dst_overflow = true;
      return 0;  // aborts the transfer
    }
    std::memcpy(request.dst + response.dst_bytes, data, size);
    response.dst_bytes += size;
    return size;
  }
  if (request.dst == nullptr && Is2xx(exchange->handle)) {
    response.body.append(data, size);
  } else if (response.body.size() < kMaxErrorBody) {
    response.body.append(data,
                         std::min(size, kMaxErrorBody - response.body.size()));
  }
  return size;
}

size_t OnSend(char* buffer, size_t one, size_t n, void* user) {
  auto* exchange = static_cast<Exchange*>(user);
  const HttpRequest& request = *exchange->request;
  const std::string_view pieces[] = {request.body_head, request.body, request.body_tail};
  size_t skip = exchange->body_sent;  // bytes of the pieces already sent
  size_t size = 0;
  for (const std::string_view piece : pieces) {
    if (skip >= piece.size()) {
      skip -= piece.size();
      continue;
    }
    const size_t take = std::min(one * n - size, piece.size() - skip);
    std::memcpy(buffer + size, piece.data() + skip, take);
    size += take;
    skip = 0;
    if (size == one * n) break;
  }
  exchange->body_sent += size;
  return size;
}

bool HeaderNameIs(std::string_view line, std::string_view name) {
  if (line.size() <= name.size() || line[name.size()] != ':') return false;
  for (size_t i = 0; i < name.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(line[i])) != name[i]) {
      return false;
    }
  }
  return true;
}

std::string_view HeaderValue(std::string_view line, size_t name_size) {
  line.remove_prefix(name_size + 1);
  while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) {
    line.remove_prefix(1);
  }
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) {
    line.remove_suffix(1);
  }
  return line;
}

size_t OnHeader(char* data, size_t one, size_t n, void* user) {
  auto* exchange = static_cast<Exchange*>(user);
  HttpResponse& response = *exchange->response;
  const std::string_view line(data, one * n);
  if (line.rfind("HTTP/", 0) == 0) {  // a new answer (after a 100, say)
    response.etag.clear();
    response.content_length.reset();
    response.headers.clear();
  } else if (HeaderNameIs(line, "etag")) {
    response.etag = std::string(HeaderValue(line, 4));
  } else if (HeaderNameIs(line, "content-length")) {
    const std::string_view value = HeaderValue(line, 14);
    uint64_t length = 0;
    auto [ptr, ec] =
        std::from_chars(value.data(), value.data() + value.size(), length);
    if (ec == std::errc() && ptr == value.data() + value.size()) {
      response.content_length = length;
      // A whole-object GET grows its string once, not by doubling.
      if (exchange->request->dst == nullptr && length <= (uint64_t{1} << 40)) {
        response.body.reserve(static_cast<size_t>(length));
      }
    }
  } else if (const size_t colon = line.find(':'); colon != std::string_view::npos) {
    std::string name(line.substr(0, colon));
    for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    response.headers.emplace_back(std::move(name), std::string(HeaderValue(line, colon)));
  }
  return one * n;
}

Transport Classify(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_CONNECT:
      return Transport::kConnectFailed;
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
      return Transport::kResolveFailed;
    case CURLE_OPERATION_TIMEDOUT:
      return Transport::kTimedOut;
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_ENGINE_NOTFOUND:
    case CURLE_SSL_ENGINE_SETFAILED:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_INVALIDCERTSTATUS:
    case CURLE_SSL_CRL_BADFILE:
      return Transport::kTlsFailed;
    default:
      // Sends and receives cut off, empty answers, partial bodies: the
      // connection was lost, and the request may be repeated.
      return Transport::kConnectionReset;
  }
}

class CurlTransport final : public HttpTransport {
 public:
  CurlTransport() { GlobalInitOnce(); }
  ~CurlTransport() override {
    for (CURL* handle : idle_) curl_easy_cleanup(handle);
  }

  void Perform(const HttpRequest& request, HttpResponse* response) override {
    *response = HttpResponse();
    CURL* handle = Acquire();
    if (handle == nullptr) {
      response->transport = Transport::kConnectFailed;
      response->transport_detail = "curl_easy_init failed";
      return;
    }
    char error[CURL_ERROR_SIZE] = {};
    Exchange exchange{handle, &request, response, 0};
    curl_slist* headers = nullptr;
    for (const auto& [name, value] : request.headers) {
      headers = curl_slist_append(headers, (name + ": " + value).c_str());
    }
    // No "Expect: 100-continue" round trip before each body, and no
    // content type of curl's choosing on POST.
    headers = curl_slist_append(headers, "Expect:");
    headers = curl_slist_append(headers, "Content-Type:");

    curl_easy_setopt(handle, CURLOPT_URL, request.url.c_str());
    curl_easy_setopt(handle, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(handle, CURLOPT_ERRORBUFFER, error);
    curl_easy_setopt(handle, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(handle, CURLOPT_WRITEFUNCTION, OnBody);
    curl_easy_setopt(handle, CURLOPT_WRITEDATA, &exchange);
    curl_easy_setopt(handle, CURLOPT_HEADERFUNCTION, OnHeader);
    curl_easy_setopt(handle, CURLOPT_HEADERDATA, &exchange);
    curl_easy_setopt(handle, CURLOPT_CONNECTTIMEOUT_MS, kConnectTimeoutMs);
    curl_easy_setopt(handle, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(handle, CURLOPT_LOW_SPEED_TIME, kStallSeconds);
    if (request.timeout_s > 0) {
      curl_easy_setopt(
          handle, CURLOPT_TIMEOUT_MS,
          std::max(1L, static_cast<long>(std::ceil(request.timeout_s * 1e3))));
    }
    // Larger buffers than the defaults move big objects with fewer
    // callbacks and system calls.
    curl_easy_setopt(handle, CURLOPT_BUFFERSIZE, 512L * 1024);
    curl_easy_setopt(handle, CURLOPT_UPLOAD_BUFFERSIZE, 2L * 1024 * 1024);
    const auto body_size = static_cast<curl_off_t>(
      request.body_head.size() + request.body.size() + request.body_tail.size());
    if (request.method == "GET") {
      curl_easy_setopt(handle, CURLOPT_HTTPGET, 1L);
    } else if (request.method == "HEAD") {
      curl_easy_setopt(handle, CURLOPT_NOBODY, 1L);
    } else if (request.method == "PUT") {
      curl_easy_setopt(handle, CURLOPT_UPLOAD, 1L);
      curl_easy_setopt(handle, CURLOPT_INFILESIZE_LARGE, body_size);
      curl_easy_setopt(handle, CURLOPT_READFUNCTION, OnSend);
      curl_easy_setopt(handle, CURLOPT_READDATA, &exchange);
    } else if (request.method == "POST") {
      curl_easy_setopt(handle, CURLOPT_POST, 1L);
      curl_easy_setopt(handle, CURLOPT_POSTFIELDSIZE_LARGE, body_size);
      curl_easy_setopt(handle, CURLOPT_READFUNCTION, OnSend);
      curl_easy_setopt(handle, CURLOPT_READDATA, &exchange);
    } else {
      curl_easy_setopt(handle, CURLOPT_CUSTOMREQUEST, request.method.c_str());
    }

    const CURLcode code = curl_easy_perform(handle);
    long status = 0;
    curl_easy_getinfo(handle, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(headers);
    response->status = static_cast<int>(status);
    if (code != CURLE_OK && !(code == CURLE_WRITE_ERROR &&
                              response->dst_overflow)) {
      response->transport = Classify(code);
      response->transport_detail =
          error[0] != '\0' ? std::string(error) : curl_easy_strerror(code);
    }
    Release(handle);
  }

 private:
  CURL* Acquire() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (const pid_t pid = ::getpid(); pid != pid_) {
        // A forked child: the pooled handles' connections are the
        // parent's sockets, and talking on them would mix two processes'
        // requests on one stream. Leave them alone (cleaning up could
        // close the parent's TLS sessions) and start afresh.
        idle_.clear();
        pid_ = pid;
      }
      if (!idle_.empty()) {
        CURL* handle = idle_.back();
        idle_.pop_back();
        return handle;
      }
    }
    return curl_easy_init();
  }

  void Release(CURL* handle) {
    // Clears the options of this exchange but keeps the live connection.
    curl_easy_reset(handle);
    std::lock_guard<std::mutex> lock(mu_);
    if (idle_.size() < kMaxIdleHandles && ::getpid() == pid_) {
      idle_.push_back(handle);
      return;
    }
    curl_easy_cleanup(handle);
  }

  std::mutex mu_;
  std::vector<CURL*> idle_;
  pid_t pid_ = ::getpid();  // the process the idle handles belong to
};

}  // namespace

std::shared_ptr<HttpTransport> NewCurlTransport() {
  return std::make_shared<CurlTransport>();
}

}  // namespace shardkeep::http

#include "storage/gcs/gcs_client.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <utility>

#include <nlohmann/json.hpp>

#include "format/json_parse.h"
#include "storage/gcs/crc32c.h"
#include "storage/read_counter.h"

namespace shardkeep::gcs {
namespace {

bool Is2xx(int status) { return status >= 200 && status < 300; }

std::string FormatSeconds(double s) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.1f", s);
  return buffer;
}

// GCS sends 64-bit numbers as JSON strings ("size": "5").
uint64_t NumberField(const nlohmann::json& resource, const char* name) {
  const auto it = resource.find(name);
  if (it == resource.end()) return 0;
  if (it->is_number_unsigned()) return it->get<uint64_t>();
  if (it->is_string()) {
    try {
      return std::stoull(it->get<std::string>());
    } catch (...) {
      return 0;
    }
  }
  return 0;
}

Result<ObjectInfo> DecodeObject(const std::string& body, const std::string& what) {
  SK_ASSIGN_OR_RETURN(nlohmann::json resource,
                      format::ParseJsonObject<nlohmann::json>(body, what));
  ObjectInfo info;
  info.size = NumberField(resource, "size");
  info.generation = static_cast<int64_t>(NumberField(resource, "generation"));
  if (auto it = resource.find("crc32c"); it != resource.end() && it->is_string()) {
    info.crc32c = it->get<std::string>();
  }
  return info;
}

// The crc32c of an "x-goog-hash: crc32c=...,md5=..." header, if it has one.
std::optional<std::string> HashCrc32c(const http::HttpResponse& response) {
  const std::optional<std::string> header = http::FindHeader(response, "x-goog-hash");
  if (!header) return std::nullopt;
  std::string_view rest = *header;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? "" : rest.substr(comma + 1);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    if (item.rfind("crc32c=", 0) == 0) return std::string(item.substr(7));
  }
  return std::nullopt;
}

// A multipart/related boundary that does not occur in `data`.
std::string BoundaryFor(std::string_view data) {
  static thread_local std::mt19937_64 random{std::random_device{}()};
  while (true) {
    char buffer[40];
    std::snprintf(buffer, sizeof(buffer), "shardkeep_%016llx",
                  static_cast<unsigned long long>(random()));
    if (data.find(buffer) == std::string_view::npos) return buffer;
  }
}

}  // namespace

std::string EncodeComponent(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (std::isalnum(byte) || c == '-' || c == '.' || c == '_' || c == '~') {
      out += c;
    } else {
      out += '%';
      out += kHex[byte >> 4];
      out += kHex[byte & 15];
    }
  }
  return out;
}

GcsClient::GcsClient(std::string endpoint, std::string bucket,
                     std::shared_ptr<Credentials> credentials,
                     std::shared_ptr<http::HttpTransport> transport,
                     GcsClientOptions options, TokenClock clock)
    : endpoint_(std::move(endpoint)),
      bucket_(std::move(bucket)),
      credentials_(std::move(credentials)),
      transport_(std::move(transport)),
      options_(options),
      clock_(std::move(clock)) {
  while (!endpoint_.empty() && endpoint_.back() == '/') endpoint_.pop_back();
}

std::string GcsClient::Url(const std::string& object) const {
  return "gs://" + bucket_ + "/" + object;
}

std::string GcsClient::ObjectUrl(const std::string& object) const {
  return endpoint_ + "/storage/v1/b/" + EncodeComponent(bucket_) + "/o/" +
         EncodeComponent(object);
}

Result<GcsAnswer> GcsClient::Execute(const GcsRequest& request) const {
  const double start = clock_.now_s();
  const double deadline = start + options_.timeout_s;
  GcsAnswer answer;
  bool renewed_token = false;
  for (int attempt = 1;; ++attempt) {
    SK_ASSIGN_OR_RETURN(const std::string authorization, credentials_->Authorization());
    http::HttpRequest http;
    http.method = request.method;
    http.url = request.url;
    http.headers = request.headers;
    if (!authorization.empty()) http.headers.emplace_back("Authorization", authorization);
    http.body_head = request.body_head;
    http.body = request.body;
    http.body_tail = request.body_tail;
    http.dst = request.dst;
    http.dst_capacity = request.dst_capacity;
    http.timeout_s = std::max(0.001, deadline - clock_.now_s());
    transport_->Perform(http, &answer.response);
    const http::HttpResponse& response = answer.response;

    GcsFailure failure;
    failure.operation = request.operation;
    failure.bucket = bucket_;
    failure.object = request.object;
    failure.principal = credentials_->Principal();
    failure.transport = response.transport;
    failure.transport_detail = response.transport_detail;
    failure.http_status = response.status;
    if (response.transport == http::Transport::kAnswered) {
      if (response.dst_overflow) {
        return CorruptionError(request.operation + " " + Url(request.object) +
                               ": the answer is longer than the " +
                               std::to_string(request.dst_capacity) +
                               " bytes asked for");
      }
      if (Is2xx(response.status)) return answer;
      if (std::find(request.handled_statuses.begin(), request.handled_statuses.end(),
                    response.status) != request.handled_statuses.end()) {
        return answer;
      }
      failure.error = DecodeGcsError(response.body);
      if (response.status == 401 && !renewed_token) {
        // A token revoked or expired early: one more try with a new one.
        renewed_token = true;
        credentials_->Invalidate();
        continue;
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
    const std::optional<double> wait = http::BackoffBeforeRetry(
        options_.backoff, attempt, deadline - clock_.now_s(), clock_.uniform01);
    if (!wait) {
      const Status status = ToStatus(failure);
      return Status(status.code(),
                    status.message() + " (gave up after " + std::to_string(attempt) +
                        " attempts in " + FormatSeconds(clock_.now_s() - start) +
                        " s; timeout_s is " + FormatSeconds(options_.timeout_s) + ")");
    }
    clock_.sleep_s(*wait);
  }
}

Result<GcsAnswer> GcsClient::GetRange(const std::string& object, uint64_t offset,
                                      uint64_t size, char* dst) const {
  GcsRequest request;
  request.operation = "objects.get";
  request.method = "GET";
  request.object = object;
  request.url = ObjectUrl(object) + "?alt=media";
  request.headers.emplace_back(
      "Range", "bytes=" + std::to_string(offset) + "-" + std::to_string(offset + size - 1));
  request.dst = dst;
  request.dst_capacity = size;
  request.handled_statuses = {416};  // starts past the end
  SK_ASSIGN_OR_RETURN(GcsAnswer answer, Execute(request));
  CountStorageBytesRead(answer.response.dst_bytes);
  return answer;
}

Result<std::string> GcsClient::GetObject(const std::string& object) const {
  GcsRequest request;
  request.operation = "objects.get";
  request.method = "GET";
  request.object = object;
  request.url = ObjectUrl(object) + "?alt=media";
  // Bytes damaged on the way (a faulty NIC or proxy, past TCP's checksum)
  // are read once more before they are reported: a second transfer is not
  // damaged the same way, while damage at rest repeats.
  Status damaged;
  for (int attempt = 0; attempt < 2; ++attempt) {
    SK_ASSIGN_OR_RETURN(GcsAnswer answer, Execute(request));
    CountStorageBytesRead(answer.response.body.size());
    const std::optional<std::string> expected = HashCrc32c(answer.response);
    if (!expected) return std::move(answer.response.body);
    const std::string actual = Crc32cBase64(Crc32c(answer.response.body));
    if (actual == *expected) return std::move(answer.response.body);
    damaged = CorruptionError(Url(object) + ": the " +
                              std::to_string(answer.response.body.size()) +
                              " bytes received have CRC32C " + actual +
                              ", and GCS stores the object with " +
                              http::Printable(*expected) + " (read twice)");
  }
  return damaged;
}

Result<std::optional<ObjectInfo>> GcsClient::GetInfo(const std::string& object) const {
  GcsRequest request;
  request.operation = "objects.get";
  request.method = "GET";
  request.object = object;
  request.url = ObjectUrl(object) + "?fields=size,generation,crc32c";
  request.handled_statuses = {404};
  SK_ASSIGN_OR_RETURN(GcsAnswer answer, Execute(request));
  if (answer.response.status == 404) {
    // A missing bucket also answers 404; it must not read as "no object".
    const std::optional<GcsErrorBody> error = DecodeGcsError(answer.response.body);
    if (error && error->message.find("bucket does not exist") != std::string::npos) {
      GcsFailure failure{request.operation, bucket_, object, credentials_->Principal(),
                         http::Transport::kAnswered, "", 404, error};
      return ToStatus(failure);
    }
    return std::optional<ObjectInfo>();
  }
  SK_ASSIGN_OR_RETURN(ObjectInfo info,
                      DecodeObject(answer.response.body, "objects.get " + Url(object)));
  return std::optional<ObjectInfo>(std::move(info));
}

Result<ObjectInfo> GcsClient::Upload(const std::string& object, std::string_view data,
                                     std::optional<int64_t> if_generation_match) const {
  const std::string crc32c = Crc32cBase64(Crc32c(data));
  GcsRequest request;
  request.operation = "objects.insert";
  request.method = "POST";
  request.object = object;
  request.url = endpoint_ + "/upload/storage/v1/b/" + EncodeComponent(bucket_) + "/o?";
  if (if_generation_match) {
    // A create-only upload: one multipart request, the object's metadata
    // (its name and CRC32C) beside its bytes, which the bytes go out from
    // the caller's memory between. Emulators honour the precondition on
    // this kind of upload (fake-gcs-server on no other).
    const std::string boundary = BoundaryFor(data);
    const nlohmann::json metadata = {{"name", object}, {"crc32c", crc32c}};
    request.url += "uploadType=multipart&ifGenerationMatch=" +
                   std::to_string(*if_generation_match);
    request.handled_statuses = {412};
    request.headers = {{"Content-Type", "multipart/related; boundary=" + boundary}};
    request.body_head = "--" + boundary +
                        "\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n" +
                        metadata.dump() + "\r\n--" + boundary +
                        "\r\nContent-Type: application/octet-stream\r\n\r\n";
    request.body_tail = "\r\n--" + boundary + "--\r\n";
  } else {
    // Data: a single-request media upload, its CRC32C in X-Goog-Hash. The
    // bytes go as they are, with nothing to parse around them (the
    // emulator spends half the CPU on these that it spends on multipart).
    request.url += "uploadType=media&name=" + EncodeComponent(object);
    request.headers = {{"Content-Type", "application/octet-stream"},
                       {"X-Goog-Hash", "crc32c=" + crc32c}};
  }
  request.body = data;
  SK_ASSIGN_OR_RETURN(GcsAnswer answer, Execute(request));
  if (answer.response.status == 412) {
    const Status lost = AlreadyExistsError(
        Url(object) + " exists already: another writer created it first "
        "(objects.insert with ifGenerationMatch=" + std::to_string(*if_generation_match) +
        " answered 412)");
    if (!answer.earlier_attempt_may_have_applied) return lost;
    // An earlier attempt of ours may have stored the object and lost its
    // answer: then the object holds exactly our bytes. Equal bytes from
    // another writer are just as good to the caller.
    Result<std::string> stored = GetObject(object);
    if (!stored.ok()) {
      return CommitStateUnknownError(
          Url(object) + ": an upload may have succeeded before its answer was "
          "lost, and reading the object back failed: " + stored.status().ToString());
    }
    if (*stored != data) return lost;
    SK_ASSIGN_OR_RETURN(std::optional<ObjectInfo> info, GetInfo(object));
    if (!info) return lost;
    return *info;
  }
  return DecodeObject(answer.response.body, "objects.insert " + Url(object));
}

Status GcsClient::Delete(const std::string& object) const {
  GcsRequest request;
  request.operation = "objects.delete";
  request.method = "DELETE";
  request.object = object;
  request.url = ObjectUrl(object);
  request.handled_statuses = {404};
  SK_ASSIGN_OR_RETURN(GcsAnswer answer, Execute(request));
  if (answer.response.status == 404) {
    // Our own earlier attempt may have deleted it: gone either way.
    if (answer.earlier_attempt_may_have_applied) return Status::Ok();
    return NotFoundError(Url(object) + " does not exist");
  }
  return Status::Ok();
}

Status GcsClient::Rewrite(const std::string& from, const std::string& to) const {
  // Large objects, or ones moving between locations or storage classes,
  // take several calls, each resuming with the token of the last.
  std::string token;
  while (true) {
    GcsRequest request;
    request.operation = "objects.rewrite";
    request.method = "POST";
    request.object = to;
    request.url = ObjectUrl(from) + "/rewriteTo/b/" + EncodeComponent(bucket_) + "/o/" +
                  EncodeComponent(to);
    if (!token.empty()) request.url += "?rewriteToken=" + EncodeComponent(token);
    request.headers = {{"Content-Type", "application/json"}};
    request.body = "{}";
    SK_ASSIGN_OR_RETURN(GcsAnswer answer, Execute(request));
    SK_ASSIGN_OR_RETURN(nlohmann::json progress,
                        format::ParseJsonObject<nlohmann::json>(
                            answer.response.body, "objects.rewrite " + Url(to)));
    if (progress.value("done", false)) return Status::Ok();
    token = progress.value("rewriteToken", std::string());
    if (token.empty()) {
      return StorageError("objects.rewrite " + Url(from) + " to " + Url(to) +
                          ": not done, and no token to continue with");
    }
  }
}

Result<ObjectInfo> GcsClient::Compose(const std::vector<std::string>& sources,
                                      const std::string& to) const {
  if (sources.empty() || sources.size() > kMaxComposeSources) {
    return InternalError("objects.compose " + Url(to) + " of " +
                         std::to_string(sources.size()) + " objects");
  }
  nlohmann::json body = {{"destination", {{"contentType", "application/octet-stream"}}},
                         {"sourceObjects", nlohmann::json::array()}};
  for (const std::string& source : sources) {
    body["sourceObjects"].push_back({{"name", source}});
  }
  const std::string text = body.dump();
  GcsRequest request;
  request.operation = "objects.compose";
  request.method = "POST";
  request.object = to;
  request.url = ObjectUrl(to) + "/compose";
  request.headers = {{"Content-Type", "application/json"}};
  request.body = text;
  SK_ASSIGN_OR_RETURN(GcsAnswer answer, Execute(request));
  return DecodeObject(answer.response.body, "objects.compose " + Url(to));
}

Result<ListPage> GcsClient::ListPageOf(const std::string& prefix,
                                       const std::string& delimiter, int max_results,
                                       const std::string& page_token) const {
  GcsRequest request;
  request.operation = "objects.list";
  request.method = "GET";
  request.url = endpoint_ + "/storage/v1/b/" + EncodeComponent(bucket_) +
                "/o?fields=items(name,size),prefixes,nextPageToken&prefix=" +
                EncodeComponent(prefix);
  if (!delimiter.empty()) request.url += "&delimiter=" + EncodeComponent(delimiter);
  if (max_results > 0) request.url += "&maxResults=" + std::to_string(max_results);
  if (!page_token.empty()) request.url += "&pageToken=" + EncodeComponent(page_token);
  SK_ASSIGN_OR_RETURN(GcsAnswer answer, Execute(request));
  SK_ASSIGN_OR_RETURN(nlohmann::json listing,
                      format::ParseJsonObject<nlohmann::json>(
                          answer.response.body, "objects.list " + Url(prefix)));
  ListPage page;
  if (auto it = listing.find("items"); it != listing.end() && it->is_array()) {
    for (const nlohmann::json& item : *it) {
      if (!item.is_object() || !item.contains("name") || !item["name"].is_string()) continue;
      page.objects.emplace_back(item["name"].get<std::string>(), NumberField(item, "size"));
    }
  }
  if (auto it = listing.find("prefixes"); it != listing.end() && it->is_array()) {
    for (const nlohmann::json& name : *it) {
      if (name.is_string()) page.prefixes.push_back(name.get<std::string>());
    }
  }
  page.next_page_token = listing.value("nextPageToken", std::string());
  return page;
}

Result<ListPage> GcsClient::ListAll(const std::string& prefix,
                                    const std::string& delimiter) const {
  ListPage all;
  std::string token;
  do {
    SK_ASSIGN_OR_RETURN(ListPage page, ListPageOf(prefix, delimiter, 1000, token));
    for (auto& object : page.objects) all.objects.push_back(std::move(object));
    for (auto& name : page.prefixes) all.prefixes.push_back(std::move(name));
    token = std::move(page.next_page_token);
  } while (!token.empty());
  return all;
}

}  // namespace shardkeep::gcs

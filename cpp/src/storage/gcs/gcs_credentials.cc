#include "storage/gcs/gcs_credentials.h"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <new>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "format/json_parse.h"
#include "storage/gcs/gcs_errors.h"
#include "storage/gcs/jwt.h"
#include "storage/http/backoff.h"

namespace shardkeep::gcs {
namespace {

using Json = nlohmann::json;

constexpr const char* kDefaultTokenUri = "https://oauth2.googleapis.com/token";
constexpr const char* kScope = "https://www.googleapis.com/auth/devstorage.read_write";
constexpr const char* kDefaultMetadataHost = "metadata.google.internal";
constexpr const char* kDefaultAccountPath =
    "/computeMetadata/v1/instance/service-accounts/default/";
constexpr double kJwtLifetime_s = 3600;  // the most Google accepts
// A token is refreshed this long before it expires, so that no request
// carries it past its expiry.
constexpr double kRefreshMargin_s = 300;
// Assumed when a token answer does not say; a 401 (Invalidate) corrects it.
constexpr double kDefaultTokenLifetime_s = 3600;
// Key files are a few kilobytes; this stops a path such as /dev/zero.
constexpr size_t kMaxKeyFileBytes = size_t{1} << 20;
// Off Google Cloud the metadata host does not resolve (known at once) or
// nothing answers; on it the server answers in milliseconds, though GKE's
// can be slow while a pod starts: a few short tries, ~3 s at worst.
constexpr double kProbeTimeout_s = 1;
constexpr int kProbeAttempts = 3;
// The most of a server's words (an error description) quoted in a message.
constexpr size_t kMaxQuoted = 300;

// `text` cut to `limit` bytes, bytes outside printable ASCII as '?'.
std::string Printable(std::string_view text, size_t limit = kMaxQuoted) {
  std::string out;
  for (char c : text.substr(0, limit)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (text.size() > limit) out += "...";
  return out;
}

// `text` with every occurrence of a secret replaced: a server may echo what
// it was sent into its error description.
std::string Redact(std::string text, const std::vector<std::string>& secrets) {
  for (const std::string& secret : secrets) {
    if (secret.empty()) continue;
    for (size_t at; (at = text.find(secret)) != std::string::npos;) {
      text.replace(at, secret.size(), "<redacted>");
    }
  }
  return text;
}

// application/x-www-form-urlencoded, every byte but the unreserved ones
// percent-encoded.
std::string FormEncode(std::string_view value) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const unsigned char c : value) {
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
        c == '-' || c == '.' || c == '_' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += {'%', kHex[c >> 4], kHex[c & 15]};
    }
  }
  return out;
}

std::optional<std::string> NonEmpty(std::optional<std::string> value) {
  if (value.has_value() && value->empty()) return std::nullopt;
  return value;
}

struct AccessToken {
  std::string value;
  double lifetime_s = kDefaultTokenLifetime_s;
};

// One request for a token, as each kind of credentials builds it.
struct TokenRequest {
  http::HttpRequest http;  // its body points into `body`
  std::string body;
  bool from_metadata_server = false;  // the answer must say Metadata-Flavor: Google
  std::vector<std::string> secrets;   // never in a message
  std::string rejected_hint;          // what to check when the server refuses
};

// What the network needs to fetch tokens, shared by every kind.
struct TokenSource {
  std::shared_ptr<http::HttpTransport> transport;
  TokenClock clock;
  double timeout_s = 600;
};

bool IsTransient(const http::HttpResponse& response) {
  return IsRetryable(response.transport, response.status);
}

bool IsMetadataServer(const http::HttpResponse& response) {
  return http::FindHeader(response, "metadata-flavor") == "Google";
}

// "HTTP 400: invalid_grant: Invalid JWT Signature.", "connection reset (...)".
std::string DescribeFailure(const http::HttpResponse& response,
                            const std::vector<std::string>& secrets) {
  if (response.transport != http::Transport::kAnswered) {
    std::string text = http::TransportName(response.transport);
    if (!response.transport_detail.empty()) {
      text += " (" + Printable(Redact(response.transport_detail, secrets)) + ")";
    }
    return text;
  }
  std::string text = "HTTP " + std::to_string(response.status);
  Result<Json> answer = format::ParseJsonObject<Json>(response.body, "token answer");
  if (answer.ok()) {
    for (const char* field : {"error", "error_description"}) {
      const auto it = answer->find(field);
      if (it != answer->end() && it->is_string()) {
        text += ": " + Printable(Redact(it->get<std::string>(), secrets));
      }
    }
  } else if (!response.body.empty()) {
    text += ": " + Printable(Redact(response.body, secrets));
  }
  return text;
}

// The token of a 2xx answer, or what is wrong with the answer (never
// quoting it: it may hold a token).
Result<AccessToken> ParseTokenAnswer(const http::HttpResponse& response) {
  Result<Json> answer = format::ParseJsonObject<Json>(response.body, "token answer");
  if (!answer.ok()) return StorageError("the answer is not a JSON object");
  const auto token = answer->find("access_token");
  if (token == answer->end() || !token->is_string() || token->get<std::string>().empty()) {
    return StorageError("the answer has no access_token");
  }
  AccessToken out{token->get<std::string>()};
  for (const char c : out.value) {
    if (c <= 0x20 || c >= 0x7f) {
      return StorageError("the access_token holds characters that a header cannot carry");
    }
  }
  const auto expires = answer->find("expires_in");
  if (expires != answer->end()) {
    // Numbers, though some proxies send strings.
    double seconds = 0;
    if (expires->is_number()) {
      seconds = expires->get<double>();
    } else if (expires->is_string()) {
      seconds = std::strtod(expires->get<std::string>().c_str(), nullptr);
    }
    if (!(seconds > 0 && std::isfinite(seconds))) {
      return StorageError("the answer's expires_in is not a positive number");
    }
    out.lifetime_s = seconds;
  }
  return out;
}

// Performs `request`, retrying transient failures until the token
// source's timeout_s has passed since the first attempt.
Result<AccessToken> ExchangeForToken(TokenRequest request, const std::string& principal,
                                     const TokenSource& source) {
  const TokenClock& clock = source.clock;
  request.http.body = request.body;
  const std::string what =
      "GCS credentials of " + principal + ": token request to " + request.http.url;
  const double start = clock.now_s();
  const double deadline = start + source.timeout_s;
  for (int attempt = 1;; ++attempt) {
    request.http.timeout_s = std::max(0.001, deadline - clock.now_s());
    http::HttpResponse response;
    source.transport->Perform(request.http, &response);
    const bool answered = response.transport == http::Transport::kAnswered;
    if (answered && response.status >= 200 && response.status < 300) {
      if (request.from_metadata_server && !IsMetadataServer(response)) {
        return StorageError(what + ": the answer lacks \"Metadata-Flavor: Google\" (a proxy "
                                   "in between? metadata requests must not be proxied)");
      }
      Result<AccessToken> token = ParseTokenAnswer(response);
      if (!token.ok()) return StorageError(what + ": " + token.status().message());
      return token;
    }
    std::string failure = what + " failed: " + DescribeFailure(response, request.secrets);
    std::optional<double> wait;
    if (IsTransient(response)) {
      wait = http::BackoffBeforeRetry(http::BackoffPolicy{}, attempt, deadline - clock.now_s(),
                                      clock.uniform01);
      if (!wait) {
        char spent[32];
        std::snprintf(spent, sizeof(spent), "%.1f", clock.now_s() - start);
        failure += " (gave up after " + std::to_string(attempt) + " attempts in " + spent +
                   " s; timeout_s is " + std::to_string(static_cast<long>(source.timeout_s)) + ")";
      }
    } else if (attempt > 1) {
      failure += " (after " + std::to_string(attempt) + " attempts)";
    }
    if (!wait) {
      // The server refused these credentials: they, not the store, need fixing.
      if (answered && response.status >= 400 && response.status < 500 &&
          response.status != 408 && response.status != 429) {
        return InvalidArgumentError(failure + "; " + request.rejected_hint);
      }
      return StorageError(failure);
    }
    clock.sleep_s(*wait);
  }
}

class AnonymousCredentials final : public Credentials {
 public:
  explicit AnonymousCredentials(std::string principal) : principal_(std::move(principal)) {}
  Result<std::string> Authorization() override { return std::string(); }
  void Invalidate() override {}
  std::string Principal() const override { return principal_; }

 private:
  const std::string principal_;
};

// A token fetched on first use, kept until shortly before it expires, and
// refreshed by one caller while the others wait for its outcome.
class CachingCredentials : public Credentials {
 public:
  CachingCredentials(std::string principal, TokenSource source)
      : principal_(std::move(principal)), source_(std::move(source)) {}

  Result<std::string> Authorization() final {
    std::unique_lock<std::mutex> lock(mu_);
    if (!authorization_.empty() && source_.clock.wall_s() < refresh_at_) return authorization_;
    if (refreshing_) {
      const uint64_t generation = generation_;
      refreshed_.wait(lock, [&] { return generation_ != generation; });
      return last_outcome_;
    }
    refreshing_ = true;
    lock.unlock();
    const double requested_at = source_.clock.wall_s();
    // Nothing may escape between refreshing_ and its reset: the callers
    // waiting for this refresh would wait forever.
    Result<AccessToken> token = InternalError("fetching a token for " + principal_ + " threw");
    try {
      token = FetchToken();
    } catch (const std::bad_alloc&) {
      token = ResourceExhaustedError("out of memory fetching a token for " + principal_);
    } catch (...) {
    }
    lock.lock();
    refreshing_ = false;
    ++generation_;
    if (token.ok()) {
      authorization_ = "Bearer " + token->value;
      // Short-lived tokens (the metadata server hands out what it has
      // cached) are kept for half their life rather than refetched per call.
      refresh_at_ = requested_at + std::max(token->lifetime_s - kRefreshMargin_s,
                                            token->lifetime_s / 2);
      last_outcome_ = authorization_;
    } else {
      last_outcome_ = token.status();
    }
    refreshed_.notify_all();
    return last_outcome_;
  }

  void Invalidate() final {
    std::lock_guard<std::mutex> lock(mu_);
    refresh_at_ = -std::numeric_limits<double>::infinity();
  }

  std::string Principal() const final { return principal_; }

 protected:
  // Builds the request for a new token (a service account signs a JWT).
  virtual Result<TokenRequest> NextTokenRequest() const = 0;
  const TokenClock& clock() const { return source_.clock; }

 private:
  Result<AccessToken> FetchToken() {
    SK_ASSIGN_OR_RETURN(TokenRequest request, NextTokenRequest());
    return ExchangeForToken(std::move(request), principal_, source_);
  }

  const std::string principal_;
  const TokenSource source_;
  std::mutex mu_;
  std::condition_variable refreshed_;
  bool refreshing_ = false;
  uint64_t generation_ = 0;  // refreshes completed
  std::string authorization_;
  double refresh_at_ = 0;  // wall_s
  Result<std::string> last_outcome_{std::string()};
};

TokenRequest FormPost(const std::string& url, std::string body, std::vector<std::string> secrets,
                      std::string rejected_hint) {
  TokenRequest request;
  request.http.method = "POST";
  request.http.url = url;
  request.http.headers = {{"Content-Type", "application/x-www-form-urlencoded"}};
  request.body = std::move(body);
  request.secrets = std::move(secrets);
  request.rejected_hint = std::move(rejected_hint);
  return request;
}

struct ServiceAccountKey {
  std::string client_email;
  std::string private_key_id;  // optional: the JWT's "kid"
  std::string private_key_pem;
  std::optional<RsaPrivateKey> private_key;  // parsed from the PEM
  std::string token_uri;
};

class ServiceAccountCredentials final : public CachingCredentials {
 public:
  ServiceAccountCredentials(std::string principal, ServiceAccountKey key, TokenSource source)
      : CachingCredentials(std::move(principal), std::move(source)), key_(std::move(key)) {}

 protected:
  Result<TokenRequest> NextTokenRequest() const override {
    Json header = {{"alg", "RS256"}, {"typ", "JWT"}};
    if (!key_.private_key_id.empty()) header["kid"] = key_.private_key_id;
    const auto now = static_cast<int64_t>(std::floor(clock().wall_s()));
    const Json claims = {{"iss", key_.client_email},
                         {"scope", kScope},
                         {"aud", key_.token_uri},
                         {"iat", now},
                         {"exp", now + static_cast<int64_t>(kJwtLifetime_s)}};
    // Replacing bad UTF-8 rather than throwing (the strings came from a file).
    const auto dump = [](const Json& j) {
      return j.dump(-1, ' ', false, Json::error_handler_t::replace);
    };
    SK_ASSIGN_OR_RETURN(std::string assertion,
                        SignJwtRs256(*key_.private_key, dump(header), dump(claims)));
    return FormPost(key_.token_uri,
                    "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=" +
                        FormEncode(assertion),
                    {assertion, key_.private_key_pem},
                    "check that the key is not deleted or disabled (IAM > Service accounts > "
                    "Keys) and that this machine's clock is right");
  }

 private:
  const ServiceAccountKey key_;
};

struct AuthorizedUser {
  std::string client_id;
  std::string client_secret;
  std::string refresh_token;
  std::string token_uri;
};

class UserCredentials final : public CachingCredentials {
 public:
  UserCredentials(std::string principal, AuthorizedUser user, TokenSource source)
      : CachingCredentials(std::move(principal), std::move(source)), user_(std::move(user)) {}

 protected:
  Result<TokenRequest> NextTokenRequest() const override {
    return FormPost(user_.token_uri,
                    "grant_type=refresh_token&client_id=" + FormEncode(user_.client_id) +
                        "&client_secret=" + FormEncode(user_.client_secret) +
                        "&refresh_token=" + FormEncode(user_.refresh_token),
                    {user_.client_secret, user_.refresh_token,
                     FormEncode(user_.client_secret), FormEncode(user_.refresh_token)},
                    "the login may have expired or been revoked: run `gcloud auth "
                    "application-default login` again");
  }

 private:
  const AuthorizedUser user_;
};

class MetadataCredentials final : public CachingCredentials {
 public:
  MetadataCredentials(std::string principal, std::string host, TokenSource source)
      : CachingCredentials(std::move(principal), std::move(source)), host_(std::move(host)) {}

 protected:
  Result<TokenRequest> NextTokenRequest() const override {
    TokenRequest request;
    request.http.method = "GET";
    request.http.url = "http://" + host_ + kDefaultAccountPath + "token";
    request.http.headers = {{"Metadata-Flavor", "Google"}};
    request.from_metadata_server = true;
    request.rejected_hint = "check that the VM (or the GKE workload) has a service account";
    return request;
  }

 private:
  const std::string host_;
};

// A key file's string field; `required` ones must be present and non-empty.
Result<std::string> Field(const Json& file, const char* name, const std::string& what,
                          bool required = true) {
  const auto it = file.find(name);
  if (it == file.end() || it->is_null()) {
    if (!required) return std::string();
    return InvalidArgumentError(what + ": field '" + name + "' is missing");
  }
  const std::string field = what + ": field '" + name + "'";
  if (!it->is_string()) return InvalidArgumentError(field + " is not a string");
  std::string value = it->get<std::string>();
  if (required && value.empty()) return InvalidArgumentError(field + " is empty");
  return value;
}

Result<std::string> TokenUri(const Json& file, const std::string& what) {
  Result<std::string> uri = Field(file, "token_uri", what, /*required=*/false);
  if (!uri.ok()) return uri;
  if (uri->empty()) return std::string(kDefaultTokenUri);
  if (!uri->starts_with("https://") && !uri->starts_with("http://")) {
    return InvalidArgumentError(what + ": field 'token_uri' is not an http(s) URL");
  }
  return uri;
}

// Credentials from the content of a key file; `what` names the file.
Result<std::shared_ptr<Credentials>> FromKeyFile(const std::string& path, const std::string& what,
                                                 std::string_view bytes, TokenSource source) {
  Result<Json> parsed = format::ParseJsonObject<Json>(bytes, what);
  if (!parsed.ok()) return InvalidArgumentError(parsed.status().message());
  const Json& file = *parsed;
  SK_ASSIGN_OR_RETURN(const std::string type, Field(file, "type", what));
  if (type == "service_account") {
    ServiceAccountKey key;
    SK_ASSIGN_OR_RETURN(key.client_email, Field(file, "client_email", what));
    SK_ASSIGN_OR_RETURN(key.private_key_id, Field(file, "private_key_id", what, false));
    SK_ASSIGN_OR_RETURN(key.private_key_pem, Field(file, "private_key", what));
    SK_ASSIGN_OR_RETURN(key.token_uri, TokenUri(file, what));
    Result<RsaPrivateKey> private_key = RsaPrivateKey::FromPem(key.private_key_pem);
    if (!private_key.ok()) {
      return InvalidArgumentError(what + ": field 'private_key' is " +
                                  private_key.status().message());
    }
    key.private_key = std::move(private_key).value();
    std::string principal =
        "service account " + Printable(key.client_email) + " (key file " + path + ")";
    return std::shared_ptr<Credentials>(std::make_shared<ServiceAccountCredentials>(
        std::move(principal), std::move(key), std::move(source)));
  }
  if (type == "authorized_user") {
    AuthorizedUser user;
    SK_ASSIGN_OR_RETURN(user.client_id, Field(file, "client_id", what));
    SK_ASSIGN_OR_RETURN(user.client_secret, Field(file, "client_secret", what));
    SK_ASSIGN_OR_RETURN(user.refresh_token, Field(file, "refresh_token", what));
    SK_ASSIGN_OR_RETURN(user.token_uri, TokenUri(file, what));
    std::string principal = "gcloud user credentials (client id " + Printable(user.client_id) +
                            ", key file " + path + ")";
    return std::shared_ptr<Credentials>(std::make_shared<UserCredentials>(
        std::move(principal), std::move(user), std::move(source)));
  }
  return InvalidArgumentError(what + ": field 'type' is '" + Printable(type, 64) +
                              "'; shardkeep reads 'service_account' and 'authorized_user' "
                              "key files");
}

Result<std::shared_ptr<Credentials>> LoadKeyFile(const std::string& path,
                                                 const std::string& named_by,
                                                 const CredentialsEnvironment& environment,
                                                 TokenSource source) {
  const std::string what = "GCS credentials file " + path + named_by;
  Result<std::string> bytes = environment.read_file(path);
  if (!bytes.ok()) {
    if (bytes.status().code() == StatusCode::kNotFound) {
      return InvalidArgumentError(what + ": no such file");
    }
    return InvalidArgumentError(what + ": cannot be read: " + bytes.status().message());
  }
  return FromKeyFile(path, what, *bytes, std::move(source));
}

// What the metadata server at a host said, if one answered.
struct MetadataProbe {
  bool found = false;
  std::optional<std::string> email;  // the VM's default service account
  bool has_account = true;           // false: the VM runs without one
};

MetadataProbe ProbeMetadataServer(const std::string& host, http::HttpTransport& transport,
                                  const TokenClock& clock) {
  http::HttpRequest request;
  request.method = "GET";
  request.url = "http://" + host + kDefaultAccountPath + "email";
  request.headers = {{"Metadata-Flavor", "Google"}};
  request.timeout_s = kProbeTimeout_s;
  for (int attempt = 1; attempt <= kProbeAttempts; ++attempt) {
    http::HttpResponse response;
    transport.Perform(request, &response);
    if (response.transport == http::Transport::kAnswered) {
      // Something else under that name (a captive portal, a DNS catch-all).
      if (!IsMetadataServer(response)) return {};
      if (response.status == 200) return {true, NonEmpty(Printable(response.body, 200)), true};
      if (response.status == 404) return {true, std::nullopt, false};
      if (response.status < 500 || attempt == kProbeAttempts) return {true, std::nullopt, true};
    } else if (response.transport != http::Transport::kTimedOut &&
               response.transport != http::Transport::kConnectionReset) {
      return {};  // the host does not resolve, or nothing listens there
    }
    if (attempt < kProbeAttempts) clock.sleep_s(0.1 * attempt);
  }
  return {};
}

struct ProbeCache {
  std::mutex mu;  // held through a probe: concurrent finders wait for one
  std::map<std::string, MetadataProbe> probes;
};

ProbeCache& Probes() {
  static ProbeCache* cache = new ProbeCache;  // never destroyed: no exit-order hazard
  return *cache;
}

MetadataProbe CachedProbe(const std::string& host, http::HttpTransport& transport,
                          const TokenClock& clock) {
  ProbeCache& cache = Probes();
  std::lock_guard<std::mutex> lock(cache.mu);
  const auto it = cache.probes.find(host);
  if (it != cache.probes.end()) return it->second;
  return cache.probes[host] = ProbeMetadataServer(host, transport, clock);
}

}  // namespace

CredentialsEnvironment ProcessCredentialsEnvironment() {
  CredentialsEnvironment environment;
  environment.getenv = [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
  environment.read_file = [](const std::string& path) -> Result<std::string> {
    errno = 0;
    std::FILE* file = std::fopen(path.c_str(), "rb");
    if (file == nullptr) {
      if (errno == ENOENT || errno == ENOTDIR) return NotFoundError(path + ": no such file");
      return ErrnoError("opening " + path, errno);
    }
    std::string content;
    char buffer[4096];
    size_t got = 0;
    while (content.size() <= kMaxKeyFileBytes &&
           (got = std::fread(buffer, 1, sizeof(buffer), file)) > 0) {
      content.append(buffer, got);
    }
    const int read_errno = std::ferror(file) ? errno : 0;
    std::fclose(file);
    if (read_errno != 0) return ErrnoError("reading " + path, read_errno);
    if (content.size() > kMaxKeyFileBytes) {
      return InvalidArgumentError(path + ": larger than a key file (over 1 MiB)");
    }
    return content;
  };
  return environment;
}

TokenClock RealTokenClock() {
  TokenClock clock;
  clock.wall_s = [] {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  clock.now_s = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  clock.sleep_s = [](double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); };
  clock.uniform01 = [] {
    thread_local std::mt19937_64 engine{std::random_device{}()};
    return std::uniform_real_distribution<double>(0.0, 1.0)(engine);
  };
  return clock;
}

Result<std::shared_ptr<Credentials>> FindCredentials(const CredentialsOptions& options,
                                                     const CredentialsEnvironment& environment,
                                                     std::shared_ptr<http::HttpTransport> transport,
                                                     TokenClock clock) {
  if (options.anonymous) {
    return std::shared_ptr<Credentials>(std::make_shared<AnonymousCredentials>("anonymous"));
  }
  const TokenSource source{transport, clock, options.timeout_s};
  if (options.credentials_file.has_value()) {
    if (options.credentials_file->empty()) {
      return InvalidArgumentError("GCS credentials_file is empty");
    }
    return LoadKeyFile(*options.credentials_file, "", environment, source);
  }
  if (const auto path = NonEmpty(environment.getenv("GOOGLE_APPLICATION_CREDENTIALS"))) {
    return LoadKeyFile(*path, " (named by GOOGLE_APPLICATION_CREDENTIALS)", environment, source);
  }
  // gcloud's own lookup: CLOUDSDK_CONFIG replaces ~/.config/gcloud.
  std::optional<std::string> gcloud_dir = NonEmpty(environment.getenv("CLOUDSDK_CONFIG"));
  if (!gcloud_dir) {
    if (const auto home = NonEmpty(environment.getenv("HOME"))) {
      gcloud_dir = *home + "/.config/gcloud";
    }
  }
  if (gcloud_dir) {
    const std::string path = *gcloud_dir + "/application_default_credentials.json";
    Result<std::string> bytes = environment.read_file(path);
    const std::string what =
        "GCS credentials file " + path + " (gcloud's application default credentials)";
    if (bytes.ok()) return FromKeyFile(path, what, *bytes, source);
    if (bytes.status().code() != StatusCode::kNotFound) {
      return InvalidArgumentError(what + ": cannot be read: " + bytes.status().message());
    }
  }
  const std::string host =
      NonEmpty(environment.getenv("GCE_METADATA_HOST")).value_or(kDefaultMetadataHost);
  const MetadataProbe probe = CachedProbe(host, *transport, clock);
  if (!probe.found) {
    return std::shared_ptr<Credentials>(std::make_shared<AnonymousCredentials>("anonymous"));
  }
  if (!probe.has_account) {
    return std::shared_ptr<Credentials>(
        std::make_shared<AnonymousCredentials>("anonymous (the metadata server " +
                                               Printable(host) +
                                               " has no service account for this VM)"));
  }
  std::string principal = "the VM's service account " +
                          (probe.email ? *probe.email + " " : std::string()) +
                          "(metadata server " + Printable(host) + ")";
  return std::shared_ptr<Credentials>(
      std::make_shared<MetadataCredentials>(std::move(principal), host, source));
}

void ForgetMetadataServerProbes() {
  ProbeCache& cache = Probes();
  std::lock_guard<std::mutex> lock(cache.mu);
  cache.probes.clear();
}

}  // namespace shardkeep::gcs

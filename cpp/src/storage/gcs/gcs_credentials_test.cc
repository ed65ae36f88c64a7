#include "storage/gcs/gcs_credentials.h"

#include <gtest/gtest.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "storage/http/base64.h"
#include "testing/status_matchers.h"

namespace shardkeep::gcs {
namespace {

using ::shardkeep::testing::Has;
using Json = nlohmann::json;

constexpr const char* kTokenUri = "https://oauth2.googleapis.com/token";
constexpr const char* kEmail = "sk@proj.iam.gserviceaccount.com";
constexpr const char* kClientSecret = "d-FL95Q19q7MQmFpd7hHD0Ty+/=";
constexpr const char* kRefreshToken = "1//0gRefreshTokenSecret-abc";
constexpr const char* kMetadataBase =
    "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/";
constexpr double kWallStart = 1700000000;

// --- An RSA key of the test's own, and a JWT checker ---

EVP_PKEY* TestKey() {
  static EVP_PKEY* key = [] {
    EVP_PKEY* generated = nullptr;
    EVP_PKEY_CTX* context = EVP_PKEY_CTX_new_id(EVP_PKEY_RSA, nullptr);
    EVP_PKEY_keygen_init(context);
    EVP_PKEY_CTX_set_rsa_keygen_bits(context, 2048);
    EVP_PKEY_keygen(context, &generated);
    EVP_PKEY_CTX_free(context);
    return generated;
  }();
  return key;
}

std::string TestKeyPem() {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), &BIO_free);
  PEM_write_bio_PKCS8PrivateKey(bio.get(), TestKey(), nullptr, nullptr, 0, nullptr, nullptr);
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

std::string UrlDecodeBase64(std::string text) {
  std::replace(text.begin(), text.end(), '-', '+');
  std::replace(text.begin(), text.end(), '_', '/');
  while (text.size() % 4 != 0) text += '=';
  return http::Base64Decode(text).value_or("");
}

bool VerifyRs256(const std::string& signed_part, const std::string& signature) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> context(EVP_MD_CTX_new(),
                                                                  &EVP_MD_CTX_free);
  return EVP_DigestVerifyInit(context.get(), nullptr, EVP_sha256(), nullptr, TestKey()) == 1 &&
         EVP_DigestVerify(context.get(), reinterpret_cast<const unsigned char*>(signature.data()),
                          signature.size(),
                          reinterpret_cast<const unsigned char*>(signed_part.data()),
                          signed_part.size()) == 1;
}

// "a=1&b=%2F" → {a: 1, b: /}.
std::map<std::string, std::string> ParseForm(const std::string& body) {
  std::map<std::string, std::string> form;
  size_t begin = 0;
  while (begin <= body.size()) {
    size_t end = body.find('&', begin);
    if (end == std::string::npos) end = body.size();
    const std::string pair = body.substr(begin, end - begin);
    const size_t equals = pair.find('=');
    std::string value;
    for (size_t i = equals + 1; i < pair.size(); ++i) {
      if (pair[i] == '%' && i + 2 < pair.size()) {
        value += static_cast<char>(std::stoi(pair.substr(i + 1, 2), nullptr, 16));
        i += 2;
      } else {
        value += pair[i];
      }
    }
    form[pair.substr(0, equals)] = value;
    begin = end + 1;
  }
  return form;
}

std::string Header(const http::HttpRequest& request, const std::string& name) {
  for (const auto& [n, v] : request.headers) {
    if (n == name) return v;
  }
  return "<absent>";
}

// --- Fakes ---

http::HttpResponse Answer(int status, std::string body, bool metadata_flavor = false) {
  http::HttpResponse response;
  response.status = status;
  response.body = std::move(body);
  if (metadata_flavor) response.headers.emplace_back("metadata-flavor", "Google");
  return response;
}

http::HttpResponse Failed(http::Transport transport) {
  http::HttpResponse response;
  response.transport = transport;
  response.transport_detail = "Connection reset by peer";
  return response;
}

http::HttpResponse TokenAnswer(const std::string& token, int expires_in = 3599,
                               bool metadata_flavor = false) {
  return Answer(200,
                Json{{"access_token", token}, {"expires_in", expires_in}, {"token_type", "Bearer"}}
                    .dump(),
                metadata_flavor);
}

// Answers through `handler`; records what was asked. By default nothing
// answers (the metadata host does not resolve).
class FakeTransport : public http::HttpTransport {
 public:
  using Handler = std::function<http::HttpResponse(const http::HttpRequest&, const std::string&)>;
  void Perform(const http::HttpRequest& request, http::HttpResponse* response) override {
    const std::string body(request.body);
    {
      std::lock_guard<std::mutex> lock(mu_);
      requests.push_back(request);
      requests.back().body = std::string_view();
      bodies.push_back(body);
    }
    *response = handler ? handler(request, body) : Failed(http::Transport::kResolveFailed);
  }
  size_t Count() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests.size();
  }

  Handler handler;
  std::vector<http::HttpRequest> requests;
  std::vector<std::string> bodies;

 private:
  std::mutex mu_;
};

struct FakeEnvironment {
  std::map<std::string, std::string> variables;
  std::map<std::string, std::string> files;
  std::map<std::string, Status> unreadable;
  CredentialsEnvironment Get() {
    CredentialsEnvironment environment;
    environment.getenv = [this](const std::string& name) -> std::optional<std::string> {
      const auto it = variables.find(name);
      if (it == variables.end()) return std::nullopt;
      return it->second;
    };
    environment.read_file = [this](const std::string& path) -> Result<std::string> {
      if (unreadable.count(path)) return unreadable.at(path);
      const auto it = files.find(path);
      if (it == files.end()) return NotFoundError(path + ": no such file");
      return it->second;
    };
    return environment;
  }
};

// Moves only when told to, or when the code under test sleeps.
struct FakeClock {
  std::atomic<double> wall{kWallStart};
  double now = 1000;
  std::vector<double> sleeps;
  TokenClock Get() {
    TokenClock clock;
    clock.wall_s = [this] { return wall.load(); };
    clock.now_s = [this] { return now; };
    clock.sleep_s = [this](double s) {
      sleeps.push_back(s);
      now += s;
    };
    clock.uniform01 = [] { return 0.5; };
    return clock;
  }
};

std::string ServiceAccountFile(const std::string& email = kEmail,
                               const std::string& pem = TestKeyPem()) {
  return Json{{"type", "service_account"},
              {"project_id", "proj"},
              {"private_key_id", "kid-1234"},
              {"private_key", pem},
              {"client_email", email},
              {"client_id", "1234567890"},
              {"token_uri", kTokenUri}}
      .dump();
}

std::string AuthorizedUserFile(const std::string& client_id = "7645.apps.googleusercontent.com") {
  return Json{{"type", "authorized_user"},
              {"client_id", client_id},
              {"client_secret", kClientSecret},
              {"refresh_token", kRefreshToken},
              {"quota_project_id", "proj"}}
      .dump();
}

class GcsCredentialsTest : public ::testing::Test {
 protected:
  void SetUp() override { ForgetMetadataServerProbes(); }

  Result<std::shared_ptr<Credentials>> Find(CredentialsOptions options = {}) {
    return FindCredentials(options, environment_.Get(), transport_, clock_.Get());
  }

  std::shared_ptr<Credentials> FindServiceAccount(double timeout_s = 600) {
    environment_.files["/keys/sa.json"] = ServiceAccountFile();
    CredentialsOptions options;
    options.credentials_file = "/keys/sa.json";
    options.timeout_s = timeout_s;
    Result<std::shared_ptr<Credentials>> found = Find(options);
    EXPECT_TRUE(found.ok()) << found.status().ToString();
    return found.ok() ? *found : nullptr;
  }

  // Google's token endpoint for the service account: checks the JWT in
  // full and answers "ya29.token-<n>".
  http::HttpResponse CheckJwtAndAnswer(const http::HttpRequest& request, const std::string& body) {
    EXPECT_EQ(request.method, "POST");
    EXPECT_EQ(request.url, kTokenUri);
    EXPECT_EQ(Header(request, "Content-Type"), "application/x-www-form-urlencoded");
    std::map<std::string, std::string> form = ParseForm(body);
    EXPECT_EQ(form["grant_type"], "urn:ietf:params:oauth:grant-type:jwt-bearer");
    const std::string jwt = form["assertion"];
    const size_t first = jwt.find('.');
    const size_t second = jwt.find('.', first + 1);
    if (second == std::string::npos) return Answer(400, R"({"error":"invalid_grant"})");
    EXPECT_TRUE(VerifyRs256(jwt.substr(0, second), UrlDecodeBase64(jwt.substr(second + 1))));
    const Json header = Json::parse(UrlDecodeBase64(jwt.substr(0, first)), nullptr, false);
    EXPECT_EQ(header, (Json{{"alg", "RS256"}, {"typ", "JWT"}, {"kid", "kid-1234"}}));
    Json claims = Json::parse(UrlDecodeBase64(jwt.substr(first + 1, second - first - 1)),
                              nullptr, false);
    if (!claims.is_object()) return Answer(400, R"({"error":"invalid_grant"})");
    EXPECT_EQ(claims["iss"], kEmail);
    EXPECT_EQ(claims["aud"], kTokenUri);
    EXPECT_EQ(claims["scope"], "https://www.googleapis.com/auth/devstorage.read_write");
    EXPECT_EQ(claims["iat"].get<int64_t>(), static_cast<int64_t>(clock_.wall.load()));
    EXPECT_EQ(claims["exp"].get<int64_t>() - claims["iat"].get<int64_t>(), 3600);
    assertions_.push_back(jwt);
    return TokenAnswer("ya29.token-" + std::to_string(++tokens_issued_), 3600);
  }

  void AnswerAsTokenEndpoint() {
    transport_->handler = [this](const http::HttpRequest& request, const std::string& body) {
      return CheckJwtAndAnswer(request, body);
    };
  }

  // A metadata server that knows kEmail and hands out "ya29.vm".
  void AnswerAsMetadataServer(const std::string& base = kMetadataBase) {
    transport_->handler = [base](const http::HttpRequest& request, const std::string&) {
      EXPECT_EQ(request.method, "GET");
      EXPECT_EQ(Header(request, "Metadata-Flavor"), "Google");
      if (request.url == base + "email") return Answer(200, kEmail, true);
      if (request.url == base + "token") return TokenAnswer("ya29.vm", 3599, true);
      return Answer(404, "Not Found", true);
    };
  }

  FakeEnvironment environment_;
  FakeClock clock_;
  std::shared_ptr<FakeTransport> transport_ = std::make_shared<FakeTransport>();
  std::vector<std::string> assertions_;
  int tokens_issued_ = 0;
};

// --- Service accounts, the cache ---

TEST_F(GcsCredentialsTest, ServiceAccountTradesAVerifiedJwtForABearerToken) {
  AnswerAsTokenEndpoint();
  std::shared_ptr<Credentials> credentials = FindServiceAccount();
  ASSERT_NE(credentials, nullptr);
  EXPECT_EQ(transport_->Count(), 0u);  // no token before the first use
  EXPECT_EQ(credentials->Principal(),
            "service account sk@proj.iam.gserviceaccount.com (key file /keys/sa.json)");
  SK_ASSERT_OK_AND_ASSIGN(std::string authorization, credentials->Authorization());
  EXPECT_EQ(authorization, "Bearer ya29.token-1");
  EXPECT_EQ(assertions_.size(), 1u);
}

TEST_F(GcsCredentialsTest, TokenIsCachedUntilFiveMinutesBeforeItExpires) {
  AnswerAsTokenEndpoint();
  std::shared_ptr<Credentials> credentials = FindServiceAccount();
  EXPECT_EQ(*credentials->Authorization(), "Bearer ya29.token-1");
  EXPECT_EQ(*credentials->Authorization(), "Bearer ya29.token-1");
  EXPECT_EQ(transport_->Count(), 1u);
  clock_.wall = kWallStart + 3600 - 300 - 1;
  EXPECT_EQ(*credentials->Authorization(), "Bearer ya29.token-1");
  EXPECT_EQ(transport_->Count(), 1u);
  clock_.wall = kWallStart + 3600 - 300;
  EXPECT_EQ(*credentials->Authorization(), "Bearer ya29.token-2");  // a new JWT, iat checked
  EXPECT_EQ(transport_->Count(), 2u);
}

TEST_F(GcsCredentialsTest, InvalidateFetchesANewToken) {
  AnswerAsTokenEndpoint();
  std::shared_ptr<Credentials> credentials = FindServiceAccount();
  EXPECT_EQ(*credentials->Authorization(), "Bearer ya29.token-1");
  credentials->Invalidate();
  EXPECT_EQ(*credentials->Authorization(), "Bearer ya29.token-2");
  EXPECT_EQ(*credentials->Authorization(), "Bearer ya29.token-2");
  EXPECT_EQ(transport_->Count(), 2u);
}

TEST_F(GcsCredentialsTest, ConcurrentCallersShareOneRefresh) {
  constexpr int kThreads = 16;
  std::atomic<int> started{0};
  transport_->handler = [&](const http::HttpRequest& request, const std::string& body) {
    while (started.load() < kThreads) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return CheckJwtAndAnswer(request, body);
  };
  std::shared_ptr<Credentials> credentials = FindServiceAccount();
  std::vector<std::string> seen(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      ++started;
      Result<std::string> authorization = credentials->Authorization();
      seen[i] = authorization.ok() ? *authorization : authorization.status().ToString();
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(transport_->Count(), 1u);
  for (const std::string& authorization : seen) EXPECT_EQ(authorization, "Bearer ya29.token-1");
}

TEST_F(GcsCredentialsTest, ConcurrentCallersShareAFailedRefresh) {
  constexpr int kThreads = 16;
  std::atomic<int> started{0};
  transport_->handler = [&](const http::HttpRequest&, const std::string&) {
    while (started.load() < kThreads) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    return Answer(401, R"({"error":"invalid_client"})");
  };
  std::shared_ptr<Credentials> credentials = FindServiceAccount();
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      ++started;
      if (credentials->Authorization().status().code() == StatusCode::kInvalidArgument) ++failed;
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failed.load(), kThreads);
  // One, unless a thread reached the cache only after the refresh ended.
  EXPECT_LT(transport_->Count(), 4u);
}

// --- Retries and errors ---

TEST_F(GcsCredentialsTest, TransientFailuresAreRetried) {
  int calls = 0;
  transport_->handler = [&](const http::HttpRequest& request, const std::string& body) {
    switch (++calls) {
      case 1: return Answer(503, "Service Unavailable");
      case 2: return Failed(http::Transport::kConnectionReset);
      case 3: return Answer(429, R"({"error":"rate_limited"})");
      default: return CheckJwtAndAnswer(request, body);
    }
  };
  std::shared_ptr<Credentials> credentials = FindServiceAccount();
  EXPECT_EQ(*credentials->Authorization(), "Bearer ya29.token-1");
  EXPECT_EQ(transport_->Count(), 4u);
  EXPECT_EQ(clock_.sleeps, (std::vector<double>{0.025, 0.05, 0.1}));
}

TEST_F(GcsCredentialsTest, UnauthorizedIsNotRetriedAndTheErrorNamesWhoAndWhere) {
  transport_->handler = [](const http::HttpRequest&, const std::string&) {
    return Answer(401, R"({"error":"invalid_client",)"
                       R"("error_description":"The OAuth client was not found."})");
  };
  std::shared_ptr<Credentials> credentials = FindServiceAccount();
  const Status status = credentials->Authorization().status();
  EXPECT_EQ(transport_->Count(), 1u);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(status.message(),
                  "service account sk@proj.iam.gserviceaccount.com (key file /keys/sa.json)"));
  EXPECT_TRUE(Has(status.message(), kTokenUri));
  EXPECT_TRUE(Has(status.message(), "HTTP 401: invalid_client: The OAuth client was not found."));
  const std::map<std::string, std::string> form = ParseForm(transport_->bodies[0]);
  const std::string assertion = form.at("assertion");
  EXPECT_EQ(status.message().find(assertion.substr(assertion.rfind('.') + 1)), std::string::npos);
  EXPECT_EQ(status.message().find(assertion), std::string::npos);
  EXPECT_EQ(status.message().find("PRIVATE KEY"), std::string::npos);
  EXPECT_EQ(status.message().find(TestKeyPem().substr(40, 40)), std::string::npos);
}

TEST_F(GcsCredentialsTest, GivesUpWhenTheTimeoutRunsOut) {
  transport_->handler = [](const http::HttpRequest&, const std::string&) {
    return Answer(503, "<html>busy</html>");
  };
  std::shared_ptr<Credentials> credentials = FindServiceAccount(/*timeout_s=*/2);
  const Status status = credentials->Authorization().status();
  EXPECT_EQ(status.code(), StatusCode::kStorage);
  EXPECT_TRUE(Has(status.message(), "HTTP 503: <html>busy</html> (gave up after"));
  EXPECT_LE(clock_.now, 1002);
  EXPECT_GT(transport_->Count(), 3u);
  for (const http::HttpRequest& request : transport_->requests) EXPECT_LE(request.timeout_s, 2);
}

TEST_F(GcsCredentialsTest, ErrorsNeverQuoteSecretsEvenWhenTheServerEchoesThem) {
  environment_.files["/u.json"] = AuthorizedUserFile();
  transport_->handler = [](const http::HttpRequest&, const std::string& body) {
    return Answer(400, Json{{"error", "invalid_grant"},
                            {"error_description", "Bad Request: " + body + " " + kRefreshToken +
                                                      " " + kClientSecret}}
                           .dump());
  };
  CredentialsOptions options;
  options.credentials_file = "/u.json";
  SK_ASSERT_OK_AND_ASSIGN(std::shared_ptr<Credentials> credentials, Find(options));
  const Status status = credentials->Authorization().status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(status.message(), "invalid_grant: Bad Request: "));
  EXPECT_TRUE(Has(status.message(), "<redacted>"));
  EXPECT_TRUE(Has(status.message(), "gcloud auth application-default login"));
  EXPECT_EQ(status.message().find(kRefreshToken), std::string::npos) << status.message();
  EXPECT_EQ(status.message().find(kClientSecret), std::string::npos) << status.message();
  EXPECT_EQ(status.message().find("d-FL95Q19q7MQmFpd7hHD0Ty"), std::string::npos);
}

TEST_F(GcsCredentialsTest, AnswersWithoutAUsableAccessTokenAreErrorsThatDoNotQuoteThem) {
  std::shared_ptr<Credentials> credentials = FindServiceAccount();
  transport_->handler = [](const http::HttpRequest&, const std::string&) {
    return Answer(200, R"({"token_type":"Bearer","expires_in":3599})");
  };
  Status status = credentials->Authorization().status();
  EXPECT_TRUE(Has(status.message(), "no access_token")) << status.message();
  EXPECT_TRUE(Has(status.message(), kTokenUri));
  transport_->handler = [](const http::HttpRequest&, const std::string&) {
    return TokenAnswer("ya29.secret\r\nX-Injected: 1");
  };
  status = credentials->Authorization().status();
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(status.message().find("ya29.secret"), std::string::npos) << status.message();
  transport_->handler = [](const http::HttpRequest&, const std::string&) {
    return TokenAnswer("ya29.secret", -5);
  };
  status = credentials->Authorization().status();
  EXPECT_TRUE(Has(status.message(), "expires_in"));
  EXPECT_EQ(status.message().find("ya29.secret"), std::string::npos) << status.message();
}

// --- gcloud user credentials, the metadata server ---

TEST_F(GcsCredentialsTest, AuthorizedUserPostsItsRefreshToken) {
  environment_.files["/u.json"] = AuthorizedUserFile();
  transport_->handler = [](const http::HttpRequest& request, const std::string& body) {
    EXPECT_EQ(request.method, "POST");
    EXPECT_EQ(request.url, kTokenUri);  // the default when the file names none
    EXPECT_EQ(Header(request, "Content-Type"), "application/x-www-form-urlencoded");
    EXPECT_EQ(body.find('+'), std::string::npos);  // '+' '/' '=' are percent-encoded
    const std::map<std::string, std::string> form = ParseForm(body);
    EXPECT_EQ(form, (std::map<std::string, std::string>{
                        {"grant_type", "refresh_token"},
                        {"client_id", "7645.apps.googleusercontent.com"},
                        {"client_secret", kClientSecret},
                        {"refresh_token", kRefreshToken}}));
    return TokenAnswer("ya29.user");
  };
  CredentialsOptions options;
  options.credentials_file = "/u.json";
  SK_ASSERT_OK_AND_ASSIGN(std::shared_ptr<Credentials> credentials, Find(options));
  EXPECT_EQ(credentials->Principal(),
            "gcloud user credentials (client id 7645.apps.googleusercontent.com, key file "
            "/u.json)");
  EXPECT_EQ(*credentials->Authorization(), "Bearer ya29.user");
  EXPECT_EQ(transport_->Count(), 1u);
}

TEST_F(GcsCredentialsTest, MetadataServerSendsAndRequiresMetadataFlavor) {
  AnswerAsMetadataServer();
  SK_ASSERT_OK_AND_ASSIGN(std::shared_ptr<Credentials> credentials, Find());
  EXPECT_EQ(credentials->Principal(),
            "the VM's service account sk@proj.iam.gserviceaccount.com (metadata server "
            "metadata.google.internal)");
  ASSERT_EQ(transport_->Count(), 1u);
  EXPECT_EQ(transport_->requests[0].url, std::string(kMetadataBase) + "email");
  EXPECT_LE(transport_->requests[0].timeout_s, 3);
  EXPECT_EQ(*credentials->Authorization(), "Bearer ya29.vm");
  ASSERT_EQ(transport_->Count(), 2u);
  EXPECT_EQ(transport_->requests[1].url, std::string(kMetadataBase) + "token");

  // A token answer without the header is not the metadata server's.
  transport_->handler = [](const http::HttpRequest&, const std::string&) {
    return TokenAnswer("ya29.proxy", 3599, /*metadata_flavor=*/false);
  };
  credentials->Invalidate();
  const Status status = credentials->Authorization().status();
  EXPECT_TRUE(Has(status.message(), "Metadata-Flavor")) << status.message();
  EXPECT_EQ(status.message().find("ya29.proxy"), std::string::npos);
}

TEST_F(GcsCredentialsTest, MetadataProbeIsCachedPerHost) {
  AnswerAsMetadataServer();
  SK_ASSERT_OK(Find().status());
  SK_ASSERT_OK(Find().status());
  EXPECT_EQ(transport_->Count(), 1u);
  environment_.variables["GCE_METADATA_HOST"] = "10.0.0.9:8080";
  SK_ASSERT_OK_AND_ASSIGN(std::shared_ptr<Credentials> moved, Find());
  EXPECT_EQ(transport_->Count(), 2u);
  // That host's server answers 404 to the email of the default account.
  EXPECT_EQ(moved->Principal(),
            "anonymous (the metadata server 10.0.0.9:8080 has no service account for this VM)");
}

TEST_F(GcsCredentialsTest, GceMetadataHostMovesTheMetadataServer) {
  environment_.variables["GCE_METADATA_HOST"] = "127.0.0.1:8999";
  AnswerAsMetadataServer(
      "http://127.0.0.1:8999/computeMetadata/v1/instance/service-accounts/default/");
  SK_ASSERT_OK_AND_ASSIGN(std::shared_ptr<Credentials> credentials, Find());
  EXPECT_TRUE(Has(credentials->Principal(), "(metadata server 127.0.0.1:8999)"));
  EXPECT_EQ(*credentials->Authorization(), "Bearer ya29.vm");
  for (const http::HttpRequest& request : transport_->requests) {
    EXPECT_EQ(request.url.rfind("http://127.0.0.1:8999/", 0), 0u) << request.url;
  }
}

TEST_F(GcsCredentialsTest, NoMetadataServerMeansAnonymous) {
  // The default transport: metadata.google.internal does not resolve.
  SK_ASSERT_OK_AND_ASSIGN(std::shared_ptr<Credentials> credentials, Find());
  EXPECT_EQ(credentials->Principal(), "anonymous");
  EXPECT_EQ(*credentials->Authorization(), "");
  EXPECT_EQ(transport_->Count(), 1u);  // no retry of a name that does not resolve

  // A server that stays silent is given a few short tries.
  ForgetMetadataServerProbes();
  transport_->handler = [](const http::HttpRequest&, const std::string&) {
    return Failed(http::Transport::kTimedOut);
  };
  SK_ASSERT_OK_AND_ASSIGN(credentials, Find());
  EXPECT_EQ(credentials->Principal(), "anonymous");
  EXPECT_EQ(transport_->Count(), 4u);
  for (const http::HttpRequest& request : transport_->requests) EXPECT_LE(request.timeout_s, 1);

  // Nothing listens there: no retry either.
  ForgetMetadataServerProbes();
  transport_->handler = [](const http::HttpRequest&, const std::string&) {
    return Failed(http::Transport::kConnectFailed);
  };
  SK_ASSERT_OK_AND_ASSIGN(credentials, Find());
  EXPECT_EQ(credentials->Principal(), "anonymous");
  EXPECT_EQ(transport_->Count(), 5u);

  // Another server under that name (its answer lacks Metadata-Flavor).
  ForgetMetadataServerProbes();
  transport_->handler = [](const http::HttpRequest&, const std::string&) {
    return Answer(200, kEmail);
  };
  SK_ASSERT_OK_AND_ASSIGN(credentials, Find());
  EXPECT_EQ(credentials->Principal(), "anonymous");
}

TEST_F(GcsCredentialsTest, VmWithoutServiceAccountIsAnonymousAndSaysSo) {
  transport_->handler = [](const http::HttpRequest&, const std::string&) {
    return Answer(404, "Not Found", true);
  };
  SK_ASSERT_OK_AND_ASSIGN(std::shared_ptr<Credentials> credentials, Find());
  EXPECT_EQ(credentials->Principal(),
            "anonymous (the metadata server metadata.google.internal has no service account for "
            "this VM)");
}

// --- Discovery order ---

class GcsCredentialsDiscoveryTest : public GcsCredentialsTest {
 protected:
  // Every source present, each naming itself.
  void SetUp() override {
    GcsCredentialsTest::SetUp();
    environment_.files["/explicit.json"] = ServiceAccountFile("explicit@p.iam.gserviceaccount.com");
    environment_.files["/gac.json"] = ServiceAccountFile("gac@p.iam.gserviceaccount.com");
    environment_.files["/cfg/application_default_credentials.json"] =
        AuthorizedUserFile("cloudsdk");
    environment_.files["/home/u/.config/gcloud/application_default_credentials.json"] =
        AuthorizedUserFile("home");
    environment_.variables = {{"GOOGLE_APPLICATION_CREDENTIALS", "/gac.json"},
                              {"CLOUDSDK_CONFIG", "/cfg"},
                              {"HOME", "/home/u"}};
    AnswerAsMetadataServer();
  }

  std::string Principal(CredentialsOptions options = {}) {
    Result<std::shared_ptr<Credentials>> found = Find(options);
    return found.ok() ? (*found)->Principal() : found.status().ToString();
  }
};

TEST_F(GcsCredentialsDiscoveryTest, AnonymousOptionWinsOverEverything) {
  CredentialsOptions options;
  options.anonymous = true;
  options.credentials_file = "/explicit.json";
  EXPECT_EQ(Principal(options), "anonymous");
}

TEST_F(GcsCredentialsDiscoveryTest, ExplicitFileWinsOverTheEnvironment) {
  CredentialsOptions options;
  options.credentials_file = "/explicit.json";
  EXPECT_EQ(Principal(options),
            "service account explicit@p.iam.gserviceaccount.com (key file /explicit.json)");
  EXPECT_EQ(transport_->Count(), 0u);
}

TEST_F(GcsCredentialsDiscoveryTest, ThenGoogleApplicationCredentials) {
  EXPECT_EQ(Principal(), "service account gac@p.iam.gserviceaccount.com (key file /gac.json)");
}

TEST_F(GcsCredentialsDiscoveryTest, ThenGcloudAdcFileInCloudsdkConfig) {
  environment_.variables.erase("GOOGLE_APPLICATION_CREDENTIALS");
  EXPECT_EQ(Principal(), "gcloud user credentials (client id cloudsdk, key file "
                         "/cfg/application_default_credentials.json)");
  // CLOUDSDK_CONFIG replaces ~/.config/gcloud, as in gcloud: no fallback.
  environment_.files.erase("/cfg/application_default_credentials.json");
  EXPECT_TRUE(Has(Principal(), "the VM's service account"));
}

TEST_F(GcsCredentialsDiscoveryTest, ThenGcloudAdcFileInHome) {
  environment_.variables.erase("GOOGLE_APPLICATION_CREDENTIALS");
  environment_.variables.erase("CLOUDSDK_CONFIG");
  EXPECT_EQ(Principal(), "gcloud user credentials (client id home, key file "
                         "/home/u/.config/gcloud/application_default_credentials.json)");
}

TEST_F(GcsCredentialsDiscoveryTest, ThenTheMetadataServerThenAnonymous) {
  environment_.variables = {{"HOME", "/nowhere"}};
  EXPECT_EQ(Principal(), "the VM's service account sk@proj.iam.gserviceaccount.com (metadata "
                         "server metadata.google.internal)");
  ForgetMetadataServerProbes();
  transport_->handler = nullptr;
  EXPECT_EQ(Principal(), "anonymous");
  environment_.variables.clear();  // no HOME at all
  EXPECT_EQ(Principal(), "anonymous");
}

TEST_F(GcsCredentialsDiscoveryTest, EmptyVariablesCountAsUnset) {
  environment_.variables["GOOGLE_APPLICATION_CREDENTIALS"] = "";
  environment_.variables["CLOUDSDK_CONFIG"] = "";
  EXPECT_TRUE(Has(Principal(), "client id home"));
}

TEST_F(GcsCredentialsDiscoveryTest, AMissingNamedFileIsAnErrorNotAFallThrough) {
  environment_.variables["GOOGLE_APPLICATION_CREDENTIALS"] = "/missing.json";
  const Status status = Find().status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(status.message(), "/missing.json (named by GOOGLE_APPLICATION_CREDENTIALS)"));
  CredentialsOptions options;
  options.credentials_file = "/missing.json";
  EXPECT_EQ(Find(options).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(GcsCredentialsDiscoveryTest, ABrokenOrUnreadableAdcFileIsAnError) {
  environment_.variables.erase("GOOGLE_APPLICATION_CREDENTIALS");
  environment_.files["/cfg/application_default_credentials.json"] = "{not json";
  Status status = Find().status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(status.message(), "/cfg/application_default_credentials.json"));
  environment_.unreadable["/cfg/application_default_credentials.json"] =
      StorageError("opening it: Permission denied");
  status = Find().status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(status.message(), "Permission denied"));
}

// --- Bad key files ---

TEST_F(GcsCredentialsTest, BadKeyFilesAreInvalidArgumentsNamingTheFileAndField) {
  Json no_key = Json::parse(ServiceAccountFile());
  no_key.erase("private_key");
  Json not_pem = Json::parse(ServiceAccountFile());
  not_pem["private_key"] = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj";
  Json no_refresh = Json::parse(AuthorizedUserFile());
  no_refresh.erase("refresh_token");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"this is not JSON", "expected a JSON document"},
      {"[1, 2]", "expected a JSON object"},
      {R"({"type":"external_account","audience":"x"})", "field 'type' is 'external_account'"},
      {R"({"client_email":"a@b"})", "field 'type' is missing"},
      {no_key.dump(), "field 'private_key' is missing"},
      {not_pem.dump(), "field 'private_key' is not an unencrypted PEM private key"},
      {no_refresh.dump(), "field 'refresh_token' is missing"},
  };
  for (const auto& [content, problem] : cases) {
    environment_.files["/bad/key.json"] = content;
    CredentialsOptions options;
    options.credentials_file = "/bad/key.json";
    const Status status = Find(options).status();
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
    EXPECT_TRUE(Has(status.message(), "GCS credentials file /bad/key.json"));
    EXPECT_TRUE(Has(status.message(), problem));
    EXPECT_EQ(status.message().find("MIIEvQ"), std::string::npos) << status.message();
  }
  EXPECT_EQ(transport_->Count(), 0u);
}

}  // namespace
}  // namespace shardkeep::gcs

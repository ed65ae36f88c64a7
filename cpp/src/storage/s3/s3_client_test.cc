#include "storage/s3/s3_client.h"

#include <gtest/gtest.h>

#include <deque>
#include <mutex>

#include "testing/status_matchers.h"

namespace shardkeep::s3 {
namespace {

using ::shardkeep::testing::Has;

constexpr const char* kSecret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

// Answers from a script, in order; records what was asked.
class ScriptedTransport : public http::HttpTransport {
 public:
  void Then(http::HttpResponse response) { script_.push_back(std::move(response)); }
  void Perform(const http::HttpRequest& request, http::HttpResponse* response) override {
    std::lock_guard<std::mutex> lock(mu_);
    requests.push_back(request);
    // The body is the caller's memory, gone once the call returns.
    bodies.emplace_back(request.body);
    requests.back().body = std::string_view();
    if (script_.empty()) {
      *response = Status(500, "");
      return;
    }
    *response = std::move(script_.front());
    script_.pop_front();
  }

  static http::HttpResponse Status(int code, std::string body) {
    http::HttpResponse response;
    response.status = code;
    response.body = std::move(body);
    return response;
  }
  static http::HttpResponse Error(int code, const std::string& error_code) {
    return Status(code, "<Error><Code>" + error_code +
                            "</Code><Message>server says " + error_code +
                            "</Message><RequestId>req-1</RequestId></Error>");
  }
  static http::HttpResponse Dropped(http::Transport transport) {
    http::HttpResponse response;
    response.transport = transport;
    response.transport_detail = "Connection reset by peer";
    return response;
  }

  std::vector<http::HttpRequest> requests;
  std::vector<std::string> bodies;

 private:
  std::mutex mu_;
  std::deque<http::HttpResponse> script_;
};

// A clock that moves only when the client sleeps.
struct FakeClock {
  double now = 1000;
  std::vector<double> sleeps;
  RetryClock clock() {
    RetryClock clock;
    clock.now_s = [this] { return now; };
    clock.sleep_s = [this](double s) {
      sleeps.push_back(s);
      now += s;
    };
    clock.uniform01 = [] { return 0.5; };
    clock.wall = [] {
      return std::chrono::system_clock::time_point(
          std::chrono::seconds(1700000000));
    };
    return clock;
  }
};

S3Config TestConfig() {
  S3Config config;
  config.credentials.access_key_id = "AKIDEXAMPLE";
  config.credentials.secret_access_key = kSecret;
  config.region = "us-east-1";
  config.endpoint = "http://127.0.0.1:9000";
  config.path_style = true;
  return config;
}

class S3ClientTest : public ::testing::Test {
 protected:
  S3Client Client(double timeout_s = 60) {
    S3ClientOptions options;
    options.timeout_s = timeout_s;
    return S3Client(TestConfig(), "bucket", transport_, options,
                    clock_.clock());
  }

  std::shared_ptr<ScriptedTransport> transport_ =
      std::make_shared<ScriptedTransport>();
  FakeClock clock_;
};

TEST_F(S3ClientTest, RetriesServiceUnavailableSlowDownAndResetThenSucceeds) {
  transport_->Then(ScriptedTransport::Error(503, "ServiceUnavailable"));
  transport_->Then(ScriptedTransport::Error(503, "SlowDown"));
  transport_->Then(ScriptedTransport::Dropped(http::Transport::kConnectionReset));
  transport_->Then(ScriptedTransport::Error(500, "InternalError"));
  transport_->Then(ScriptedTransport::Error(429, "TooManyRequests"));
  transport_->Then(ScriptedTransport::Status(200, "payload"));
  SK_ASSERT_OK_AND_ASSIGN(std::string body, Client().GetObject("dir/key"));
  EXPECT_EQ(body, "payload");
  ASSERT_EQ(transport_->requests.size(), 6u);
  // Full jitter at 0.5 of min(5, 0.05 * 2^(n-1)).
  EXPECT_EQ(clock_.sleeps,
            (std::vector<double>{0.025, 0.05, 0.1, 0.2, 0.4}));
  for (const http::HttpRequest& request : transport_->requests) {
    EXPECT_EQ(request.method, "GET");
    EXPECT_EQ(request.url, "http://127.0.0.1:9000/bucket/dir/key");
  }
}

TEST_F(S3ClientTest, EachAttemptIsSignedAndCarriesTheHost) {
  transport_->Then(ScriptedTransport::Error(503, "SlowDown"));
  transport_->Then(ScriptedTransport::Status(200, ""));
  SK_ASSERT_OK(Client().PutObject("a b/c", "data"));
  ASSERT_EQ(transport_->requests.size(), 2u);
  for (const std::string& body : transport_->bodies) EXPECT_EQ(body, "data");
  for (const http::HttpRequest& request : transport_->requests) {
    EXPECT_EQ(request.url, "http://127.0.0.1:9000/bucket/a%20b/c");
    std::map<std::string, std::string> headers(request.headers.begin(),
                                               request.headers.end());
    EXPECT_EQ(headers["Host"], "127.0.0.1:9000");
    EXPECT_EQ(headers["x-amz-content-sha256"], Sha256Hex("data"));
    EXPECT_TRUE(Has(headers["authorization"], "Credential=AKIDEXAMPLE/"));
    for (const auto& [name, value] : request.headers) {
      EXPECT_FALSE(Has(value, kSecret)) << name;
    }
  }
}

TEST_F(S3ClientTest, ForbiddenIsNotRetriedAndNamesKeyIdNotSecret) {
  transport_->Then(ScriptedTransport::Error(403, "SignatureDoesNotMatch"));
  transport_->Then(ScriptedTransport::Status(200, "too late"));
  const Status status = Client().GetObject("ckpt/_SHARDKEEP").status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
  EXPECT_EQ(transport_->requests.size(), 1u);
  EXPECT_TRUE(clock_.sleeps.empty());
  EXPECT_TRUE(Has(status.message(), "s3://bucket/ckpt/_SHARDKEEP"));
  EXPECT_TRUE(Has(status.message(), "SignatureDoesNotMatch"));
  EXPECT_TRUE(Has(status.message(), "AKIDEXAMPLE"));
  EXPECT_FALSE(Has(status.message(), kSecret));
}

TEST_F(S3ClientTest, RefusedHeadIsExplainedByAOneByteGet) {
  transport_->Then(ScriptedTransport::Status(403, ""));  // HEAD: no body
  transport_->Then(ScriptedTransport::Error(403, "SignatureDoesNotMatch"));
  const Status status = Client().HeadObject("k").status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
  EXPECT_TRUE(Has(status.message(), "HeadObject s3://bucket/k"));
  EXPECT_TRUE(Has(status.message(), "SignatureDoesNotMatch"));
  EXPECT_TRUE(Has(status.message(), "AKIDEXAMPLE"));
  ASSERT_EQ(transport_->requests.size(), 2u);
  EXPECT_EQ(transport_->requests[1].method, "GET");
  EXPECT_EQ(transport_->requests[1].dst_capacity, 1u);

  // A missing object is an answer, not a failure to explain.
  transport_->Then(ScriptedTransport::Status(404, ""));
  SK_ASSERT_OK_AND_ASSIGN(std::optional<uint64_t> size,
                          Client().HeadObject("k"));
  EXPECT_FALSE(size.has_value());
  EXPECT_EQ(transport_->requests.size(), 3u);
}

TEST_F(S3ClientTest, ClientErrorsAreNotRetried) {
  const std::vector<std::pair<http::HttpResponse, StatusCode>> cases = {
      {ScriptedTransport::Error(404, "NoSuchKey"), StatusCode::kNotFound},
      {ScriptedTransport::Error(404, "NoSuchBucket"),
       StatusCode::kInvalidArgument},
      {ScriptedTransport::Error(400, "InvalidRequest"), StatusCode::kStorage},
      {ScriptedTransport::Error(412, "PreconditionFailed"),
       StatusCode::kAlreadyExists},
      {ScriptedTransport::Dropped(http::Transport::kResolveFailed),
       StatusCode::kStorage},
  };
  for (const auto& [response, code] : cases) {
    transport_->requests.clear();
    transport_->Then(response);
    const Status status = Client().PutObject("k", "v");
    EXPECT_EQ(status.code(), code) << status.ToString();
    EXPECT_EQ(transport_->requests.size(), 1u) << status.ToString();
    EXPECT_TRUE(Has(status.message(), "PutObject s3://bucket/k"));
  }
  EXPECT_TRUE(clock_.sleeps.empty());
}

TEST_F(S3ClientTest, GivesUpAtTheDeadlineWithTheLastError) {
  // The script is empty: every attempt answers 500.
  const Status status = Client(/*timeout_s=*/3).PutObject("k", "v");
  EXPECT_EQ(status.code(), StatusCode::kStorage) << status.ToString();
  EXPECT_TRUE(Has(status.message(), "HTTP 500"));
  EXPECT_TRUE(Has(status.message(), "gave up after"));
  EXPECT_TRUE(Has(status.message(), "timeout_s is 3.0"));
  // Every wait was taken within the deadline.
  double slept = 0;
  for (const double s : clock_.sleeps) slept += s;
  EXPECT_LE(slept, 3.0);
  EXPECT_LE(clock_.now, 1003.0);
  EXPECT_EQ(transport_->requests.size(), clock_.sleeps.size() + 1);
  EXPECT_GE(transport_->requests.size(), 5u);
  // Each attempt may use only what is left of the deadline.
  EXPECT_DOUBLE_EQ(transport_->requests.front().timeout_s, 3.0);
  EXPECT_LT(transport_->requests.back().timeout_s, 3.0);
}

TEST_F(S3ClientTest, HandledStatusesAreAnswersAndReportEarlierAttempts) {
  transport_->Then(ScriptedTransport::Dropped(http::Transport::kTimedOut));
  transport_->Then(ScriptedTransport::Error(412, "PreconditionFailed"));
  S3Request request;
  request.operation = "PutObject";
  request.method = "PUT";
  request.key = "k";
  request.headers = {{"If-None-Match", "*"}};
  request.handled_statuses = {412};
  SK_ASSERT_OK_AND_ASSIGN(S3Answer answer, Client().Execute(request));
  EXPECT_EQ(answer.response.status, 412);
  EXPECT_EQ(answer.attempts, 2);
  EXPECT_TRUE(answer.earlier_attempt_may_have_applied);

  // A refused connection never reached the server.
  transport_->Then(ScriptedTransport::Dropped(http::Transport::kConnectFailed));
  transport_->Then(ScriptedTransport::Error(412, "PreconditionFailed"));
  SK_ASSERT_OK_AND_ASSIGN(answer, Client().Execute(request));
  EXPECT_FALSE(answer.earlier_attempt_may_have_applied);
}

TEST_F(S3ClientTest, ErrorInsideCompleteMultipartUploadIsRetried) {
  transport_->Then(ScriptedTransport::Status(
      200, "<Error><Code>InternalError</Code><Message>try again</Message>"
           "</Error>"));
  transport_->Then(ScriptedTransport::Status(
      200, "<CompleteMultipartUploadResult><ETag>\"e\"</ETag>"
           "</CompleteMultipartUploadResult>"));
  SK_ASSERT_OK(Client().CompleteMultipartUpload("k", "id-1",
                                                {{1, "\"a\""}, {2, "\"b\""}}));
  ASSERT_EQ(transport_->requests.size(), 2u);
  EXPECT_EQ(transport_->requests[0].url,
            "http://127.0.0.1:9000/bucket/k?uploadId=id-1");
  EXPECT_TRUE(Has(transport_->bodies[0], "<PartNumber>2</PartNumber>"));
}

TEST_F(S3ClientTest, CopyObjectSaysWhenTheServerCannotCopy) {
  transport_->Then(ScriptedTransport::Status(200, "<CopyObjectResult></CopyObjectResult>"));
  transport_->Then(ScriptedTransport::Error(501, "NotImplemented"));
  transport_->Then(ScriptedTransport::Error(404, "NoSuchKey"));
  S3Client client = Client();
  SK_ASSERT_OK_AND_ASSIGN(bool copied, client.CopyObject("a/from", "a/to"));
  EXPECT_TRUE(copied);
  SK_ASSERT_OK_AND_ASSIGN(copied, client.CopyObject("a/from", "a/to"));
  EXPECT_FALSE(copied);  // not retried: the server lacks the feature
  Result<bool> missing = client.CopyObject("a/gone", "a/to");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status().ToString();
  ASSERT_EQ(transport_->requests.size(), 3u);
  EXPECT_EQ(transport_->requests[0].method, "PUT");
  EXPECT_EQ(transport_->requests[0].url, "http://127.0.0.1:9000/bucket/a/to");
}

TEST_F(S3ClientTest, ListingQueryIsSortedAndEncoded) {
  transport_->Then(ScriptedTransport::Status(
      200, "<ListBucketResult><EncodingType>url</EncodingType>"
           "<IsTruncated>false</IsTruncated><Contents><Key>a%2Fb+c</Key>"
           "<Size>3</Size></Contents></ListBucketResult>"));
  SK_ASSERT_OK_AND_ASSIGN(ListObjectsPage page,
                          Client().ListPage("a/", "/", 0, ""));
  ASSERT_EQ(page.objects.size(), 1u);
  EXPECT_EQ(page.objects[0].key, "a/b c");
  EXPECT_EQ(transport_->requests[0].url,
            "http://127.0.0.1:9000/bucket?delimiter=%2F&encoding-type=url&"
            "list-type=2&prefix=a%2F");
}

TEST_F(S3ClientTest, DeleteObjectsSendsContentMd5AndReportsFailures) {
  transport_->Then(ScriptedTransport::Status(
      200, "<DeleteResult><Error><Key>x/2</Key><Code>AccessDenied</Code>"
           "<Message>no</Message></Error></DeleteResult>"));
  const Status status = Client().DeleteObjects({"x/1", "x/2"});
  EXPECT_EQ(status.code(), StatusCode::kStorage) << status.ToString();
  EXPECT_TRUE(Has(status.message(), "s3://bucket/x/2"));
  EXPECT_TRUE(Has(status.message(), "AccessDenied"));
  const http::HttpRequest& request = transport_->requests.at(0);
  EXPECT_EQ(request.method, "POST");
  EXPECT_EQ(request.url, "http://127.0.0.1:9000/bucket?delete=");
  bool has_md5 = false;
  for (const auto& [name, value] : request.headers) {
    if (name == "Content-MD5") {
      has_md5 = true;
      EXPECT_EQ(value.size(), 24u);  // base64 of 16 bytes
    }
  }
  EXPECT_TRUE(has_md5);
}

// The value of header `name` in `request`; empty when absent.
std::string Header(const http::HttpRequest& request, const std::string& name) {
  for (const auto& [key, value] : request.headers) {
    if (key == name) return value;
  }
  return "";
}

// Every body goes with its MD5, so that the store refuses one damaged on
// the way; the same value on each attempt. Base64 of MD5("0123456789")
// and of MD5("part").
TEST_F(S3ClientTest, BodiesCarryTheirContentMd5) {
  transport_->Then(ScriptedTransport::Status(200, ""));
  SK_ASSERT_OK(Client().PutObject("k", "0123456789"));
  auto part = ScriptedTransport::Status(200, "");
  part.etag = "\"e\"";
  transport_->Then(part);
  SK_ASSERT_OK(Client().UploadPart("k", "upload-1", 1, "part").status());
  transport_->Then(ScriptedTransport::Status(200, ""));
  SK_ASSERT_OK(Client().GetObject("k").status());
  ASSERT_EQ(transport_->requests.size(), 3u);
  EXPECT_EQ(Header(transport_->requests[0], "Content-MD5"), "eB5eJF1ptWaXm4bijSPyxw==");
  EXPECT_EQ(Header(transport_->requests[1], "Content-MD5"), "9Mk4XxkC9zNLALm07NFk3g==");
  EXPECT_EQ(Header(transport_->requests[2], "Content-MD5"), "");  // no body
  // Signed, so that a proxy cannot strip it unnoticed.
  EXPECT_TRUE(Has(Header(transport_->requests[0], "authorization"), "content-md5"));
}

// A body the store found damaged (BadDigest) was not stored: it is sent
// again, with the same digest, and the second attempt succeeds.
TEST_F(S3ClientTest, BadDigestIsSentAgain) {
  transport_->Then(ScriptedTransport::Error(400, "BadDigest"));
  transport_->Then(ScriptedTransport::Status(200, ""));
  SK_ASSERT_OK(Client().PutObject("k", "0123456789"));
  ASSERT_EQ(transport_->requests.size(), 2u);
  EXPECT_EQ(transport_->bodies[1], "0123456789");
  EXPECT_EQ(Header(transport_->requests[1], "Content-MD5"), "eB5eJF1ptWaXm4bijSPyxw==");
}

}  // namespace
}  // namespace shardkeep::s3

#include "storage/s3/s3_errors.h"

#include <gtest/gtest.h>

#include <vector>

#include "testing/status_matchers.h"

namespace shardkeep::s3 {
namespace {

using ::shardkeep::testing::Has;

S3Failure Answered(int http_status, std::string code = "",
                   std::string message = "") {
  S3Failure failure;
  failure.operation = "PutObject";
  failure.bucket = "bucket";
  failure.key = "ckpt/_SHARDKEEP";
  failure.access_key_id = "AKIDEXAMPLE";
  failure.http_status = http_status;
  if (!code.empty()) {
    failure.error = ErrorDocument{code, message, "4442587FB7D0A2F9",
                                  "/bucket/ckpt/_SHARDKEEP"};
  }
  return failure;
}

S3Failure Lost(Transport transport) {
  S3Failure failure = Answered(0);
  failure.transport = transport;
  failure.transport_detail = "Connection reset by peer";
  return failure;
}

TEST(S3ErrorsTest, MessageNamesOperationObjectCodeMessageAndRequestId) {
  const Status status =
      ToStatus(Answered(500, "InternalError", "We encountered an error."));
  EXPECT_EQ(status.code(), StatusCode::kStorage);
  EXPECT_EQ(status.message(),
            "PutObject s3://bucket/ckpt/_SHARDKEEP: HTTP 500 InternalError: "
            "We encountered an error. (request id 4442587FB7D0A2F9)");
}

TEST(S3ErrorsTest, MissingObjectsAndUploadsAreNotFoundAMissingBucketIsNot) {
  EXPECT_EQ(ToStatus(Answered(404)).code(), StatusCode::kNotFound);  // HEAD
  for (const char* code : {"NoSuchKey", "NoSuchUpload"}) {
    const Status status = ToStatus(Answered(404, code, "m"));
    EXPECT_EQ(status.code(), StatusCode::kNotFound) << code;
    EXPECT_TRUE(Has(status.message(), code));
    EXPECT_FALSE(IsRetryable(Answered(404, code, "m")));
  }
  // A missing bucket must not read as an empty prefix.
  S3Failure bucket_level = Answered(404, "NoSuchBucket", "m");
  bucket_level.operation = "ListObjectsV2";
  bucket_level.key.clear();
  const Status missing_bucket = ToStatus(bucket_level);
  EXPECT_EQ(missing_bucket.code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(IsRetryable(bucket_level));
  EXPECT_TRUE(Has(missing_bucket.message(),
                  "ListObjectsV2 s3://bucket: HTTP 404 NoSuchBucket"));
  EXPECT_TRUE(Has(missing_bucket.message(), "the bucket does not exist"));
}

TEST(S3ErrorsTest, FailedConditionalPutIsAlreadyExists) {
  for (const S3Failure& failure :
       {Answered(412), Answered(412, "PreconditionFailed",
                                "At least one of the pre-conditions you "
                                "specified did not hold")}) {
    const Status status = ToStatus(failure);
    EXPECT_EQ(status.code(), StatusCode::kAlreadyExists);
    EXPECT_TRUE(Has(status.message(), "another writer came first"));
    EXPECT_FALSE(IsRetryable(failure));
  }
}

TEST(S3ErrorsTest, RejectedCredentialsNameTheKeyIdNeverTheSecret) {
  for (const char* code : {"InvalidAccessKeyId", "SignatureDoesNotMatch",
                           "ExpiredToken", "InvalidToken"}) {
    S3Failure failure = Answered(403, code, "The request signature ...");
    const Status status = ToStatus(failure);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << code;
    EXPECT_TRUE(Has(status.message(), "access key id 'AKIDEXAMPLE'"));
    EXPECT_TRUE(Has(status.message(), "AWS_SECRET_ACCESS_KEY"));
    EXPECT_FALSE(IsRetryable(failure));
  }
  S3Failure anonymous = Answered(403, "SignatureDoesNotMatch", "m");
  anonymous.access_key_id.clear();
  EXPECT_TRUE(Has(ToStatus(anonymous).message(),
                  "no access key id was configured"));
}

TEST(S3ErrorsTest, ClockAndRegionProblemsGetTheirOwnHints) {
  const Status skewed = ToStatus(Answered(403, "RequestTimeTooSkewed", "m"));
  EXPECT_EQ(skewed.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(skewed.message(), "clock"));
  const Status region =
      ToStatus(Answered(400, "AuthorizationHeaderMalformed", "m"));
  EXPECT_EQ(region.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(region.message(), "AWS_REGION"));
}

TEST(S3ErrorsTest, AccessDeniedIsAStorageErrorNamingKeyIdAndBucket) {
  const S3Failure failure = Answered(403, "AccessDenied", "Access Denied");
  const Status status = ToStatus(failure);
  EXPECT_EQ(status.code(), StatusCode::kStorage);
  EXPECT_TRUE(Has(status.message(),
                  "access key id 'AKIDEXAMPLE' lacks permission for PutObject "
                  "on bucket 'bucket'"));
  EXPECT_FALSE(IsRetryable(failure));
  EXPECT_EQ(ToStatus(Answered(403)).code(), StatusCode::kStorage);
}

TEST(S3ErrorsTest, FullOrOverQuotaStoresAreOutOfSpace) {
  EXPECT_EQ(ToStatus(Answered(507)).code(), StatusCode::kOutOfSpace);
  for (const char* code : {"QuotaExceeded", "XMinioStorageFull",
                           "XMinioAdminBucketQuotaExceeded"}) {
    EXPECT_EQ(ToStatus(Answered(403, code, "m")).code(),
              StatusCode::kOutOfSpace)
        << code;
  }
  EXPECT_EQ(ToStatus(Answered(400, "EntityTooLarge", "m")).code(),
            StatusCode::kInvalidArgument);
}

TEST(S3ErrorsTest, RetriesServerTroubleThrottlingAndLostConnections) {
  const std::vector<S3Failure> retryable = {
      Answered(500), Answered(502), Answered(503), Answered(504),
      Answered(429), Answered(408),
      Answered(503, "SlowDown", "Please reduce your request rate."),
      Answered(400, "RequestTimeout", "Your socket connection ..."),
      Answered(409, "ConditionalRequestConflict", "m"),
      // A body damaged on the way, refused by the store.
      Answered(400, "BadDigest", "The Content-MD5 you specified did not match"),
      Answered(400, "XAmzContentSHA256Mismatch", "m"),
      // CompleteMultipartUpload's failure under 200.
      Answered(200, "InternalError", "m"),
      Lost(Transport::kConnectFailed), Lost(Transport::kConnectionReset),
      Lost(Transport::kTimedOut)};
  for (const S3Failure& failure : retryable) {
    EXPECT_TRUE(IsRetryable(failure)) << ToStatus(failure).ToString();
  }
}

TEST(S3ErrorsTest, DoesNotRetryWhatWaitingCannotFix) {
  const std::vector<S3Failure> final_failures = {
      Answered(400), Answered(400, "MalformedXML", "m"),
      Answered(400, "InvalidPart", "m"), Answered(400, "InvalidDigest", "m"),
      Answered(403), Answered(404),
      Answered(412), Answered(501, "NotImplemented", "m"),
      Lost(Transport::kResolveFailed), Lost(Transport::kTlsFailed)};
  for (const S3Failure& failure : final_failures) {
    EXPECT_FALSE(IsRetryable(failure)) << ToStatus(failure).ToString();
  }
}

TEST(S3ErrorsTest, TransportFailuresNameObjectAndCause) {
  const Status status = ToStatus(Lost(Transport::kConnectionReset));
  EXPECT_EQ(status.code(), StatusCode::kStorage);
  EXPECT_EQ(status.message(),
            "PutObject s3://bucket/ckpt/_SHARDKEEP: connection reset: "
            "Connection reset by peer");
}

TEST(S3ErrorsTest, ServerTextIsBoundedAndKeptOnOneLine) {
  const Status status =
      ToStatus(Answered(400, "Bad\nCode", std::string(1000, 'x')));
  EXPECT_TRUE(Has(status.message(), "Bad Code"));
  EXPECT_TRUE(Has(status.message(), std::string(256, 'x') + "..."));
  EXPECT_FALSE(Has(status.message(), std::string(257, 'x')));
}

TEST(S3ErrorsTest, BackoffDoublesUpToTheCapWithFullJitter) {
  const BackoffPolicy policy{0.05, 5.0};
  auto almost_one = [] { return 0.999999; };
  std::vector<double> ceilings;
  for (int retry = 1; retry <= 10; ++retry) {
    ceilings.push_back(*BackoffBeforeRetry(policy, retry, 1e9, almost_one));
  }
  const double expected[] = {0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5, 5, 5};
  for (int i = 0; i < 10; ++i) {
    EXPECT_NEAR(ceilings[i], expected[i] * 0.999999, 1e-12) << i;
  }
  EXPECT_EQ(*BackoffBeforeRetry(policy, 3, 1e9, [] { return 0.0; }), 0.0);
  EXPECT_DOUBLE_EQ(*BackoffBeforeRetry(policy, 3, 1e9, [] { return 0.25; }),
                   0.05);
  // Huge retry counts stay at the cap.
  EXPECT_NEAR(*BackoffBeforeRetry(policy, 100000, 1e9, almost_one), 5.0, 1e-5);
}

TEST(S3ErrorsTest, BackoffGivesUpWhenTheWaitWouldPassTheDeadline) {
  const BackoffPolicy policy{0.05, 5.0};
  auto half = [] { return 0.5; };
  // Retry 8: ceiling 5 s, wait 2.5 s.
  EXPECT_DOUBLE_EQ(*BackoffBeforeRetry(policy, 8, 2.6, half), 2.5);
  EXPECT_FALSE(BackoffBeforeRetry(policy, 8, 2.5, half).has_value());
  EXPECT_FALSE(BackoffBeforeRetry(policy, 1, 0.0, half).has_value());
  EXPECT_FALSE(BackoffBeforeRetry(policy, 1, -1.0, half).has_value());
}

TEST(S3ErrorsTest, BackoffIsDeterministicUnderASeededSource) {
  auto schedule = [](unsigned seed) {
    std::vector<double> waits;
    unsigned state = seed;
    auto lcg = [&state] {
      state = state * 1103515245u + 12345u;
      return (state >> 8) / double(1u << 24);
    };
    for (int retry = 1; retry <= 6; ++retry) {
      waits.push_back(*BackoffBeforeRetry({}, retry, 100.0, lcg));
    }
    return waits;
  };
  EXPECT_EQ(schedule(7), schedule(7));
  EXPECT_NE(schedule(7), schedule(8));
}

}  // namespace
}  // namespace shardkeep::s3

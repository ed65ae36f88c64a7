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

S3Failure Lost(http::Transport transport) {
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
      Lost(http::Transport::kConnectFailed), Lost(http::Transport::kConnectionReset),
      Lost(http::Transport::kTimedOut)};
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
      Lost(http::Transport::kResolveFailed), Lost(http::Transport::kTlsFailed)};
  for (const S3Failure& failure : final_failures) {
    EXPECT_FALSE(IsRetryable(failure)) << ToStatus(failure).ToString();
  }
}

TEST(S3ErrorsTest, TransportFailuresNameObjectAndCause) {
  const Status status = ToStatus(Lost(http::Transport::kConnectionReset));
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

}  // namespace
}  // namespace shardkeep::s3

#include "storage/s3/sigv4.h"

#include <gtest/gtest.h>

#include "testing/status_matchers.h"

namespace shardkeep::s3 {
namespace {

using std::chrono::system_clock;

system_clock::time_point UtcTime(int year, int month, int day, int hour,
                                 int minute) {
  std::tm tm{};
  tm.tm_year = year - 1900;
  tm.tm_mon = month - 1;
  tm.tm_mday = day;
  tm.tm_hour = hour;
  tm.tm_min = minute;
  return system_clock::from_time_t(timegm(&tm));
}

std::string HeaderValue(const http::HeaderList& headers, const std::string& name) {
  for (const auto& [n, v] : headers) {
    if (n == name) return v;
  }
  return "<absent>";
}

// ---------------------------------------------------------------------------
// The AWS Signature Version 4 test suite ("aws-sig-v4-test-suite", published
// by Amazon under the Apache License 2.0 with the general reference's page
// "Signature Version 4 test suite"; read here from the copy in the npm
// package aws-sig-v4-test-suite). Credentials AKIDEXAMPLE, region us-east-1,
// service "service", time 2015-08-30T12:36:00Z; the expected texts below are
// the suite's .creq, .sts and .authz files.
//
// The suite follows the rules of the non-S3 services: paths are normalised
// ("/a/../b") and URI-encoded twice. S3 does neither, so the normalize-path
// cases are not tested here. The cases kept are those where both rules give
// the same canonical request (no '%' or dot segment in the path); get-utf8
// and get-space agree because their paths arrive unencoded and are encoded
// exactly once. get-header-value-multiline (obsolete header folding) and
// post-x-www-form-urlencoded (its .authz signs fewer headers than its .creq
// lists) are left out.
struct SuiteCase {
  const char* name;
  const char* method;
  const char* path;
  http::HeaderList query;
  http::HeaderList headers;
  const char* body;
  const char* canonical_request;
  // nullptr where the suite's .sts is not the hash of its own .creq
  // (post-x-www-form-urlencoded-parameters): only the canonical request is
  // compared there.
  const char* signature;
};

const char* const kGetVanillaCreq =
    "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\n"
    "host;x-amz-date\n"
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

std::vector<SuiteCase> SuiteCases() {
  return {
      {"get-vanilla", "GET", "/", {}, {}, "", kGetVanillaCreq,
       "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"},
      {"get-vanilla-query", "GET", "/", {}, {}, "", kGetVanillaCreq,
       "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"},
      {"get-vanilla-query-order-key-case", "GET", "/",
       {{"Param2", "value2"}, {"Param1", "value1"}}, {}, "",
       "GET\n/\nParam1=value1&Param2=value2\nhost:example.amazonaws.com\n"
       "x-amz-date:20150830T123600Z\n\nhost;x-amz-date\n"
       "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
       "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"},
      {"get-vanilla-query-order-key", "GET", "/",
       {{"Param1", "value2"}, {"Param1", "Value1"}}, {}, "",
       "GET\n/\nParam1=Value1&Param1=value2\nhost:example.amazonaws.com\n"
       "x-amz-date:20150830T123600Z\n\nhost;x-amz-date\n"
       "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
       "eedbc4e291e521cf13422ffca22be7d2eb8146eecf653089df300a15b2382bd1"},
      {"get-vanilla-query-order-value", "GET", "/",
       {{"Param1", "value2"}, {"Param1", "value1"}}, {}, "",
       "GET\n/\nParam1=value1&Param1=value2\nhost:example.amazonaws.com\n"
       "x-amz-date:20150830T123600Z\n\nhost;x-amz-date\n"
       "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
       "5772eed61e12b33fae39ee5e7012498b51d56abc0abb7c60486157bd471c4694"},
      {"get-vanilla-query-unreserved", "GET", "/",
       {{"-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
         "-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"}},
       {}, "",
       "GET\n/\n"
       "-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz="
       "-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz\n"
       "host:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\n"
       "host;x-amz-date\n"
       "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
       "9c3e54bfcdf0b19771a7f523ee5669cdf59bc7cc0884027167c21bb143a40197"},
      {"get-vanilla-empty-query-key", "GET", "/", {{"Param1", "value1"}}, {},
       "",
       "GET\n/\nParam1=value1\nhost:example.amazonaws.com\n"
       "x-amz-date:20150830T123600Z\n\nhost;x-amz-date\n"
       "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
       "a67d582fa61cc504c4bae71f336f98b97f1ea3c7a6bfe1b6e45aec72011b9aeb"},
      {"get-vanilla-utf8-query", "GET", "/", {{"\xE1\x88\xB4", "bar"}}, {}, "",
       "GET\n/\n%E1%88%B4=bar\nhost:example.amazonaws.com\n"
       "x-amz-date:20150830T123600Z\n\nhost;x-amz-date\n"
       "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
       "2cdec8eed098649ff3a119c94853b13c643bcf08f8b0a1d91e12c9027818dd04"},
      {"get-unreserved", "GET",
       "/-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
       {}, {}, "",
       "GET\n"
       "/-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz\n"
       "\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\n"
       "host;x-amz-date\n"
       "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
       "07ef7494c76fa4850883e2b006601f940f8a34d404d0cfa977f52a65bbf5f24f"},
      {"get-utf8", "GET", "/\xE1\x88\xB4", {}, {}, "",
       "GET\n/%E1%88%B4\n\nhost:example.amazonaws.com\n"
       "x-amz-date:20150830T123600Z\n\nhost;x-amz-date\n"
       "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
       "8318018e0b0f223aa2bbf98705b62bb787dc9c0e678f255a891fd03141be5d85"},
      {"get-space (normalize-path)", "GET", "/example space/", {}, {}, "",
       "GET\n/example%20space/\n\nhost:example.amazonaws.com\n"
       "x-amz-date:20150830T123600Z\n\nhost;x-amz-date\n"
       "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
       "652487583200325589f1fba4c7e578f72c47cb61beeca81406b39ddec1366741"},
      {"get-header-key-duplicate", "GET", "/", {},
       {{"My-Header1", "value2"}, {"My-Header1", "value2"},
        {"My-Header1", "value1"}},
       "",
       "GET\n/\n\nhost:example.amazonaws.com\n"
       "my-header1:value2,value2,value1\nx-amz-date:20150830T123600Z\n\n"
       "host;my-header1;x-amz-date\n"
       "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
       "c9d5ea9f3f72853aea855b47ea873832890dbdd183b4468f858259531a5138ea"},
      {"get-header-value-order", "GET", "/", {},
       {{"My-Header1", "value4"}, {"My-Header1", "value1"},
        {"My-Header1", "value3"}, {"My-Header1", "value2"}},
       "",
       "GET\n/\n\nhost:example.amazonaws.com\n"
       "my-header1:value4,value1,value3,value2\n"
       "x-amz-date:20150830T123600Z\n\nhost;my-header1;x-amz-date\n"
       "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
       "08c7e5a9acfcfeb3ab6b2185e75ce8b1deb5e634ec47601a50643f830c755c01"},
      {"get-header-value-trim", "GET", "/", {},
       {{"My-Header1", " value1"}, {"My-Header2", " \"a   b   c\""}}, "",
       "GET\n/\n\nhost:example.amazonaws.com\nmy-header1:value1\n"
       "my-header2:\"a b c\"\nx-amz-date:20150830T123600Z\n\n"
       "host;my-header1;my-header2;x-amz-date\n"
       "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
       "acc3ed3afb60bb290fc8d2dd0098b9911fcaa05412b367055dee359757a9c736"},
      {"post-vanilla", "POST", "/", {}, {}, "",
       "POST\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n"
       "\nhost;x-amz-date\n"
       "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
       "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b"},
      {"post-vanilla-query", "POST", "/", {{"Param1", "value1"}}, {}, "",
       "POST\n/\nParam1=value1\nhost:example.amazonaws.com\n"
       "x-amz-date:20150830T123600Z\n\nhost;x-amz-date\n"
       "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
       "28038455d6de14eafc1f9222cf5aa6f1a96197d7deb8263271d420d138af7f11"},
      {"post-header-key-sort", "POST", "/", {}, {{"My-Header1", "value1"}}, "",
       "POST\n/\n\nhost:example.amazonaws.com\nmy-header1:value1\n"
       "x-amz-date:20150830T123600Z\n\nhost;my-header1;x-amz-date\n"
       "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
       "c5410059b04c1ee005303aed430f6e6645f61f4dc9e1461ec8f8916fdf18852c"},
      {"post-header-value-case", "POST", "/", {}, {{"My-Header1", "VALUE1"}},
       "",
       "POST\n/\n\nhost:example.amazonaws.com\nmy-header1:VALUE1\n"
       "x-amz-date:20150830T123600Z\n\nhost;my-header1;x-amz-date\n"
       "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
       "cdbc9802e29d2942e5e10b5bccfdd67c5f22c7c4e8ae67b53629efa58b974b7d"},
      {"post-x-www-form-urlencoded-parameters", "POST", "/", {},
       {{"Content-Type", "application/x-www-form-urlencoded; charset=utf-8"},
        {"Content-Length", "13"}},
       "Param1=value1",
       "POST\n/\n\ncontent-length:13\n"
       "content-type:application/x-www-form-urlencoded; charset=utf-8\n"
       "host:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\n"
       "content-length;content-type;host;x-amz-date\n"
       "9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e",
       nullptr},
  };
}

SigningContext SuiteContext() {
  return {{"AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", ""},
          "us-east-1",
          "service",
          UtcTime(2015, 8, 30, 12, 36)};
}

TEST(SigV4Test, AwsTestSuiteVectors) {
  for (const SuiteCase& c : SuiteCases()) {
    HttpRequestToSign request{c.method, "example.amazonaws.com", c.path,
                              c.query, c.headers, Sha256Hex(c.body)};
    SK_ASSERT_OK_AND_ASSIGN(SigV4Signature signed_request,
                            SignRequest(request, SuiteContext()));
    EXPECT_EQ(signed_request.canonical_request, c.canonical_request)
        << c.name;
    if (c.signature != nullptr) {
      EXPECT_EQ(signed_request.signature, c.signature) << c.name;
    }
    EXPECT_EQ(HeaderValue(signed_request.headers_to_add, "x-amz-date"),
              "20150830T123600Z")
        << c.name;
  }
}

TEST(SigV4Test, AwsTestSuiteStringToSignAndAuthorization) {
  // get-vanilla's .sts and .authz files, in full.
  SK_ASSERT_OK_AND_ASSIGN(
      SigV4Signature signed_request,
      SignRequest({"GET", "example.amazonaws.com", "/", {}, {}},
                  SuiteContext()));
  EXPECT_EQ(signed_request.string_to_sign,
            "AWS4-HMAC-SHA256\n20150830T123600Z\n"
            "20150830/us-east-1/service/aws4_request\n"
            "bb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63");
  EXPECT_EQ(HeaderValue(signed_request.headers_to_add, "authorization"),
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/"
            "service/aws4_request, SignedHeaders=host;x-amz-date, "
            "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae"
            "1d763fbf31");
}

TEST(SigV4Test, AwsTestSuiteSessionTokenIsSigned) {
  // post-sts-header-before: the token is part of the canonical request, as
  // S3 requires.
  SigningContext context = SuiteContext();
  context.credentials.session_token =
      "AQoDYXdzEPT//////////wEXAMPLEtc764bNrC9SAPBSM22wDOk4x4HIZ8j4FZTwdQWLWsK"
      "WHGBuFqwAeMicRXmxfpSPfIeoIYRqTflfKD8YUuwthAx7mSEI/qkPpKPi/kMcGdQrmGdeeh"
      "M4IC1NtBmUpp2wUE8phUZampKsburEDy0KPkyQDYwT7WZ0wq5VSXDvp75YU9HFvlRd8Tx6"
      "q6fE8YQcHNVXAkiY9q6d+xo0rKwT38xVqr7ZD0u0iPPkUL64lIZbqBAz+scqKmlzm8FDry"
      "pNC9Yjc8fPOLn9FX9KSYvKTr4rvx3iSIlTJabIQwj2ICCR/oLxBA==";
  SK_ASSERT_OK_AND_ASSIGN(
      SigV4Signature signed_request,
      SignRequest({"POST", "example.amazonaws.com", "/", {}, {}}, context));
  EXPECT_EQ(signed_request.signature,
            "85d96828115b5dc0cfc3bd16ad9e210dd772bbebba041836c64533a82be05ead");
  EXPECT_EQ(HeaderValue(signed_request.headers_to_add, "x-amz-security-token"),
            context.credentials.session_token);
}

// ---------------------------------------------------------------------------
// The S3 examples of Amazon's S3 API reference, "Signature Calculations for
// the Authorization Header: Transferring Payload in a Single Chunk":
// credentials AKIAIOSFODNN7EXAMPLE, bucket examplebucket (virtual-hosted),
// region us-east-1, time 2013-05-24T00:00:00Z.
const char* const kExampleHost = "examplebucket.s3.amazonaws.com";

SigningContext S3ExampleContext() {
  return {{"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
           ""},
          "us-east-1",
          "s3",
          UtcTime(2013, 5, 24, 0, 0)};
}

TEST(SigV4Test, S3ExampleGetObjectWithRange) {
  SK_ASSERT_OK_AND_ASSIGN(
      SigV4Signature signed_request,
      SignS3Request({"GET", kExampleHost, "/test.txt", {},
                     {{"Range", "bytes=0-9"}}},
                    S3ExampleContext()));
  EXPECT_EQ(signed_request.canonical_request,
            "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\n"
            "range:bytes=0-9\n"
            "x-amz-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649"
            "b934ca495991b7852b855\nx-amz-date:20130524T000000Z\n\n"
            "host;range;x-amz-content-sha256;x-amz-date\n"
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(signed_request.string_to_sign,
            "AWS4-HMAC-SHA256\n20130524T000000Z\n"
            "20130524/us-east-1/s3/aws4_request\n"
            "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972");
  EXPECT_EQ(HeaderValue(signed_request.headers_to_add, "authorization"),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/"
            "us-east-1/s3/aws4_request, "
            "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
            "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039"
            "c6036bdb41");
  EXPECT_EQ(HeaderValue(signed_request.headers_to_add, "x-amz-content-sha256"),
            kEmptyPayloadSha256);
}

TEST(SigV4Test, S3ExamplePutObjectEncodesTheKeyOnce) {
  // The key "test$file.text" is signed as /test%24file.text.
  const std::string body = "Welcome to Amazon S3.";
  EXPECT_EQ(Sha256Hex(body),
            "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
  SK_ASSERT_OK_AND_ASSIGN(
      SigV4Signature signed_request,
      SignS3Request({"PUT", kExampleHost, "/test$file.text", {},
                     {{"Date", "Fri, 24 May 2013 00:00:00 GMT"},
                      {"x-amz-storage-class", "REDUCED_REDUNDANCY"}},
                     Sha256Hex(body)},
                    S3ExampleContext()));
  EXPECT_NE(signed_request.canonical_request.find("\n/test%24file.text\n"),
            std::string::npos)
      << signed_request.canonical_request;
  EXPECT_EQ(Sha256Hex(signed_request.canonical_request),
            "9e0e90d9c76de8fa5b200d8c849cd5b8dc7a3be3951ddb7f6a76b4158342019d");
  EXPECT_EQ(signed_request.signature,
            "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
}

TEST(SigV4Test, S3ExampleGetBucketLifecycle) {
  SK_ASSERT_OK_AND_ASSIGN(
      SigV4Signature signed_request,
      SignS3Request({"GET", kExampleHost, "/", {{"lifecycle", ""}}, {}},
                    S3ExampleContext()));
  EXPECT_EQ(Sha256Hex(signed_request.canonical_request),
            "9766c798316ff2757b517bc739a67f6213b4ab36dd5da2f94eaebf79c77395ca");
  EXPECT_EQ(signed_request.signature,
            "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
}

TEST(SigV4Test, S3ExampleListObjectsSortsTheQuery) {
  // Given out of order on purpose: the canonical query must be sorted,
  // which is what libcurl 7.88's built-in signer gets wrong.
  SK_ASSERT_OK_AND_ASSIGN(
      SigV4Signature signed_request,
      SignS3Request(
          {"GET", kExampleHost, "/", {{"prefix", "J"}, {"max-keys", "2"}}, {}},
          S3ExampleContext()));
  EXPECT_NE(signed_request.canonical_request.find("\nmax-keys=2&prefix=J\n"),
            std::string::npos)
      << signed_request.canonical_request;
  EXPECT_EQ(Sha256Hex(signed_request.canonical_request),
            "df57d21db20da04d7fa30298dd4488ba3a2b47ca3a489c74750e0f1e7df1b9b7");
  EXPECT_EQ(signed_request.signature,
            "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}

// ---------------------------------------------------------------------------
// shardkeep's own rules.

TEST(SigV4Test, S3PathsAreEncodedOnceAndNeverNormalised) {
  SK_ASSERT_OK_AND_ASSIGN(
      SigV4Signature signed_request,
      SignS3Request({"GET", "127.0.0.1:8333",
                     "/bucket/ckpt//./a b+c%/\xC3\xBC~", {}, {}},
                    S3ExampleContext()));
  EXPECT_EQ(signed_request.canonical_request.substr(0, 51),
            "GET\n/bucket/ckpt//./a%20b%2Bc%25/%C3%BC~\n\nhost:127.")
      << signed_request.canonical_request;
}

TEST(SigV4Test, QueryValuesAreEncodedAndSortedAfterEncoding) {
  // '/' and '=' inside names and values are encoded, and sorting compares
  // the encoded bytes: "a%2F" comes before "a~" because '%' < '~'.
  SK_ASSERT_OK_AND_ASSIGN(
      SigV4Signature signed_request,
      SignS3Request({"GET", "h", "/", {{"a~", "1"},
                                       {"prefix", "dir/sub dir/"},
                                       {"a/", "x=y"},
                                       {"uploads", ""}},
                     {}},
                    S3ExampleContext()));
  EXPECT_NE(signed_request.canonical_request.find(
                "\na%2F=x%3Dy&a~=1&prefix=dir%2Fsub%20dir%2F&uploads=\n"),
            std::string::npos)
      << signed_request.canonical_request;
}

TEST(SigV4Test, UnsignedPayloadIsSignedAsItsMarker) {
  HttpRequestToSign request{"PUT", "h", "/b/k", {{"partNumber", "1"}}, {}};
  request.payload_sha256 = std::string(kUnsignedPayload);
  SK_ASSERT_OK_AND_ASSIGN(SigV4Signature signed_request,
                          SignS3Request(request, S3ExampleContext()));
  EXPECT_EQ(HeaderValue(signed_request.headers_to_add, "x-amz-content-sha256"),
            "UNSIGNED-PAYLOAD");
  const std::string& creq = signed_request.canonical_request;
  EXPECT_EQ(creq.substr(creq.rfind('\n') + 1), "UNSIGNED-PAYLOAD");
  EXPECT_NE(creq.find("x-amz-content-sha256:UNSIGNED-PAYLOAD\n"),
            std::string::npos);
}

TEST(SigV4Test, SignatureChangesWithEverySignedInput) {
  const HttpRequestToSign base{"GET", "h", "/b/k", {{"p", "1"}},
                               {{"range", "bytes=0-1"}}};
  SK_ASSERT_OK_AND_ASSIGN(SigV4Signature reference,
                          SignS3Request(base, S3ExampleContext()));
  std::vector<HttpRequestToSign> changed(6, base);
  changed[0].method = "HEAD";
  changed[1].host = "h2";
  changed[2].path = "/b/k2";
  changed[3].query = {{"p", "2"}};
  changed[4].headers = {{"range", "bytes=0-2"}};
  changed[5].payload_sha256 = std::string(kUnsignedPayload);
  for (size_t i = 0; i < changed.size(); ++i) {
    SK_ASSERT_OK_AND_ASSIGN(SigV4Signature other,
                            SignS3Request(changed[i], S3ExampleContext()));
    EXPECT_NE(other.signature, reference.signature) << i;
  }
  SigningContext later = S3ExampleContext();
  later.time += std::chrono::seconds(1);
  SK_ASSERT_OK_AND_ASSIGN(SigV4Signature other, SignS3Request(base, later));
  EXPECT_NE(other.signature, reference.signature);
}

TEST(SigV4Test, RejectsMalformedOrReservedHeadersWithoutLeakingSecrets) {
  const SigningContext context = S3ExampleContext();
  const std::vector<http::HeaderList> bad = {
      {{"x-evil", "a\r\nx-injected: 1"}},
      {{"", "v"}},
      {{"a:b", "v"}},
      {{"Host", "other"}},
      {{"Authorization", "x"}},
      {{"X-Amz-Date", "20200101T000000Z"}},
  };
  for (const http::HeaderList& headers : bad) {
    const Status status =
        SignS3Request({"GET", "h", "/", {}, headers}, context).status();
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument)
        << headers[0].first;
    EXPECT_EQ(status.ToString().find(context.credentials.secret_access_key),
              std::string::npos);
  }
  SigningContext no_secret = context;
  no_secret.credentials.secret_access_key.clear();
  EXPECT_EQ(SignS3Request({"GET", "h", "/", {}, {}}, no_secret).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(SignS3Request({"", "h", "/", {}, {}}, context).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardkeep::s3

// Sample answers written from the S3 API reference (ListObjectsV2, Error
// responses, CreateMultipartUpload, CompleteMultipartUpload), then hostile
// variants of them.
#include "storage/s3/s3_xml.h"

#include <gtest/gtest.h>

#include "testing/status_matchers.h"
#include "testing/test_files.h"

namespace shardkeep::s3 {
namespace {

using ::shardkeep::testing::Has;

constexpr char kWhat[] = "ListObjectsV2 s3://bucket/ckpt/";

constexpr char kListPage[] = R"(<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Name>bucket</Name>
  <Prefix>ckpt/</Prefix>
  <KeyCount>3</KeyCount>
  <MaxKeys>1000</MaxKeys>
  <Delimiter>/</Delimiter>
  <IsTruncated>true</IsTruncated>
  <NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=</NextContinuationToken>
  <Contents>
    <Key>ckpt/_SHARDKEEP</Key>
    <LastModified>2026-12-01T10:00:00.000Z</LastModified>
    <ETag>"9b2cf535f27731c974343645a3985328"</ETag>
    <Size>412</Size>
    <StorageClass>STANDARD</StorageClass>
  </Contents>
  <Contents>
    <Key>ckpt/meta.json</Key>
    <Size>18446744073709551615</Size>
  </Contents>
  <CommonPrefixes><Prefix>ckpt/state/</Prefix></CommonPrefixes>
</ListBucketResult>)";

TEST(S3XmlTest, DecodesListObjectsV2PageWithNamespace) {
  SK_ASSERT_OK_AND_ASSIGN(ListObjectsPage page,
                          DecodeListObjectsV2(kListPage, kWhat));
  ASSERT_EQ(page.objects.size(), 2u);
  EXPECT_EQ(page.objects[0].key, "ckpt/_SHARDKEEP");
  EXPECT_EQ(page.objects[0].size, 412u);
  EXPECT_EQ(page.objects[1].key, "ckpt/meta.json");
  EXPECT_EQ(page.objects[1].size, UINT64_MAX);
  EXPECT_EQ(page.common_prefixes, std::vector<std::string>{"ckpt/state/"});
  EXPECT_TRUE(page.is_truncated);
  EXPECT_EQ(page.next_continuation_token,
            "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=");
  EXPECT_EQ(page.key_count, 3u);
}

TEST(S3XmlTest, DecodesLastPageWithoutNamespaceOrKeyCount) {
  SK_ASSERT_OK_AND_ASSIGN(
      ListObjectsPage page,
      DecodeListObjectsV2("<ListBucketResult><IsTruncated>false</IsTruncated>"
                          "</ListBucketResult>",
                          kWhat));
  EXPECT_TRUE(page.objects.empty());
  EXPECT_FALSE(page.is_truncated);
  EXPECT_FALSE(page.key_count.has_value());
}

TEST(S3XmlTest, KeepsKeyWhitespaceAndUnescapesEntities) {
  SK_ASSERT_OK_AND_ASSIGN(
      ListObjectsPage page,
      DecodeListObjectsV2("<ListBucketResult><IsTruncated>false</IsTruncated>"
                          "<Contents><Key> a&amp;b&lt;&#x41; </Key>"
                          "<Size>0</Size></Contents></ListBucketResult>",
                          kWhat));
  ASSERT_EQ(page.objects.size(), 1u);
  EXPECT_EQ(page.objects[0].key, " a&b<A ");
}

TEST(S3XmlTest, PercentDecodesKeysAndPrefixesWithUrlEncoding) {
  SK_ASSERT_OK_AND_ASSIGN(
      ListObjectsPage page,
      DecodeListObjectsV2(
          "<ListBucketResult><EncodingType>url</EncodingType>"
          "<IsTruncated>false</IsTruncated>"
          "<Contents><Key>ckpt/a+b%2Bc%01%E2%82%AC</Key><Size>1</Size>"
          "</Contents><CommonPrefixes><Prefix>ckpt/x%2F</Prefix>"
          "</CommonPrefixes></ListBucketResult>",
          kWhat));
  ASSERT_EQ(page.objects.size(), 1u);
  EXPECT_EQ(page.objects[0].key, "ckpt/a b+c\x01\xE2\x82\xAC");
  EXPECT_EQ(page.common_prefixes, std::vector<std::string>{"ckpt/x/"});
}

TEST(S3XmlTest, RefusesBadPercentEncoding) {
  for (const char* key : {"a%", "a%4", "a%zz", "%G0"}) {
    const auto page = DecodeListObjectsV2(
        std::string("<ListBucketResult><EncodingType>url</EncodingType>"
                    "<IsTruncated>false</IsTruncated><Contents><Key>") +
            key + "</Key><Size>1</Size></Contents></ListBucketResult>",
        kWhat);
    ASSERT_FALSE(page.ok()) << key;
    EXPECT_EQ(page.status().code(), StatusCode::kCorruption);
    EXPECT_TRUE(Has(page.status().message(), "percent-encoding"));
  }
}

TEST(S3XmlTest, RefusesTruncatedListingWithoutToken) {
  const auto page = DecodeListObjectsV2(
      "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>",
      kWhat);
  ASSERT_FALSE(page.ok());
  EXPECT_EQ(page.status().code(), StatusCode::kCorruption);
  EXPECT_TRUE(Has(page.status().message(), kWhat));
  EXPECT_TRUE(Has(page.status().message(), "NextContinuationToken"));
}

TEST(S3XmlTest, RefusesBadFieldsNamingThem) {
  const struct {
    const char* body;
    const char* says;
  } cases[] = {
      {"<ListBucketResult><IsTruncated>yes</IsTruncated></ListBucketResult>",
       "<IsTruncated> is 'yes'"},
      {"<ListBucketResult></ListBucketResult>", "<IsTruncated> is ''"},
      {"<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>k"
       "</Key><Size>-1</Size></Contents></ListBucketResult>",
       "<Size> is '-1'"},
      {"<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>k"
       "</Key><Size>18446744073709551616</Size></Contents></ListBucketResult>",
       "<Size> is '18446744073709551616'"},
      {"<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>k"
       "</Key><Size> 1</Size></Contents></ListBucketResult>",
       "<Size> is ' 1'"},
      {"<ListBucketResult><IsTruncated>false</IsTruncated><Contents>"
       "<Size>1</Size></Contents></ListBucketResult>",
       "<Contents> without a non-empty <Key>"},
      {"<ListBucketResult><IsTruncated>false</IsTruncated><CommonPrefixes/>"
       "</ListBucketResult>",
       "<CommonPrefixes> without a non-empty <Prefix>"},
      {"<ListBucketResult><IsTruncated>false</IsTruncated><KeyCount>x"
       "</KeyCount></ListBucketResult>",
       "<KeyCount> is 'x'"},
      {"<ListBucketResult><EncodingType>base64</EncodingType>"
       "</ListBucketResult>",
       "unknown <EncodingType> 'base64'"},
      {"<Error><Code>NoSuchBucket</Code></Error>",
       "root element <Error>, expected <ListBucketResult>"},
  };
  for (const auto& c : cases) {
    const auto page = DecodeListObjectsV2(c.body, kWhat);
    ASSERT_FALSE(page.ok()) << c.body;
    EXPECT_EQ(page.status().code(), StatusCode::kCorruption) << c.body;
    EXPECT_TRUE(Has(page.status().message(), c.says));
    EXPECT_TRUE(Has(page.status().message(), kWhat));
  }
}

TEST(S3XmlTest, RefusesMalformedXmlSayingWhere) {
  for (const char* body :
       {"", "   ", "<ListBucketResult>", "<a></b>", "not xml",
        "<ListBucketResult><IsTruncated>false</IsTruncated>"
        "</ListBucketResult><extra/>",
        "<ListBucketResult>\xff\xfe</ListBucketResult>"}) {
    const auto page = DecodeListObjectsV2(body, kWhat);
    ASSERT_FALSE(page.ok()) << body;
    EXPECT_EQ(page.status().code(), StatusCode::kCorruption);
    EXPECT_TRUE(Has(page.status().message(), "at line"));
    EXPECT_TRUE(Has(page.status().message(), kWhat));
  }
}

TEST(S3XmlTest, RefusesDoctypeSoNoEntityIsExpanded) {
  const char* billion_laughs =
      "<?xml version=\"1.0\"?><!DOCTYPE lolz [<!ENTITY lol \"lol\">"
      "<!ENTITY lol2 \"&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;\">]>"
      "<ListBucketResult><Name>&lol2;</Name></ListBucketResult>";
  const char* external =
      "<!DOCTYPE r [<!ENTITY x SYSTEM \"file:///etc/passwd\">]>"
      "<Error><Code>&x;</Code></Error>";
  for (const char* body : {billion_laughs, external}) {
    const auto error = DecodeErrorDocument(body, "GET s3://b/k");
    ASSERT_FALSE(error.ok());
    EXPECT_EQ(error.status().code(), StatusCode::kCorruption);
    EXPECT_TRUE(Has(error.status().message(),
                    "refused a document type declaration"));
  }
}

TEST(S3XmlTest, RefusesOversizedBodyBeforeParsing) {
  std::string body = "<ListBucketResult><Name>";
  body.append(kMaxXmlBytes, 'a');
  body += "</Name></ListBucketResult>";
  const auto page = DecodeListObjectsV2(body, kWhat);
  ASSERT_FALSE(page.ok());
  EXPECT_EQ(page.status().code(), StatusCode::kCorruption);
  EXPECT_TRUE(Has(page.status().message(), "more than the cap"));
}

TEST(S3XmlTest, RefusesDeepNesting) {
  std::string body;
  for (int i = 0; i < kMaxXmlDepth + 1; ++i) body += "<a>";
  for (int i = 0; i < kMaxXmlDepth + 1; ++i) body += "</a>";
  const auto page = DecodeListObjectsV2(body, kWhat);
  ASSERT_FALSE(page.ok());
  EXPECT_TRUE(Has(page.status().message(),
                  "refused elements nested deeper than 16"));
  EXPECT_TRUE(Has(page.status().message(), "after 17 elements"));
}

TEST(S3XmlTest, RefusesTooManyElements) {
  std::string body = "<ListBucketResult>";
  for (size_t i = 0; i < kMaxXmlElements; ++i) body += "<x/>";
  body += "</ListBucketResult>";
  const auto page = DecodeListObjectsV2(body, kWhat);
  ASSERT_FALSE(page.ok());
  EXPECT_TRUE(Has(page.status().message(), "refused more than 100000"));
}

TEST(S3XmlTest, RefusedEmptyElementAtTheCapDoesNotUnbalanceTheParser) {
  // The refused element is empty, so expat reports its end after the stop.
  std::string body;
  for (int i = 0; i < kMaxXmlDepth; ++i) body += "<a>";
  body += "<b/>";
  for (int i = 0; i < kMaxXmlDepth; ++i) body += "</a>";
  EXPECT_FALSE(DecodeListObjectsV2(body, kWhat).ok());
}

TEST(S3XmlTest, DecodesErrorDocument) {
  constexpr char kBody[] = R"(<?xml version="1.0" encoding="UTF-8"?>
<Error>
  <Code>NoSuchKey</Code>
  <Message>The resource you requested does not exist</Message>
  <Resource>/bucket/ckpt/_SHARDKEEP</Resource>
  <RequestId>4442587FB7D0A2F9</RequestId>
  <HostId>eftixk72aD6Ap51TnqcoF8eFidJG9Z/2mkiDFu8yU9AS1ed4OpIszj7UDNEHGran</HostId>
</Error>)";
  SK_ASSERT_OK_AND_ASSIGN(ErrorDocument error,
                          DecodeErrorDocument(kBody, "GET s3://bucket/k"));
  EXPECT_EQ(error.code, "NoSuchKey");
  EXPECT_EQ(error.message, "The resource you requested does not exist");
  EXPECT_EQ(error.resource, "/bucket/ckpt/_SHARDKEEP");
  EXPECT_EQ(error.request_id, "4442587FB7D0A2F9");
}

TEST(S3XmlTest, RefusesErrorDocumentWithoutCode) {
  const auto error =
      DecodeErrorDocument("<Error><Message>m</Message></Error>", "GET x");
  ASSERT_FALSE(error.ok());
  EXPECT_TRUE(Has(error.status().message(),
                  "<Error> without a non-empty <Code>"));
}

TEST(S3XmlTest, DecodesInitiateMultipartUpload) {
  constexpr char kBody[] = R"(<?xml version="1.0" encoding="UTF-8"?>
<InitiateMultipartUploadResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Bucket>bucket</Bucket>
  <Key>ckpt/state/d0.bin</Key>
  <UploadId>VXBsb2FkIElEIGZvciA2aWWpbmcncyBteS1tb3ZpZS5tMnRzIHVwbG9hZA</UploadId>
</InitiateMultipartUploadResult>)";
  SK_ASSERT_OK_AND_ASSIGN(std::string upload_id,
                          DecodeInitiateMultipartUpload(kBody, "POST x"));
  EXPECT_EQ(upload_id,
            "VXBsb2FkIElEIGZvciA2aWWpbmcncyBteS1tb3ZpZS5tMnRzIHVwbG9hZA");
  const auto empty = DecodeInitiateMultipartUpload(
      "<InitiateMultipartUploadResult><UploadId></UploadId>"
      "</InitiateMultipartUploadResult>",
      "POST x");
  ASSERT_FALSE(empty.ok());
  EXPECT_TRUE(Has(empty.status().message(), "<UploadId>"));
}

TEST(S3XmlTest, DecodesCompleteMultipartUploadResult) {
  constexpr char kBody[] = R"(<?xml version="1.0" encoding="UTF-8"?>
<CompleteMultipartUploadResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Location>http://bucket.s3.amazonaws.com/ckpt/d0.bin</Location>
  <Bucket>bucket</Bucket>
  <Key>ckpt/d0.bin</Key>
  <ETag>"3858f62230ac3c915f300c664312c11f-9"</ETag>
</CompleteMultipartUploadResult>)";
  SK_ASSERT_OK_AND_ASSIGN(CompleteMultipartUploadAnswer answer,
                          DecodeCompleteMultipartUpload(kBody, "POST x"));
  EXPECT_FALSE(answer.error.has_value());
  EXPECT_EQ(answer.etag, "\"3858f62230ac3c915f300c664312c11f-9\"");
  EXPECT_EQ(answer.bucket, "bucket");
  EXPECT_EQ(answer.key, "ckpt/d0.bin");
  EXPECT_EQ(answer.location, "http://bucket.s3.amazonaws.com/ckpt/d0.bin");
}

TEST(S3XmlTest, CompleteMultipartUploadAnswering200WithErrorBody) {
  // S3 may send 200 first and the failure later, in the body.
  constexpr char kBody[] = R"(<?xml version="1.0" encoding="UTF-8"?>

<Error>
  <Code>InternalError</Code>
  <Message>We encountered an internal error. Please try again.</Message>
  <RequestId>656c76696e6727732072657175657374</RequestId>
  <HostId>Uuag1LuByRx9e6j5Onimru9pO4ZVKnJ2Qz7/C1NPcfTWAtRPfTaOFg==</HostId>
</Error>)";
  SK_ASSERT_OK_AND_ASSIGN(CompleteMultipartUploadAnswer answer,
                          DecodeCompleteMultipartUpload(kBody, "POST x"));
  ASSERT_TRUE(answer.error.has_value());
  EXPECT_EQ(answer.error->code, "InternalError");
  EXPECT_EQ(answer.error->request_id, "656c76696e6727732072657175657374");
  EXPECT_TRUE(answer.etag.empty());
}

TEST(S3XmlTest, RefusesCompleteAnswerWithoutETagOrWithOtherRoot) {
  EXPECT_FALSE(DecodeCompleteMultipartUpload(
                   "<CompleteMultipartUploadResult><Key>k</Key>"
                   "</CompleteMultipartUploadResult>",
                   "POST x")
                   .ok());
  const auto other = DecodeCompleteMultipartUpload("<Foo/>", "POST x");
  ASSERT_FALSE(other.ok());
  EXPECT_TRUE(Has(other.status().message(), "root element <Foo>"));
}

TEST(S3XmlTest, EncodesCompleteMultipartUploadEscapingETags) {
  SK_ASSERT_OK_AND_ASSIGN(
      std::string body,
      EncodeCompleteMultipartUpload(
          {{1, "\"a54357aff0632cce46d942af68356b38\""}, {3, "<&'>"}}));
  EXPECT_EQ(body,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<CompleteMultipartUpload "
            "xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
            "<Part><PartNumber>1</PartNumber><ETag>&quot;"
            "a54357aff0632cce46d942af68356b38&quot;</ETag></Part>"
            "<Part><PartNumber>3</PartNumber><ETag>&lt;&amp;&apos;&gt;"
            "</ETag></Part></CompleteMultipartUpload>");
}

TEST(S3XmlTest, RefusesBadPartsToEncode) {
  const struct {
    std::vector<CompletedPart> parts;
    const char* says;
  } cases[] = {
      {{{0, "e"}}, "part 0: S3 part numbers are 1..10000"},
      {{{10001, "e"}}, "part 10001: S3 part numbers are 1..10000"},
      {{{2, "e"}, {2, "e"}}, "part 2 follows part 2"},
      {{{2, "e"}, {1, "e"}}, "part 1 follows part 2"},
      {{{1, ""}}, "part 1: empty ETag"},
      {{{1, std::string("a\0b", 3)}}, "part 1: ETag holds bytes beyond"},
      {{{1, "a\tb"}}, "part 1: ETag holds bytes beyond"},
      {{{1, "\xe2\x82\xac"}}, "part 1: ETag holds bytes beyond"},
      // Not UTF-8: the body would not be XML at all.
      {{{1, "\"\xff\""}}, "part 1: ETag holds bytes beyond"},
  };
  for (const auto& c : cases) {
    const auto body = EncodeCompleteMultipartUpload(c.parts);
    ASSERT_FALSE(body.ok()) << c.says;
    EXPECT_EQ(body.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(Has(body.status().message(), c.says));
  }
}

// The fuzz target's seeds must be answers the decoders accept, or fuzzing
// would start outside the paths that matter.
TEST(S3XmlTest, SampleAnswersInTestdataDecode) {
  const std::string list = testdata::Read("s3/list_objects_v2.xml");
  ASSERT_FALSE(list.empty());
  SK_ASSERT_OK_AND_ASSIGN(ListObjectsPage page,
                          DecodeListObjectsV2(list, kWhat));
  ASSERT_EQ(page.objects.size(), 2u);
  EXPECT_EQ(page.objects[1].key, "ckpt/a b+c.bin");
  EXPECT_EQ(page.objects[1].size, 1048576u);

  SK_ASSERT_OK_AND_ASSIGN(
      ErrorDocument error,
      DecodeErrorDocument(testdata::Read("s3/error.xml"), "GET x"));
  EXPECT_EQ(error.code, "NoSuchKey");

  SK_ASSERT_OK_AND_ASSIGN(
      std::string upload_id,
      DecodeInitiateMultipartUpload(
          testdata::Read("s3/initiate_multipart_upload.xml"), "POST x"));
  EXPECT_FALSE(upload_id.empty());

  SK_ASSERT_OK_AND_ASSIGN(
      CompleteMultipartUploadAnswer completed,
      DecodeCompleteMultipartUpload(
          testdata::Read("s3/complete_multipart_upload.xml"), "POST x"));
  EXPECT_FALSE(completed.error.has_value());

  SK_ASSERT_OK_AND_ASSIGN(
      CompleteMultipartUploadAnswer failed,
      DecodeCompleteMultipartUpload(
          testdata::Read("s3/complete_multipart_upload_error.xml"), "POST x"));
  ASSERT_TRUE(failed.error.has_value());
  EXPECT_EQ(failed.error->code, "InternalError");
}

TEST(S3XmlTest, EncodesDeleteObjectsWithEscapedKeys) {
  SK_ASSERT_OK_AND_ASSIGN(std::string body,
                          EncodeDeleteObjects({"a/b", "x<&>\"'y"}));
  EXPECT_TRUE(Has(body, "<Quiet>true</Quiet>"));
  EXPECT_TRUE(Has(body, "<Object><Key>a/b</Key></Object>"));
  EXPECT_TRUE(Has(body, "<Key>x&lt;&amp;&gt;&quot;&apos;y</Key>"));
  EXPECT_EQ(EncodeDeleteObjects({}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeDeleteObjects(std::vector<std::string>(1001, "k"))
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  // XML 1.0 cannot carry most control characters; the caller deletes
  // such keys one by one.
  EXPECT_EQ(EncodeDeleteObjects({std::string("a\x01b")}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(S3XmlTest, DecodesDeleteObjectsErrors) {
  SK_ASSERT_OK_AND_ASSIGN(
      std::vector<DeleteError> errors,
      DecodeDeleteObjects(
          "<DeleteResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
          "<Deleted><Key>ok</Key></Deleted><Error><Key>k1</Key>"
          "<Code>AccessDenied</Code><Message>no</Message></Error>"
          "</DeleteResult>",
          "POST x"));
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].key, "k1");
  EXPECT_EQ(errors[0].error.code, "AccessDenied");
  SK_ASSERT_OK_AND_ASSIGN(errors,
                          DecodeDeleteObjects("<DeleteResult/>", "POST x"));
  EXPECT_TRUE(errors.empty());
  EXPECT_EQ(DecodeDeleteObjects("<Error><Key>k</Key></Error>", "POST x")
                .status()
                .code(),
            StatusCode::kCorruption);
}

TEST(S3XmlTest, DecodesListMultipartUploads) {
  SK_ASSERT_OK_AND_ASSIGN(
      MultipartUploadsPage page,
      DecodeListMultipartUploads(
          "<ListMultipartUploadsResult><IsTruncated>true</IsTruncated>"
          "<NextKeyMarker>b</NextKeyMarker><NextUploadIdMarker>u2"
          "</NextUploadIdMarker><Upload><Key>a</Key><UploadId>u1</UploadId>"
          "</Upload><Upload><Key>b</Key><UploadId>u2</UploadId></Upload>"
          "</ListMultipartUploadsResult>",
          "GET x"));
  ASSERT_EQ(page.uploads.size(), 2u);
  EXPECT_EQ(page.uploads[1].key, "b");
  EXPECT_EQ(page.uploads[1].upload_id, "u2");
  EXPECT_TRUE(page.is_truncated);
  EXPECT_EQ(page.next_key_marker, "b");
  const Status endless =
      DecodeListMultipartUploads(
          "<ListMultipartUploadsResult><IsTruncated>true</IsTruncated>"
          "</ListMultipartUploadsResult>",
          "GET x")
          .status();
  EXPECT_EQ(endless.code(), StatusCode::kCorruption);
}

}  // namespace
}  // namespace shardkeep::s3

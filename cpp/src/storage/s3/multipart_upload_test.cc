// The multipart writer against a transport that plays S3's part of the
// exchange, so that concurrency and lost answers are tested exactly. The
// same writer against a real server: s3_storage_test.cc.
#include "storage/s3/multipart_upload.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>

#include "testing/status_matchers.h"
#include "testing/storage_conformance.h"

namespace shardkeep::s3 {
namespace {

using ::shardkeep::testing::Has;

class FakeS3 : public http::HttpTransport {
 public:
  void Perform(const http::HttpRequest& request, http::HttpResponse* response) override {
    *response = http::HttpResponse();
    response->status = 200;
    std::unique_lock<std::mutex> lock(mu_);
    log.push_back(request.method + " " + request.url);
    if (request.method == "POST" && Has(request.url, "?uploads=")) {
      response->body =
          "<InitiateMultipartUploadResult><UploadId>up-1</UploadId>"
          "</InitiateMultipartUploadResult>";
    } else if (request.method == "PUT" && Has(request.url, "partNumber=")) {
      const int now = ++uploading_;
      max_uploading = std::max(max_uploading, now);
      const size_t at = request.url.find("partNumber=") + 11;
      const std::string number =
          request.url.substr(at, request.url.find('&', at) - at);
      parts[std::stoi(number)] = std::string(request.body);
      lock.unlock();
      // Long enough for the other parts in flight to start.
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      lock.lock();
      --uploading_;
      if (fail_part == std::stoi(number)) {
        response->status = 400;
        response->body = "<Error><Code>InvalidPart</Code></Error>";
        return;
      }
      response->etag = "\"etag-" + number + "\"";
    } else if (request.method == "PUT") {
      single_put = std::string(request.body);
    } else if (request.method == "POST" && Has(request.url, "uploadId=")) {
      complete_body = std::string(request.body);
      if (completes++ == 0 && lose_first_complete) {
        response->transport = http::Transport::kConnectionReset;
        return;
      }
      if (lose_first_complete) {  // the lost attempt had completed it
        response->status = 404;
        response->body = "<Error><Code>NoSuchUpload</Code></Error>";
        return;
      }
      response->body =
          "<CompleteMultipartUploadResult><ETag>\"all\"</ETag>"
          "</CompleteMultipartUploadResult>";
    } else if (request.method == "HEAD") {
      response->content_length = head_size;
    } else if (request.method == "DELETE") {
      aborted = true;
      response->status = 204;
    }
  }

  std::vector<std::string> log;
  std::map<int, std::string> parts;
  std::string single_put;
  std::string complete_body;
  int max_uploading = 0;
  int completes = 0;
  int fail_part = 0;
  bool lose_first_complete = false;
  uint64_t head_size = 0;
  bool aborted = false;

 private:
  std::mutex mu_;
  int uploading_ = 0;
};

class MultipartUploadTest : public ::testing::Test {
 protected:
  std::unique_ptr<WritableFile> Open(int parts_in_flight = 3) {
    S3Config config;
    config.credentials = {"AKIDEXAMPLE", "secret", ""};
    config.region = "us-east-1";
    config.endpoint = "http://127.0.0.1:9000";
    config.path_style = true;
    S3ClientOptions options;
    options.timeout_s = 5;
    auto client =
        std::make_shared<S3Client>(config, "bucket", fake_, options);
    MultipartOptions multipart;
    multipart.part_size = kPart;
    multipart.parts_in_flight = parts_in_flight;
    return NewMultipartWriter(client, "dir/file", multipart);
  }

  static constexpr size_t kPart = size_t{5} << 20;
  std::shared_ptr<FakeS3> fake_ = std::make_shared<FakeS3>();
};

TEST_F(MultipartUploadTest, PartsGoUpInParallelWithinTheBound) {
  const std::string data = TestBytes(8 * kPart + 100, 1);
  auto file = Open(/*parts_in_flight=*/3);
  // Small appends (buffered) and one large one (sent from `data`).
  SK_ASSERT_OK(file->Append(data.data(), 1000));
  SK_ASSERT_OK(file->Append(data.data() + 1000, 2 * kPart));
  SK_ASSERT_OK(file->Append(data.data() + 1000 + 2 * kPart,
                            data.size() - 1000 - 2 * kPart));
  SK_ASSERT_OK(file->Close());
  ASSERT_EQ(fake_->parts.size(), 9u);
  std::string joined;
  for (const auto& [number, bytes] : fake_->parts) joined += bytes;
  EXPECT_TRUE(joined == data);
  for (int number = 1; number <= 8; ++number) {
    EXPECT_EQ(fake_->parts[number].size(), kPart) << number;
  }
  EXPECT_EQ(fake_->max_uploading, 3);
  // A completed upload is not aborted by a stray call afterwards.
  EXPECT_FALSE(file->Append("x", 1).ok());
  EXPECT_TRUE(Has(fake_->complete_body,
                  "<Part><PartNumber>9</PartNumber>"
                  "<ETag>&quot;etag-9&quot;</ETag></Part>"));
  EXPECT_FALSE(fake_->aborted);
}

TEST_F(MultipartUploadTest, SmallFileIsOnePut) {
  auto file = Open();
  SK_ASSERT_OK(file->Append("abc", 3));
  SK_ASSERT_OK(file->Append("def", 3));
  SK_ASSERT_OK(file->Sync());
  SK_ASSERT_OK(file->Close());
  EXPECT_EQ(fake_->single_put, "abcdef");
  EXPECT_EQ(fake_->log.size(), 1u);
  EXPECT_FALSE(file->Append("x", 1).ok());
}

TEST_F(MultipartUploadTest, FailedPartAbortsAtOnceAndSticks) {
  fake_->fail_part = 2;
  const std::string data = TestBytes(4 * kPart, 2);
  auto file = Open();
  const Status status = file->Append(data.data(), data.size());
  EXPECT_EQ(status.code(), StatusCode::kStorage) << status.ToString();
  EXPECT_TRUE(Has(status.message(), "UploadPart 2 s3://bucket/dir/file"));
  EXPECT_TRUE(Has(status.message(), "InvalidPart"));
  EXPECT_TRUE(fake_->aborted);
  EXPECT_EQ(file->Close().code(), StatusCode::kStorage);
  EXPECT_TRUE(fake_->complete_body.empty());
}

TEST_F(MultipartUploadTest, LostCompleteAnswerIsCheckedBySize) {
  fake_->lose_first_complete = true;
  const std::string data = TestBytes(2 * kPart + 7, 3);
  fake_->head_size = data.size();
  auto file = Open();
  SK_ASSERT_OK(file->Append(data.data(), data.size()));
  SK_ASSERT_OK(file->Close());
  EXPECT_EQ(fake_->completes, 2);
  EXPECT_FALSE(fake_->aborted);
}

TEST_F(MultipartUploadTest, LostCompleteWithOtherSizeIsUnknown) {
  fake_->lose_first_complete = true;
  fake_->head_size = 0;  // still the empty object: not completed by us
  const std::string data = TestBytes(2 * kPart + 7, 4);
  auto file = Open();
  SK_ASSERT_OK(file->Append(data.data(), data.size()));
  const Status status = file->Close();
  EXPECT_EQ(status.code(), StatusCode::kCommitStateUnknown)
      << status.ToString();
  EXPECT_TRUE(Has(status.message(), "s3://bucket/dir/file"));
}

TEST_F(MultipartUploadTest, DestroyedWithoutCloseAborts) {
  const std::string data = TestBytes(2 * kPart, 5);
  {
    auto file = Open();
    SK_ASSERT_OK(file->Append(data.data(), data.size()));
  }
  EXPECT_TRUE(fake_->aborted);
  EXPECT_TRUE(fake_->complete_body.empty());
}

}  // namespace
}  // namespace shardkeep::s3

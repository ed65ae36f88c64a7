// The S3 backend against a real server: SeaweedFS started by the test
// (testing/seaweed_server.h). The retry schedule itself is tested exactly
// in s3_client_test.cc.
#include "storage/s3/s3_storage.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <random>

#include "storage/read_counter.h"
#include "storage/http/curl_transport.h"
#include "testing/seaweed_server.h"
#include "testing/status_matchers.h"
#include "testing/storage_conformance.h"

namespace shardkeep::s3 {
namespace {

using ::shardkeep::testing::Has;
using ::shardkeep::testing::SeaweedServer;

constexpr const char* kBucket = "shardkeep-test";

// One server for the whole test binary (ctest runs each test in its own
// process, so each gets a fresh one), stopped at exit.
SeaweedServer* Server() {
  static std::unique_ptr<SeaweedServer> server = [] {
    Result<std::unique_ptr<SeaweedServer>> started = SeaweedServer::Start();
    if (!started.ok()) {
      ADD_FAILURE() << started.status().ToString();
      return std::unique_ptr<SeaweedServer>();
    }
    const Status bucket = (*started)->CreateBucket(kBucket);
    if (!bucket.ok()) ADD_FAILURE() << bucket.ToString();
    return std::move(started).value();
  }();
  return server.get();
}

// A fresh prefix per test, so tests never see each other's keys.
std::string FreshRoot(const std::string& what) {
  static std::atomic<int> counter{0};
  static const uint64_t run = std::random_device{}();
  return what + "/" + std::to_string(run) + "-" + std::to_string(++counter);
}

// Passes requests on to a real transport; `fault` may replace the answer
// of any of them (before or after it reaches the server).
class FaultyTransport : public http::HttpTransport {
 public:
  enum class Action { kPass, kDropBefore, kDropAfter, kAnswer503 };
  explicit FaultyTransport(std::shared_ptr<http::HttpTransport> real)
      : real_(std::move(real)) {}

  void Perform(const http::HttpRequest& request, http::HttpResponse* response) override {
    Action action = Action::kPass;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (fault) action = fault(request);
    }
    if (action == Action::kDropBefore) {
      *response = http::HttpResponse();
      response->transport = http::Transport::kConnectionReset;
      response->transport_detail = "injected: dropped before sending";
      return;
    }
    if (action == Action::kAnswer503) {
      *response = http::HttpResponse();
      response->status = 503;
      response->body =
          "<Error><Code>SlowDown</Code><Message>injected</Message></Error>";
      return;
    }
    real_->Perform(request, response);
    if (action == Action::kDropAfter) {
      *response = http::HttpResponse();
      response->transport = http::Transport::kConnectionReset;
      response->transport_detail = "injected: answer lost";
    }
  }

  void SetFault(std::function<Action(const http::HttpRequest&)> f) {
    std::lock_guard<std::mutex> lock(mu_);
    fault = std::move(f);
  }

 private:
  std::shared_ptr<http::HttpTransport> real_;
  std::mutex mu_;
  std::function<Action(const http::HttpRequest&)> fault;
};

std::shared_ptr<http::HttpTransport> SharedCurl() {
  static const std::shared_ptr<http::HttpTransport> transport = http::NewCurlTransport();
  return transport;
}

std::shared_ptr<S3Client> ClientFor(const S3Config& config,
                                    const std::string& bucket,
                                    double timeout_s = 60,
                                    std::shared_ptr<http::HttpTransport> transport =
                                        SharedCurl()) {
  S3ClientOptions options;
  options.timeout_s = timeout_s;
  return std::make_shared<S3Client>(config, bucket, std::move(transport),
                                    options);
}

// Parts at S3's minimum, so a few MiB make several of them.
S3StorageOptions SmallParts() {
  S3StorageOptions options;
  options.multipart.part_size = size_t{5} << 20;
  options.multipart.parts_in_flight = 3;
  return options;
}

StorageLocation MakeConformanceLocation() {
  SeaweedServer* server = Server();
  if (server == nullptr) return StorageLocation{nullptr, ""};
  return StorageLocation{
      NewS3Storage(ClientFor(server->config(), kBucket), SmallParts()),
      FreshRoot("conformance")};
}

SK_INSTANTIATE_STORAGE_CONFORMANCE(
    S3, (StorageTestBackend{"s3", MakeConformanceLocation,
                            /*object_store=*/true}));

class S3StorageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = Server();
    ASSERT_NE(server_, nullptr);
    client_ = ClientFor(server_->config(), kBucket);
    storage_ = NewS3Storage(client_, SmallParts());
    root_ = FreshRoot("s3test");
  }

  // The keys of multipart uploads still open under this test's prefix.
  std::vector<std::string> OpenUploads() {
    Result<std::vector<MultipartUploadsPage::Upload>> uploads =
        client_->ListMultipartUploads(root_ + "/");
    EXPECT_TRUE(uploads.ok()) << uploads.status().ToString();
    if (!uploads.ok()) return {"<listing failed>"};
    std::vector<std::string> keys;
    for (const auto& upload : *uploads) keys.push_back(upload.key);
    return keys;
  }

  SeaweedServer* server_ = nullptr;
  std::shared_ptr<S3Client> client_;
  std::shared_ptr<Storage> storage_;
  std::string root_;
};

TEST_F(S3StorageTest, Features) {
  const StorageFeatures features = storage_->features();
  EXPECT_FALSE(features.atomic_rename);
  EXPECT_TRUE(features.durable_sync);
  EXPECT_FALSE(features.atomic_exchange);
  EXPECT_TRUE(features.conditional_create);
}

TEST_F(S3StorageTest, MultipartWithParallelPartsReadsBackByteExact) {
  // 4 parts of 5 MiB and a tail, from appends small (buffered) and large
  // (sent from this buffer), crossing part boundaries.
  const std::string data = TestBytes((size_t{21} << 20) + 12345, 7);
  const std::vector<size_t> pieces = {100, (size_t{3} << 20) + 7,
                                      size_t{11} << 20, 1, size_t{5} << 20};
  SK_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file,
                          storage_->OpenForAppend(root_ + "/big"));
  size_t written = 0;
  for (const size_t piece : pieces) {
    SK_ASSERT_OK(file->Append(data.data() + written, piece));
    written += piece;
  }
  SK_ASSERT_OK(file->Append(data.data() + written, data.size() - written));
  SK_ASSERT_OK(file->Sync());
  SK_ASSERT_OK(file->Close());
  SK_ASSERT_OK_AND_ASSIGN(uint64_t size, storage_->FileSize(root_ + "/big"));
  EXPECT_EQ(size, data.size());
  SK_ASSERT_OK_AND_ASSIGN(std::string content,
                          storage_->ReadAll(root_ + "/big"));
  EXPECT_TRUE(content == data);
  // A range across a part boundary.
  std::string range(1 << 20, '\0');
  const uint64_t offset = (uint64_t{5} << 20) - 4096;
  SK_ASSERT_OK(storage_->ReadAt(root_ + "/big", offset, range.size(),
                                range.data()));
  EXPECT_TRUE(range == data.substr(offset, range.size()));
  EXPECT_TRUE(OpenUploads().empty());
}

// The process-wide count of bytes read through storage covers GETs: what
// each returned, not what the caller asked for.
TEST_F(S3StorageTest, GetsAddTheirBytesToTheReadCount) {
  SK_ASSERT_OK(storage_->WriteAll(root_ + "/counted", std::string(5000, 'c'), true));
  const uint64_t before = StorageBytesRead();
  std::string range(1234, '\0');
  SK_ASSERT_OK(storage_->ReadAt(root_ + "/counted", 100, range.size(), range.data()));
  EXPECT_EQ(StorageBytesRead() - before, 1234u);
  SK_ASSERT_OK_AND_ASSIGN(std::string whole, storage_->ReadAll(root_ + "/counted"));
  EXPECT_EQ(StorageBytesRead() - before, 1234u + 5000u);
  // Listing and sizes are not data.
  SK_ASSERT_OK(storage_->FileSize(root_ + "/counted").status());
  SK_ASSERT_OK(storage_->List(root_).status());
  EXPECT_EQ(StorageBytesRead() - before, 1234u + 5000u);
}

TEST_F(S3StorageTest, FailedPartAbortsTheUpload) {
  auto faulty = std::make_shared<FaultyTransport>(SharedCurl());
  // Part 3 never gets through; retrying it runs out of time.
  faulty->SetFault([](const http::HttpRequest& request) {
    return request.url.find("partNumber=3") != std::string::npos
               ? FaultyTransport::Action::kDropBefore
               : FaultyTransport::Action::kPass;
  });
  auto storage = NewS3Storage(
      ClientFor(server_->config(), kBucket, /*timeout_s=*/1, faulty),
      SmallParts());
  const std::string data = TestBytes(size_t{26} << 20, 3);
  SK_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file,
                          storage->OpenForAppend(root_ + "/broken"));
  Status status = file->Append(data.data(), data.size());
  if (status.ok()) status = file->Close();
  EXPECT_FALSE(status.ok());
  EXPECT_TRUE(Has(status.message(), "UploadPart 3"));
  EXPECT_TRUE(Has(status.message(), root_ + "/broken"));
  EXPECT_TRUE(OpenUploads().empty());
  // The failure sticks.
  EXPECT_FALSE(file->Close().ok());
}

TEST_F(S3StorageTest, DestroyedWithoutCloseAbortsTheUpload) {
  const std::string data = TestBytes(size_t{12} << 20, 4);
  {
    SK_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file,
                            storage_->OpenForAppend(root_ + "/dropped"));
    SK_ASSERT_OK(file->Append(data.data(), data.size()));
    EXPECT_EQ(OpenUploads().size(), 1u);
  }
  EXPECT_TRUE(OpenUploads().empty());
}

TEST_F(S3StorageTest, DeleteRecursiveAbortsUploadsLeftOpen) {
  // A writer that died mid-file leaves its upload open.
  for (const char* name : {"ckpt/d/0", "ckpt", "ckpt2/x"}) {
    const std::string key = root_ + "/" + name;
    SK_ASSERT_OK_AND_ASSIGN(std::string id, client_->CreateMultipartUpload(key));
    SK_ASSERT_OK(client_->UploadPart(key, id, 1, TestBytes(1000)).status());
  }
  SK_ASSERT_OK(storage_->WriteAll(root_ + "/ckpt/meta", "m", false));
  EXPECT_EQ(OpenUploads().size(), 3u);
  SK_ASSERT_OK(storage_->DeleteRecursive(root_ + "/ckpt"));
  // The sibling whose name only starts the same stays.
  EXPECT_EQ(OpenUploads(), std::vector<std::string>{root_ + "/ckpt2/x"});
  SK_ASSERT_OK(storage_->DeleteRecursive(root_));
  EXPECT_TRUE(OpenUploads().empty());
}

TEST_F(S3StorageTest, ForkedChildDoesNotShareTheParentsConnections) {
  // Both processes talk at once through a storage whose pool held open
  // connections at the fork (multi-process jobs started with fork).
  SK_ASSERT_OK(storage_->WriteAll(root_ + "/warm", "x", false));
  auto run = [&](const std::string& who) {
    int failures = 0;
    for (int i = 0; i < 150; ++i) {
      const std::string path = root_ + "/" + who + std::to_string(i % 5);
      const std::string value = who + std::to_string(i);
      Result<std::string> read = storage_->WriteAll(path, value, false).ok()
                                     ? storage_->ReadAll(path)
                                     : Result<std::string>(StorageError(""));
      if (!read.ok() || *read != value) ++failures;
    }
    return failures;
  };
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(run("child") == 0 ? 0 : 1);
  EXPECT_EQ(run("parent"), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST_F(S3StorageTest, LargeWriteAllGoesUpInParts) {
  const std::string data = TestBytes(size_t{17} << 20, 5);
  SK_ASSERT_OK(storage_->WriteAll(root_ + "/whole", data, true));
  SK_ASSERT_OK_AND_ASSIGN(std::string content,
                          storage_->ReadAll(root_ + "/whole"));
  EXPECT_TRUE(content == data);
  EXPECT_TRUE(OpenUploads().empty());
}

TEST_F(S3StorageTest, WrongSecretNamesTheKeyIdNotTheSecret) {
  S3Config config = server_->config();
  config.credentials.secret_access_key = "not-the-secret-xyz";
  auto storage = NewS3Storage(ClientFor(config, kBucket));
  for (const Status& status :
       {storage->WriteAll(root_ + "/f", "x", false),
        storage->ReadAll(root_ + "/f").status(),
        storage->List(root_).status(), storage->FileSize(root_ + "/f").status(),
        storage->Exists(root_ + "/f").status()}) {
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument)
        << status.ToString();
    EXPECT_TRUE(Has(status.message(), SeaweedServer::kAccessKeyId));
    EXPECT_TRUE(Has(status.message(), "SignatureDoesNotMatch"));
    EXPECT_FALSE(Has(status.message(), "not-the-secret-xyz"));
  }
}

// InvalidArgument, not NotFound: a listing of a missing bucket must not
// read as an empty prefix (a manager would resume from nothing).
TEST_F(S3StorageTest, MissingBucketIsInvalidArgumentNamingIt) {
  auto storage = NewS3Storage(ClientFor(server_->config(), "no-such-bucket"));
  for (const Status& status :
       {storage->ReadAll("ckpt/f").status(), storage->List("ckpt").status(),
        storage->Exists("ckpt").status()}) {
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
    EXPECT_TRUE(Has(status.message(), "s3://no-such-bucket"));
    EXPECT_TRUE(Has(status.message(), "NoSuchBucket"));
  }
  // SeaweedFS refuses the write as AccessDenied, AWS as NoSuchBucket.
  const Status write = storage->WriteAll("ckpt/f", "x", false);
  EXPECT_FALSE(write.ok());
  EXPECT_TRUE(Has(write.message(), "s3://no-such-bucket/ckpt/f"));
}

TEST_F(S3StorageTest, KeysWithCharactersUrlsEscapeRoundTrip) {
  const std::vector<std::string> names = {"a b+c", "q?x=1&y#z", "100%",
                                          "\xc3\xbc\xe2\x82\xac", "t~_-.!*'()"};
  for (const std::string& name : names) {
    SK_ASSERT_OK(storage_->WriteAll(root_ + "/odd/" + name, name, false));
    SK_ASSERT_OK_AND_ASSIGN(std::string content,
                            storage_->ReadAll(root_ + "/odd/" + name));
    EXPECT_EQ(content, name);
    SK_ASSERT_OK_AND_ASSIGN(bool exists,
                            storage_->Exists(root_ + "/odd/" + name));
    EXPECT_TRUE(exists) << name;
  }
  SK_ASSERT_OK_AND_ASSIGN(std::vector<std::string> listed,
                          storage_->List(root_ + "/odd"));
  std::vector<std::string> sorted = names;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(listed, sorted);
  SK_ASSERT_OK(storage_->DeleteRecursive(root_ + "/odd"));
  EXPECT_EQ(storage_->List(root_ + "/odd").status().code(),
            StatusCode::kNotFound);
}

TEST_F(S3StorageTest, KeysEndingInSlashAreRefused) {
  const Status status = storage_->WriteAll(root_ + "/dir/", "x", false);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
  EXPECT_FALSE(storage_->OpenForAppend(root_ + "/").ok());
}

TEST_F(S3StorageTest, ListPagesThroughManyKeys) {
  // More than one page of 1000, under a delimiter.
  std::vector<std::string> want;
  for (int i = 0; i < 1100; ++i) want.push_back("k" + std::to_string(10000 + i));
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < want.size(); i += 8) {
        if (!storage_->WriteAll(root_ + "/many/" + want[i], "", false).ok()) {
          ++failures;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  ASSERT_EQ(failures.load(), 0);
  SK_ASSERT_OK(storage_->WriteAll(root_ + "/many/sub/x", "x", false));
  SK_ASSERT_OK_AND_ASSIGN(std::vector<std::string> names,
                          storage_->List(root_ + "/many"));
  want.push_back("sub");
  EXPECT_EQ(names, want);
  SK_ASSERT_OK(storage_->DeleteRecursive(root_ + "/many"));
  EXPECT_EQ(storage_->List(root_ + "/many").status().code(),
            StatusCode::kNotFound);
}

TEST_F(S3StorageTest, DroppedConnectionsAndSlowDownAreRetried) {
  auto faulty = std::make_shared<FaultyTransport>(SharedCurl());
  std::atomic<int> n{0};
  // Every other request fails: dropped before or after reaching the
  // server, or throttled.
  faulty->SetFault([&n](const http::HttpRequest&) {
    switch (n++ % 6) {
      case 1: return FaultyTransport::Action::kDropBefore;
      case 3: return FaultyTransport::Action::kAnswer503;
      case 5: return FaultyTransport::Action::kDropAfter;
      default: return FaultyTransport::Action::kPass;
    }
  });
  auto storage = NewS3Storage(
      ClientFor(server_->config(), kBucket, /*timeout_s=*/30, faulty),
      SmallParts());
  const std::string data = TestBytes(size_t{12} << 20, 9);
  SK_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file,
                          storage->OpenForAppend(root_ + "/retried"));
  SK_ASSERT_OK(file->Append(data.data(), data.size()));
  SK_ASSERT_OK(file->Close());
  SK_ASSERT_OK(storage->WriteAll(root_ + "/small", "small", false));
  SK_ASSERT_OK_AND_ASSIGN(std::string content,
                          storage->ReadAll(root_ + "/retried"));
  EXPECT_TRUE(content == data);
  SK_ASSERT_OK_AND_ASSIGN(std::vector<std::string> names,
                          storage->List(root_));
  EXPECT_EQ(names, (std::vector<std::string>{"retried", "small"}));
  EXPECT_GE(n.load(), 12);
  EXPECT_TRUE(OpenUploads().empty());
}

TEST_F(S3StorageTest, ConditionalPutWhoseAnswerWasLostSucceeds) {
  auto faulty = std::make_shared<FaultyTransport>(SharedCurl());
  std::atomic<int> n{0};
  // The first PUT reaches the server, but its answer is lost; the retry
  // then meets the object it created itself.
  faulty->SetFault([&n](const http::HttpRequest& request) {
    return request.method == "PUT" && n++ == 0
               ? FaultyTransport::Action::kDropAfter
               : FaultyTransport::Action::kPass;
  });
  auto storage =
      NewS3Storage(ClientFor(server_->config(), kBucket, 30, faulty));
  SK_ASSERT_OK(storage->WriteIfAbsent(root_ + "/_SHARDKEEP", "mine"));
  EXPECT_EQ(n.load(), 2);
  // Another writer's bytes are still refused after a lost answer.
  n = 0;
  const Status other = storage->WriteIfAbsent(root_ + "/_SHARDKEEP", "other");
  EXPECT_EQ(other.code(), StatusCode::kAlreadyExists) << other.ToString();
  SK_ASSERT_OK_AND_ASSIGN(std::string content,
                          storage->ReadAll(root_ + "/_SHARDKEEP"));
  EXPECT_EQ(content, "mine");
}

TEST_F(S3StorageTest, CompletedUploadWhoseAnswerWasLostSucceeds) {
  auto faulty = std::make_shared<FaultyTransport>(SharedCurl());
  std::atomic<int> completes{0};
  // CompleteMultipartUpload reaches the server, but its answer is lost.
  faulty->SetFault([&completes](const http::HttpRequest& request) {
    const bool complete = request.method == "POST" &&
                          request.url.find("uploadId=") != std::string::npos;
    return complete && completes++ == 0 ? FaultyTransport::Action::kDropAfter
                                        : FaultyTransport::Action::kPass;
  });
  auto storage = NewS3Storage(
      ClientFor(server_->config(), kBucket, /*timeout_s=*/30, faulty),
      SmallParts());
  const std::string data = TestBytes(size_t{11} << 20, 11);
  SK_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file,
                          storage->OpenForAppend(root_ + "/lost"));
  SK_ASSERT_OK(file->Append(data.data(), data.size()));
  SK_ASSERT_OK(file->Close());
  EXPECT_EQ(completes.load(), 2);
  SK_ASSERT_OK_AND_ASSIGN(std::string content,
                          storage->ReadAll(root_ + "/lost"));
  EXPECT_TRUE(content == data);
  EXPECT_TRUE(OpenUploads().empty());
}

TEST_F(S3StorageTest, ServerStoppedFailsWithinTimeoutThenRecovers) {
  auto storage = NewS3Storage(
      ClientFor(server_->config(), kBucket, /*timeout_s=*/5), SmallParts());
  SK_ASSERT_OK(storage->WriteAll(root_ + "/before", "1", false));
  SK_ASSERT_OK(server_->Stop());

  const auto start = std::chrono::steady_clock::now();
  const Status status = storage->WriteAll(root_ + "/during", "2", false);
  const double elapsed = std::chrono::duration<double>(
                             std::chrono::steady_clock::now() - start)
                             .count();
  EXPECT_FALSE(status.ok());
  EXPECT_LT(elapsed, 5.5);
  EXPECT_TRUE(Has(status.message(), "could not connect")) << status.ToString();
  EXPECT_TRUE(Has(status.message(), root_ + "/during"));
  EXPECT_TRUE(Has(status.message(), "timeout_s is 5.0"));

  SK_ASSERT_OK(server_->Restart());
  SK_ASSERT_OK(storage->WriteAll(root_ + "/after", "3", false));
  SK_ASSERT_OK_AND_ASSIGN(std::string content,
                          storage->ReadAll(root_ + "/before"));
  EXPECT_EQ(content, "1");
}

}  // namespace
}  // namespace shardkeep::s3

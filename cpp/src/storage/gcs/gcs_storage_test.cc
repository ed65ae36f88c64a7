// The GCS backend against an emulator: fake-gcs-server started by the test
// (testing/gcs_emulator.h), the storage conformance suite and what is
// GCS's own: create-only commits, parts joined by compose, rewrite, CRC32C
// checks and retries.
#include "storage/gcs/gcs_storage.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "storage/gcs/gcs_credentials.h"
#include "storage/http/curl_transport.h"
#include "testing/gcs_emulator.h"
#include "testing/status_matchers.h"
#include "testing/storage_conformance.h"

namespace shardkeep::gcs {
namespace {

using ::shardkeep::testing::GcsEmulator;
using ::shardkeep::testing::Has;

constexpr const char* kBucket = "shardkeep-test";

// One emulator for the whole test binary (these suites run as one ctest
// test), stopped at exit.
GcsEmulator* Emulator() {
  static std::unique_ptr<GcsEmulator> emulator = [] {
    Result<std::unique_ptr<GcsEmulator>> started = GcsEmulator::Start();
    if (!started.ok()) {
      ADD_FAILURE() << started.status().ToString();
      return std::unique_ptr<GcsEmulator>();
    }
    const Status bucket = (*started)->CreateBucket(kBucket);
    if (!bucket.ok()) ADD_FAILURE() << bucket.ToString();
    return std::move(started).value();
  }();
  return emulator.get();
}

std::string FreshRoot(const std::string& what) {
  static std::atomic<int> counter{0};
  static const uint64_t run = std::random_device{}();
  return what + "/" + std::to_string(run) + "-" + std::to_string(++counter);
}

std::shared_ptr<Credentials> Anonymous() {
  CredentialsOptions options;
  options.anonymous = true;
  return FindCredentials(options, ProcessCredentialsEnvironment(), http::NewCurlTransport())
      .value();
}

// Passes requests on to the real transport; `change` may alter an answer.
class AlteringTransport : public http::HttpTransport {
 public:
  using Change = std::function<void(const http::HttpRequest&, http::HttpResponse*)>;
  explicit AlteringTransport(Change change)
      : real_(http::NewCurlTransport()), change_(std::move(change)) {}
  void Perform(const http::HttpRequest& request, http::HttpResponse* response) override {
    real_->Perform(request, response);
    change_(request, response);
  }

 private:
  std::shared_ptr<http::HttpTransport> real_;
  Change change_;
};

std::shared_ptr<GcsClient> ClientFor(
    std::shared_ptr<http::HttpTransport> transport = http::NewCurlTransport(),
    double timeout_s = 30) {
  GcsClientOptions options;
  options.timeout_s = timeout_s;
  options.backoff = {0.001, 0.01};
  return std::make_shared<GcsClient>(Emulator()->endpoint(), kBucket, Anonymous(),
                                     std::move(transport), options);
}

// Small parts, so that a few MiB make many of them.
GcsStorageOptions SmallParts() {
  GcsStorageOptions options;
  options.parts.part_size = size_t{256} << 10;
  options.parts.parts_in_flight = 3;
  return options;
}

StorageLocation MakeConformanceLocation() {
  if (Emulator() == nullptr) return StorageLocation{nullptr, ""};
  return StorageLocation{NewGcsStorage(ClientFor(), SmallParts()), FreshRoot("conformance")};
}

SK_INSTANTIATE_STORAGE_CONFORMANCE(
    Gcs, (StorageTestBackend{"gcs", MakeConformanceLocation, /*object_store=*/true}));

std::string Pattern(size_t size, uint32_t seed) {
  std::string data(size, '\0');
  std::mt19937 random(seed);
  for (char& c : data) c = static_cast<char>(random());
  return data;
}

class GcsStorageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(Emulator(), nullptr);
    client_ = ClientFor();
    storage_ = NewGcsStorage(client_, SmallParts());
    root_ = FreshRoot("gcs");
  }
  std::shared_ptr<GcsClient> client_;
  std::shared_ptr<Storage> storage_;
  std::string root_;
};

TEST_F(GcsStorageTest, RacingCreatesHaveExactlyOneWinner) {
  const std::string path = root_ + "/_COMMIT";
  constexpr int kWriters = 8;
  std::vector<Status> results(kWriters);
  std::vector<std::thread> threads;
  for (int i = 0; i < kWriters; ++i) {
    threads.emplace_back([&, i] {
      results[i] = storage_->WriteIfAbsent(path, "writer " + std::to_string(i));
    });
  }
  for (std::thread& thread : threads) thread.join();
  int winner = -1;
  for (int i = 0; i < kWriters; ++i) {
    if (results[i].ok()) {
      EXPECT_EQ(winner, -1) << "two writers won";
      winner = i;
    } else {
      EXPECT_EQ(results[i].code(), StatusCode::kAlreadyExists) << results[i].ToString();
    }
  }
  ASSERT_NE(winner, -1);
  EXPECT_EQ(storage_->ReadAll(path).value(), "writer " + std::to_string(winner));
}

TEST_F(GcsStorageTest, ManyPartsAreComposedInOrderAndThenDeleted) {
  // 40 parts: one compose of 32, then one appending 8 more.
  const std::string data = Pattern(40 * (size_t{256} << 10) + 1234, 7);
  auto file = storage_->OpenForAppend(root_ + "/data.bin").value();
  for (size_t at = 0; at < data.size(); at += 100000) {
    ASSERT_TRUE(file->Append(data.data() + at, std::min<size_t>(100000, data.size() - at)).ok());
  }
  ASSERT_TRUE(file->Close().ok());
  EXPECT_EQ(storage_->ReadAll(root_ + "/data.bin").value(), data);
  EXPECT_EQ(storage_->List(root_).value(), std::vector<std::string>{"data.bin"});
}

TEST_F(GcsStorageTest, OpenForAppendIsCreateOnly) {
  ASSERT_TRUE(storage_->WriteAll(root_ + "/taken", "bytes", true).ok());
  EXPECT_EQ(storage_->OpenForAppend(root_ + "/taken").status().code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(storage_->ReadAll(root_ + "/taken").value(), "bytes");
}

TEST_F(GcsStorageTest, LinkCopiesOnTheServer) {
  const std::string data = Pattern(3 << 20, 3);
  ASSERT_TRUE(storage_->WriteAll(root_ + "/a", data, true).ok());
  EXPECT_TRUE(storage_->Link(root_ + "/a", root_ + "/b").value());
  EXPECT_EQ(storage_->ReadAll(root_ + "/b").value(), data);
  EXPECT_EQ(storage_->Link(root_ + "/a", root_ + "/b").status().code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(storage_->Link(root_ + "/none", root_ + "/c").status().code(),
            StatusCode::kNotFound);
}

TEST_F(GcsStorageTest, DownloadDamagedOnTheWayIsCorruption) {
  ASSERT_TRUE(storage_->WriteAll(root_ + "/obj", "the stored bytes", true).ok());
  auto flip = std::make_shared<AlteringTransport>(
      [](const http::HttpRequest& request, http::HttpResponse* response) {
        if (request.method == "GET" && response->status == 200 && !response->body.empty() &&
            request.url.find("alt=media") != std::string::npos) {
          response->body[0] ^= 1;
        }
      });
  auto damaged = NewGcsStorage(ClientFor(flip), SmallParts());
  const Status status = damaged->ReadAll(root_ + "/obj").status();
  EXPECT_EQ(status.code(), StatusCode::kCorruption) << status.ToString();
  EXPECT_TRUE(Has(status.message(), "CRC32C"));
  EXPECT_TRUE(Has(status.message(), "gs://shardkeep-test/" + root_ + "/obj"));
}

TEST_F(GcsStorageTest, TransientFailuresAreRetriedAndPermanentOnesAreNot) {
  std::atomic<int> answered{0};
  auto flaky = std::make_shared<AlteringTransport>(
      [&](const http::HttpRequest&, http::HttpResponse* response) {
        // Every other answer becomes a 503 or a reset connection.
        const int n = answered++;
        if (n % 2 == 0) {
          response->status = 503;
          response->body = "{\"error\":{\"code\":503,\"message\":\"Backend Error\"}}";
        } else if (n % 4 == 1) {
          response->transport = http::Transport::kConnectionReset;
        }
      });
  auto storage = NewGcsStorage(ClientFor(flaky), SmallParts());
  const std::string data = Pattern(size_t{1} << 20, 9);
  ASSERT_TRUE(storage->WriteAll(root_ + "/flaky", data, true).ok());
  EXPECT_EQ(storage->ReadAll(root_ + "/flaky").value(), data);
  // A 403 is not retried and names the principal.
  std::atomic<int> calls{0};
  auto forbidden = std::make_shared<AlteringTransport>(
      [&](const http::HttpRequest&, http::HttpResponse* response) {
        ++calls;
        response->status = 403;
        response->body =
            "{\"error\":{\"code\":403,\"message\":\"no access\",\"errors\":[{\"reason\":"
            "\"forbidden\"}]}}";
      });
  const Status status =
      NewGcsStorage(ClientFor(forbidden), SmallParts())->ReadAll(root_ + "/flaky").status();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
  EXPECT_TRUE(Has(status.message(), "anonymous lacks permission for objects.get"));
}

TEST_F(GcsStorageTest, RetriesStopAtTheTimeout) {
  auto down = std::make_shared<AlteringTransport>(
      [](const http::HttpRequest&, http::HttpResponse* response) {
        response->transport = http::Transport::kConnectFailed;
      });
  const auto start = std::chrono::steady_clock::now();
  const Status status = NewGcsStorage(ClientFor(down, /*timeout_s=*/0.5), SmallParts())
                            ->FileSize(root_ + "/x")
                            .status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(status.code(), StatusCode::kStorage);
  EXPECT_TRUE(Has(status.message(), "gave up after"));
}

}  // namespace
}  // namespace shardkeep::gcs

// ShardFeed alone, and saves whose shards arrive through one while the
// writers run (CheckpointablePayload::feed).
#include "shardkeep/shard_feed.h"

#include <gtest/gtest.h>

#include <chrono>
#include <numeric>
#include <thread>

#include "storage/fault_injection.h"
#include "testing/payloads.h"
#include "testing/status_matchers.h"

namespace shardkeep {
namespace {

constexpr uint64_t kRows = 16, kCols = 8;

const auto kNever = [] { return false; };

ShardData Row(const std::vector<float>& values, uint64_t row) {
  return {0, DType::kFloat32, Box{{row, 0}, {1, kCols}},
          reinterpret_cast<const uint8_t*>(values.data() + row * kCols)};
}

TEST(ShardFeedTest, TakesWhatWasAddedThenEndsEmptyOnceClosed) {
  std::vector<float> values(kRows * kCols);
  ShardFeed feed;
  SK_ASSERT_OK(feed.Add({Row(values, 0), Row(values, 1)}));
  SK_ASSERT_OK(feed.Add({Row(values, 2)}));
  EXPECT_EQ(feed.bytes_added(), 3 * kCols * sizeof(float));
  SK_ASSERT_OK_AND_ASSIGN(std::vector<ShardData> taken, feed.Take(1.0, kNever));
  ASSERT_EQ(taken.size(), 3u);
  EXPECT_EQ(taken[2].box.origin[0], 2u);
  feed.Close();
  SK_ASSERT_OK_AND_ASSIGN(taken, feed.Take(1.0, kNever));
  EXPECT_TRUE(taken.empty());
  EXPECT_EQ(feed.Add({Row(values, 3)}).code(), StatusCode::kInvalidArgument);
}

TEST(ShardFeedTest, TakeWaitsForTheProducer) {
  std::vector<float> values(kRows * kCols);
  ShardFeed feed;
  std::thread producer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_TRUE(feed.Add({Row(values, 5)}).ok());
  });
  SK_ASSERT_OK_AND_ASSIGN(std::vector<ShardData> taken, feed.Take(10.0, kNever));
  producer.join();
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0].box.origin[0], 5u);
}

TEST(ShardFeedTest, TheProducersFailureTimeoutAndStopEndTheWait) {
  ShardFeed failed;
  failed.Fail(InvalidArgumentError("leaf 'w' could not be staged"));
  Result<std::vector<ShardData>> taken = failed.Take(10.0, kNever);
  EXPECT_EQ(taken.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(taken.status().message().find("leaf 'w'"), std::string::npos);

  ShardFeed silent;
  taken = silent.Take(0.1, kNever);
  EXPECT_EQ(taken.status().code(), StatusCode::kTimeout);
  EXPECT_NE(taken.status().message().find("no shards to save arrived"), std::string::npos);

  const auto started = std::chrono::steady_clock::now();
  taken = silent.Take(30.0, [] { return true; });
  EXPECT_EQ(taken.status().code(), StatusCode::kCancelled);
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));
}

TEST(ShardFeedTest, AnAddAfterTheSaveFailedReturnsItsError) {
  std::vector<float> values(kRows * kCols);
  ShardFeed feed;
  feed.End(AlreadyExistsError("a checkpoint exists at ckpt"));
  EXPECT_EQ(feed.Add({Row(values, 0)}).code(), StatusCode::kAlreadyExists);
}

class FedSaveTest : public ::testing::Test {
 protected:
  FedSaveTest() : values_(kRows * kCols) {
    std::iota(values_.begin(), values_.end(), 0.25f);
  }

  // A save of one 16x8 float32 leaf whose shards come through feed_.
  SaveRequest Request() {
    SaveRequest request;
    request.path = "root/ckpt";
    CheckpointablePayload part =
        testdata::PytreePayload("state", {{"w", "float32", {kRows, kCols}}});
    part.feed = feed_;
    request.parts.push_back(std::move(part));
    return request;
  }

  Options SmallChunks() const {
    Options options;
    options.chunk_bytes = 64;  // two chunks per row
    options.io_threads = 3;
    options.timeout_s = 10;
    return options;
  }

  std::vector<float> values_;
  std::shared_ptr<ShardFeed> feed_ = std::make_shared<ShardFeed>();
  std::shared_ptr<Storage> storage_ = NewMemoryStorage();
};

TEST_F(FedSaveTest, WritersStartBeforeTheLastShardArrivesAndTheSaveLoadsBack) {
  auto counted = std::make_shared<FaultInjectionStorage>(storage_);
  SK_ASSERT_OK_AND_ASSIGN(auto handle,
                          StartSave(counted, nullptr, Request(), SmallChunks()));
  SK_ASSERT_OK(feed_->Add({Row(values_, 0), Row(values_, 1)}));
  // The first rows are written while the rest is still to come.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (counted->Count("Append") == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_GT(counted->Count("Append"), 0);
  EXPECT_FALSE(handle->future().Wait(0.05).has_value());  // not done: the feed is open
  for (uint64_t row = 2; row < kRows; row += 2) {
    SK_ASSERT_OK(feed_->Add({Row(values_, row), Row(values_, row + 1)}));
  }
  feed_->Close();
  SK_ASSERT_OK(*handle->future().Wait(-1));

  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage_, "root/ckpt"));
  std::vector<float> out(kRows * kCols, -1.f);
  SK_ASSERT_OK(reader->Read("state",
                            {{0, DType::kFloat32, Box{{0, 0}, {kRows, kCols}},
                              reinterpret_cast<uint8_t*>(out.data())}},
                            SmallChunks()));
  EXPECT_EQ(out, values_);
}

TEST_F(FedSaveTest, AFailedProducerCommitsNothing) {
  SK_ASSERT_OK_AND_ASSIGN(auto handle,
                          StartSave(storage_, nullptr, Request(), SmallChunks()));
  SK_ASSERT_OK(feed_->Add({Row(values_, 0)}));
  feed_->Fail(InvalidArgumentError("staging leaf 'w' failed"));
  const Status outcome = *handle->future().Wait(-1);
  EXPECT_EQ(outcome.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(outcome.message().find("staging leaf 'w' failed"), std::string::npos);
  EXPECT_FALSE(*storage_->Exists("root/ckpt/_SHARDKEEP"));
  EXPECT_FALSE(*storage_->Exists("root/ckpt.shardkeep-tmp"));
  // The producer learns that the save is over.
  EXPECT_EQ(feed_->Add({Row(values_, 1)}).code(), StatusCode::kInvalidArgument);
}

TEST_F(FedSaveTest, AShardOutsideItsLeafFailsTheSaveNamingTheLeaf) {
  SK_ASSERT_OK_AND_ASSIGN(auto handle,
                          StartSave(storage_, nullptr, Request(), SmallChunks()));
  ShardData outside = Row(values_, 0);
  outside.box = Box{{kRows, 0}, {1, kCols}};
  SK_ASSERT_OK(feed_->Add({outside}));
  feed_->Close();
  const Status outcome = *handle->future().Wait(-1);
  EXPECT_EQ(outcome.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(outcome.message().find("leaf 'w'"), std::string::npos) << outcome.ToString();
  EXPECT_FALSE(*storage_->Exists("root/ckpt/_SHARDKEEP"));
}

TEST_F(FedSaveTest, AFeedNobodyClosesTimesOut) {
  Options options = SmallChunks();
  options.timeout_s = 0.2;
  SK_ASSERT_OK_AND_ASSIGN(auto handle, StartSave(storage_, nullptr, Request(), options));
  SK_ASSERT_OK(feed_->Add({Row(values_, 0)}));
  const Status outcome = *handle->future().Wait(30);
  EXPECT_EQ(outcome.code(), StatusCode::kTimeout) << outcome.ToString();
  EXPECT_FALSE(*storage_->Exists("root/ckpt/_SHARDKEEP"));
}

TEST_F(FedSaveTest, AWriteFailureEndsTheSaveWhileTheFeedIsOpen) {
  auto failing = std::make_shared<FaultInjectionStorage>(storage_);
  failing->FailOn([](std::string_view op, const std::string&) -> Status {
    if (op != "Append") return Status::Ok();
    // Late enough that the other writers are waiting on the feed by now.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    return StorageError("disk went away");
  });
  Options options = SmallChunks();
  options.timeout_s = 600;  // the feed's wait must not be what ends it
  SK_ASSERT_OK_AND_ASSIGN(auto handle, StartSave(failing, nullptr, Request(), options));
  SK_ASSERT_OK(feed_->Add({Row(values_, 0)}));
  // The writer that failed stops the one waiting on the (open) feed.
  const std::optional<Status> outcome = handle->future().Wait(20);
  ASSERT_TRUE(outcome.has_value()) << "the save waited on its feed after a write failed";
  EXPECT_NE(outcome->message().find("disk went away"), std::string::npos)
      << outcome->ToString();
  EXPECT_FALSE(feed_->Add({Row(values_, 1)}).ok());
}

TEST_F(FedSaveTest, AFailedBlockingPhaseReachesTheProducer) {
  SK_ASSERT_OK(storage_->WriteAll("root/ckpt/_SHARDKEEP", "{}", true));
  Result<std::unique_ptr<SaveHandle>> started =
      StartSave(storage_, nullptr, Request(), SmallChunks());
  ASSERT_EQ(started.status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(feed_->Add({Row(values_, 0)}).code(), StatusCode::kAlreadyExists);
}

TEST_F(FedSaveTest, AFeedBesideShardsIsRefused) {
  SaveRequest request = Request();
  request.parts[0].shards.push_back(Row(values_, 0));
  EXPECT_EQ(StartSave(storage_, nullptr, std::move(request), SmallChunks()).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardkeep

// The process-wide count of bytes read through storage: each read of the
// file backend adds what it returned (s3_storage_test.cc checks GETs).
#include "storage/read_counter.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "shardkeep/checkpoint.h"
#include "shardkeep/storage.h"
#include "testing/payloads.h"
#include "testing/status_matchers.h"

namespace shardkeep {
namespace {

class ReadCounterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() /
            ("shardkeep_read_counter_test_" + std::to_string(getpid()));
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  std::filesystem::path root_;
  std::shared_ptr<Storage> storage_ = NewFileStorage();
};

TEST_F(ReadCounterTest, EachFileReadAddsTheBytesItReturned) {
  const std::string file = (root_ / "f").string();
  SK_ASSERT_OK(storage_->WriteAll(file, std::string(10000, 'x'), false));
  const uint64_t before = StorageBytesRead();
  std::string buffer(4096, '\0');
  SK_ASSERT_OK(storage_->ReadAt(file, 1000, 4096, buffer.data()));
  EXPECT_EQ(StorageBytesRead() - before, 4096u);
  SK_ASSERT_OK_AND_ASSIGN(std::string whole, storage_->ReadAll(file));
  EXPECT_EQ(StorageBytesRead() - before, 4096u + 10000u);
  // A read past the end fails, having read the 500 bytes there were.
  EXPECT_EQ(storage_->ReadAt(file, 9500, 4096, buffer.data()).code(),
            StatusCode::kCorruption);
  EXPECT_EQ(StorageBytesRead() - before, 4096u + 10000u + 500u);
  // Writes, sizes and listings read nothing.
  SK_ASSERT_OK(storage_->WriteAll(file, std::string(3, 'y'), false));
  SK_ASSERT_OK(storage_->FileSize(file).status());
  SK_ASSERT_OK(storage_->List(root_.string()).status());
  EXPECT_EQ(StorageBytesRead() - before, 4096u + 10000u + 500u);
}

// A load reads its chunks, the commit record, meta.json and the index
// through the backend: the count grows by exactly those files' bytes.
TEST_F(ReadCounterTest, ALoadCountsEveryFileItReads) {
  std::vector<float> w(64 * 32, 1.25f);
  const std::string path = (root_ / "ckpt").string();
  SaveRequest request;
  request.path = path;
  CheckpointablePayload part = testdata::PytreePayload("state", {{"w", "float32", {64, 32}}});
  part.shards.push_back(
      {0, DType::kFloat32, Box{{0, 0}, {64, 32}}, reinterpret_cast<const uint8_t*>(w.data())});
  request.parts.push_back(std::move(part));
  SK_ASSERT_OK(Save(storage_, NewSingleProcessCoordinator(), std::move(request), Options()));

  uint64_t metadata_bytes = 0;
  for (const char* file : {"_SHARDKEEP", "state/meta.json", "state/index/p0.idx"}) {
    metadata_bytes += std::filesystem::file_size(root_ / "ckpt" / file);
  }
  const uint64_t before = StorageBytesRead();
  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage_, path));
  std::vector<float> out(w.size());
  SK_ASSERT_OK(reader->ReadLeaf("state", "w", DType::kFloat32, out.data(), Options()));
  EXPECT_EQ(out, w);
  EXPECT_EQ(StorageBytesRead() - before, metadata_bytes + w.size() * sizeof(float));
}

// The in-memory test backend is no storage to count.
TEST(ReadCounter, MemoryStorageIsNotCounted) {
  auto storage = NewMemoryStorage();
  SK_ASSERT_OK(storage->WriteAll("a", std::string(100, 'a'), false));
  const uint64_t before = StorageBytesRead();
  SK_ASSERT_OK(storage->ReadAll("a").status());
  EXPECT_EQ(StorageBytesRead(), before);
}

}  // namespace
}  // namespace shardkeep

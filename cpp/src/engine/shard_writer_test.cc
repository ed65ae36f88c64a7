#include "engine/shard_writer.h"

#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <numeric>
#include <stdexcept>

#include "engine/byte_limiter.h"
#include "shardkeep/cancellation.h"
#include "storage/fault_injection.h"
#include "testing/payloads.h"
#include "testing/status_matchers.h"

namespace shardkeep::internal {
namespace {

constexpr uint64_t kRows = 64, kCols = 1024;

// A 64x1024 float32 shard cut into 64x64 chunks: none is contiguous in the
// shard, so every chunk is gathered, and the values compress well.
struct Shard {
  std::vector<float> values;
  Shard() : values(kRows * kCols) {
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 97);
  }
  std::vector<ShardData> Data() const {
    return {{0, DType::kFloat32, Box{{0, 0}, {kRows, kCols}},
             reinterpret_cast<const uint8_t*>(values.data())}};
  }
};

Options CompressedSmallChunks(uint64_t limit) {
  Options options;
  options.compress = true;
  options.chunk_bytes = 64 * 64 * sizeof(float);
  options.io_threads = 4;
  options.host_memory_limit = limit;
  return options;
}

std::shared_ptr<Storage> StorageWithFolders() {
  std::shared_ptr<Storage> storage = NewMemoryStorage();
  EXPECT_TRUE(storage->CreateDir("ckpt/state/data").ok());
  EXPECT_TRUE(storage->CreateDir("ckpt/state/index").ok());
  return storage;
}

TEST(ShardWriterTest, CompressionBuffersStayUnderHostMemoryLimit) {
  const uint64_t limit = 400 << 10;  // one writer's scratch memory, not two
  Shard shard;
  std::shared_ptr<Storage> storage = StorageWithFolders();
  ByteLimiter limiter(limit);
  SyncBatch unsynced;
  SK_ASSERT_OK(WriteShards(*storage, "ckpt/state", 0, shard.Data(),
                           CompressedSmallChunks(limit), limiter, unsynced)
                   .status());
  SK_ASSERT_OK(unsynced.SyncAll(*storage));
  // Each writer holds a gather buffer, zstd's output and its working
  // memory: at least a chunk and its compression bound...
  EXPECT_GT(limiter.peak(), 2 * 64 * 64 * sizeof(float));
  // ...and four threads together would need more than the limit, yet the
  // writers never held more than it, and everything was given back.
  EXPECT_LE(limiter.peak(), limit);
  EXPECT_EQ(limiter.used(), 0u);
}

TEST(ShardWriterTest, ASaveUnderASmallLimitCompletesAndLoadsBack) {
  Shard shard;
  const Options options = CompressedSmallChunks(400 << 10);
  auto storage = NewMemoryStorage();
  SaveRequest request;
  request.path = "ckpt";
  request.parts.push_back(
      testdata::PytreePayload("state", {{"w", "float32", {kRows, kCols}}}));
  request.parts[0].shards = shard.Data();
  SK_ASSERT_OK(Save(storage, NewSingleProcessCoordinator(), request, options));
  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage, "ckpt"));
  std::vector<float> loaded(kRows * kCols);
  SK_ASSERT_OK(reader->Read("state",
                            {{0, DType::kFloat32, Box{{0, 0}, {kRows, kCols}},
                              reinterpret_cast<uint8_t*>(loaded.data())}},
                            options));
  EXPECT_EQ(loaded, shard.values);
}

// A shard given as a source is produced one chunk at a time, on the
// writer threads: the save holds a chunk per thread, never the shard.
TEST(ShardWriterTest, SourcesAreFilledOneChunkAtATime) {
  Shard shard;
  std::mutex mu;
  uint64_t filled_elements = 0;
  uint64_t largest_fill = 0;
  ShardData source{0, DType::kFloat32, Box{{0, 0}, {kRows, kCols}}, nullptr};
  source.fill = [&](const Box& chunk, uint8_t* dst) -> Status {
    float* out = reinterpret_cast<float*>(dst);
    for (uint64_t r = 0; r < chunk.shape[0]; ++r) {
      for (uint64_t c = 0; c < chunk.shape[1]; ++c) {
        *out++ = shard.values[(chunk.origin[0] + r) * kCols + chunk.origin[1] + c];
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    filled_elements += chunk.NumElements();
    largest_fill = std::max(largest_fill, chunk.NumElements() * sizeof(float));
    return Status::Ok();
  };
  Options options;
  options.chunk_bytes = 64 * 64 * sizeof(float);
  options.io_threads = 3;
  auto storage = NewMemoryStorage();
  SaveRequest request;
  request.path = "ckpt";
  request.parts.push_back(testdata::PytreePayload("state", {{"w", "float32", {kRows, kCols}}}));
  request.parts[0].shards = {source};
  SK_ASSERT_OK(Save(storage, nullptr, request, options));
  EXPECT_EQ(filled_elements, kRows * kCols);  // every element once
  EXPECT_LE(largest_fill, options.chunk_bytes);
  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage, "ckpt"));
  std::vector<float> loaded(kRows * kCols);
  SK_ASSERT_OK(reader->ReadLeaf("state", "w", DType::kFloat32, loaded.data(), options));
  EXPECT_EQ(loaded, shard.values);

  // A source's error fails the save, and nothing is committed.
  request.path = "failed";
  request.parts[0].shards[0].fill = [](const Box&, uint8_t*) -> Status {
    return StorageError("the source file vanished");
  };
  Status failed = Save(storage, nullptr, request, options);
  EXPECT_NE(failed.message().find("the source file vanished"), std::string::npos)
      << failed.ToString();
  EXPECT_EQ(CheckpointReader::Open(storage, "failed").status().code(), StatusCode::kNotFound);
}

TEST(ShardWriterTest, ExceptionFromStorageBecomesAnErrorNamingTheWriter) {
  Shard shard;
  auto faulty = std::make_shared<FaultInjectionStorage>(StorageWithFolders());
  faulty->FailOn([](std::string_view op, const std::string&) -> Status {
    if (op == "Append") throw std::bad_alloc();
    return Status::Ok();
  });
  Result<std::string> written =
      WriteShards(*faulty, "ckpt/state", 0, shard.Data(), CompressedSmallChunks(0));
  EXPECT_EQ(written.status().code(), StatusCode::kResourceExhausted)
      << written.status().ToString();
  EXPECT_NE(written.status().message().find("writer thread of ckpt/state"),
            std::string::npos)
      << written.status().message();
}

// Every file written, the index and the data files (rolled ones included),
// is synced exactly once, after its last append, before WriteShards
// returns: the durability the commit relies on.
TEST(ShardWriterTest, EveryFileIsSyncedOnceAfterItsLastAppend) {
  Shard shard;
  auto recorded = std::make_shared<FaultInjectionStorage>(StorageWithFolders());
  std::mutex mu;
  std::vector<std::pair<std::string, std::string>> calls;  // (op, path)
  recorded->FailOn([&](std::string_view op, const std::string& path) -> Status {
    std::lock_guard<std::mutex> lock(mu);
    calls.emplace_back(std::string(op), path);
    return Status::Ok();
  });
  Options options = CompressedSmallChunks(0);
  options.compress = false;
  options.data_file_bytes = 5 * options.chunk_bytes;  // 16 chunks: files roll
  SK_ASSERT_OK_AND_ASSIGN(
      std::string index, WriteShards(*recorded, "ckpt/state", 0, shard.Data(), options));
  std::map<std::string, int> syncs;
  std::map<std::string, size_t> last_append, sync_at;
  for (size_t i = 0; i < calls.size(); ++i) {
    const auto& [op, path] = calls[i];
    if (op == "Append") last_append[path] = i;
    if (op == "Sync") {
      ++syncs[path];
      sync_at[path] = i;
    }
  }
  EXPECT_GE(last_append.size(), 5u) << "data files did not roll";
  ASSERT_TRUE(last_append.count("ckpt/state/" + index));
  for (const auto& [path, at] : last_append) {
    EXPECT_EQ(syncs[path], 1) << path;
    EXPECT_GT(sync_at[path], at) << path << " synced before its last append";
  }
  EXPECT_EQ(syncs.size(), last_append.size());
  EXPECT_EQ(recorded->Count("WriteAll"), 0);
}

TEST(ShardWriterTest, CancelledWritersStartNoNewChunk) {
  Shard shard;
  auto counted = std::make_shared<FaultInjectionStorage>(StorageWithFolders());
  CancellationToken token;
  counted->FailOn([&](std::string_view op, const std::string&) -> Status {
    if (op == "Append") token.Cancel();
    return Status::Ok();
  });
  CancellationScope scope(token);
  Options options = CompressedSmallChunks(0);
  options.io_threads = 1;
  Result<std::string> written =
      WriteShards(*counted, "ckpt/state", 0, shard.Data(), options);
  EXPECT_EQ(written.status().code(), StatusCode::kCancelled);
  EXPECT_LE(counted->Count("Append"), 2);  // of 16 chunks (an alignment pad + 1)
}

}  // namespace
}  // namespace shardkeep::internal

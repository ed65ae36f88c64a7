// Saves that take unchanged arrays from an earlier checkpoint
// (ShardData::stored_in, or compare_with where the bytes are equal): linked
// where the storage can, read otherwise, and whole on their own once the
// earlier checkpoint is deleted.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <numeric>
#include <set>

#include "shardkeep/checkpoint.h"
#include "testing/payloads.h"
#include "testing/status_matchers.h"

namespace shardkeep {
namespace {

constexpr uint64_t kRows = 16, kCols = 8;

enum class Backend { kFiles, kMemory, kMemoryObjects };

class ReuseTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam() == Backend::kFiles) {
      root_ = std::filesystem::temp_directory_path() /
              ("shardkeep_reuse_test_" + std::to_string(getpid()));
      std::filesystem::remove_all(root_);
      std::filesystem::create_directories(root_);
      storage_ = NewFileStorage();
      prefix_ = root_.string() + "/";
    } else {
      storage_ = NewMemoryStorage(GetParam() == Backend::kMemory
                                      ? MemoryStorageMode::kFileSystem
                                      : MemoryStorageMode::kObjectStore);
      prefix_ = "root/";
    }
    frozen_.resize(kRows * kCols);
    std::iota(frozen_.begin(), frozen_.end(), 0.25f);
    adapter_.assign(kCols, 1.f);
  }
  void TearDown() override {
    if (!root_.empty()) std::filesystem::remove_all(root_);
  }

  static Options SmallChunks() {
    Options options;
    options.chunk_bytes = 128;  // four rows per chunk: several chunks per shard
    options.io_threads = 2;
    return options;
  }

  // A save of {"frozen": [16, 8] f32 in two row halves, "adapter": [8]}
  // to `path`; `frozen_from`, when set, names the frozen leaf's place
  // instead of its bytes, in shards of `rows_per_shard` rows.
  SaveRequest Request(const std::string& path, std::optional<StoredIn> frozen_from,
                      uint64_t rows_per_shard = kRows / 2,
                      std::optional<StoredIn> compare_frozen_with = std::nullopt) {
    SaveRequest request;
    request.path = prefix_ + path;
    CheckpointablePayload part = testdata::PytreePayload(
        "state", {{"frozen", "float32", {kRows, kCols}}, {"adapter", "float32", {kCols}}});
    for (uint64_t r = 0; r < kRows; r += rows_per_shard) {
      ShardData shard{0, DType::kFloat32, Box{{r, 0}, {rows_per_shard, kCols}},
                      reinterpret_cast<const uint8_t*>(frozen_.data() + r * kCols)};
      if (frozen_from) {
        shard.data = nullptr;
        shard.stored_in = frozen_from;
      }
      shard.compare_with = compare_frozen_with;
      part.shards.push_back(std::move(shard));
    }
    part.shards.push_back({1, DType::kFloat32, Box{{0}, {kCols}},
                           reinterpret_cast<const uint8_t*>(adapter_.data())});
    request.parts.push_back(std::move(part));
    return request;
  }

  Status Save(SaveRequest request) {
    return shardkeep::Save(storage_, nullptr, std::move(request), SmallChunks());
  }

  int64_t CreatedNs(const std::string& path) {
    auto reader = CheckpointReader::Open(storage_, prefix_ + path);
    EXPECT_TRUE(reader.ok()) << reader.status().ToString();
    return reader.ok() ? (*reader)->Info().created_ns : 0;
  }

  StoredIn FrozenIn(const std::string& path) {
    return StoredIn{prefix_ + path, "state", "frozen", CreatedNs(path)};
  }

  std::vector<float> ReadLeaf(const std::string& path, const std::string& leaf,
                              uint64_t elements) {
    std::vector<float> out(elements, -1.f);
    auto reader = CheckpointReader::Open(storage_, prefix_ + path);
    EXPECT_TRUE(reader.ok()) << reader.status().ToString();
    if (!reader.ok()) return out;
    SK_EXPECT_OK((*reader)->ReadLeaf("state", leaf, DType::kFloat32, out.data(), Options()));
    return out;
  }

  // The link count of each of `path`'s data files, by name (files only).
  std::map<std::string, nlink_t> LinkCounts(const std::string& path) {
    std::map<std::string, nlink_t> counts;
    for (const auto& entry : std::filesystem::directory_iterator(prefix_ + path + "/state/data")) {
      struct stat file;
      EXPECT_EQ(::stat(entry.path().c_str(), &file), 0);
      counts[entry.path().filename().string()] = file.st_nlink;
    }
    return counts;
  }

  std::filesystem::path root_;
  std::string prefix_;
  std::shared_ptr<Storage> storage_;
  std::vector<float> frozen_;
  std::vector<float> adapter_;
};

TEST_P(ReuseTest, UnchangedLeafIsTakenFromTheEarlierCheckpointAndOutlivesIt) {
  SK_ASSERT_OK(Save(Request("a", std::nullopt)));
  adapter_.assign(kCols, 2.f);  // the adapter changed, the frozen leaf did not
  SK_ASSERT_OK(Save(Request("b", FrozenIn("a"))));

  if (GetParam() == Backend::kFiles) {
    // b's first data file is one of a's: linked, not written again.
    std::set<ino_t> a_files;
    for (const auto& entry : std::filesystem::directory_iterator(prefix_ + "a/state/data")) {
      struct stat file;
      ASSERT_EQ(::stat(entry.path().c_str(), &file), 0);
      a_files.insert(file.st_ino);
    }
    struct stat b_file;
    ASSERT_EQ(::stat((prefix_ + "b/state/data/p0-0.bin").c_str(), &b_file), 0);
    EXPECT_EQ(a_files.count(b_file.st_ino), 1u);
    EXPECT_EQ(b_file.st_nlink, 2u);
  }
  SK_ASSERT_OK(storage_->DeleteRecursive(prefix_ + "a"));
  EXPECT_EQ(ReadLeaf("b", "frozen", kRows * kCols), frozen_);
  EXPECT_EQ(ReadLeaf("b", "adapter", kCols), adapter_);
}

TEST_P(ReuseTest, ChunksThatCrossTheBoxAreReadInstead) {
  SK_ASSERT_OK(Save(Request("a", std::nullopt, /*rows_per_shard=*/kRows)));
  // Shards of 2 rows: a's 4-row chunks reach outside each of them.
  SK_ASSERT_OK(Save(Request("b", FrozenIn("a"), /*rows_per_shard=*/2)));
  SK_ASSERT_OK(storage_->DeleteRecursive(prefix_ + "a"));
  EXPECT_EQ(ReadLeaf("b", "frozen", kRows * kCols), frozen_);
}

TEST_P(ReuseTest, ChainsOfReusesStayWhole) {
  SK_ASSERT_OK(Save(Request("a", std::nullopt)));
  SK_ASSERT_OK(Save(Request("b", FrozenIn("a"))));
  SK_ASSERT_OK(Save(Request("c", FrozenIn("b"))));
  SK_ASSERT_OK(storage_->DeleteRecursive(prefix_ + "a"));
  SK_ASSERT_OK(storage_->DeleteRecursive(prefix_ + "b"));
  EXPECT_EQ(ReadLeaf("c", "frozen", kRows * kCols), frozen_);
}

TEST_P(ReuseTest, AReplacedOrMissingEarlierCheckpointFailsTheSave) {
  SK_ASSERT_OK(Save(Request("a", std::nullopt)));
  const StoredIn stale = FrozenIn("a");
  SaveRequest again = Request("a", std::nullopt);
  again.force = true;
  SK_ASSERT_OK(Save(std::move(again)));
  Status replaced = Save(Request("b", stale));
  EXPECT_EQ(replaced.code(), StatusCode::kNotFound) << replaced.ToString();
  EXPECT_NE(replaced.message().find("was replaced"), std::string::npos) << replaced.ToString();

  StoredIn missing = FrozenIn("a");
  missing.checkpoint = prefix_ + "nowhere";
  Status gone = Save(Request("c", missing));
  EXPECT_EQ(gone.code(), StatusCode::kNotFound) << gone.ToString();
  EXPECT_NE(gone.message().find("nowhere"), std::string::npos) << gone.ToString();
  EXPECT_FALSE(*storage_->Exists(prefix_ + "c/_SHARDKEEP"));
}

TEST_P(ReuseTest, ALeafOfAnotherDtypeIsRefused) {
  SK_ASSERT_OK(Save(Request("a", std::nullopt)));
  StoredIn wrong = FrozenIn("a");
  wrong.leaf_path = "adapter";  // float32 too, but it does not hold the box
  Status refused = Save(Request("b", wrong));
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.ToString();
  EXPECT_NE(refused.message().find("'adapter'"), std::string::npos) << refused.ToString();
}

TEST_P(ReuseTest, ComparedShardsWithTheSameBytesAreLinked) {
  SK_ASSERT_OK(Save(Request("a", std::nullopt)));
  // The same values in other memory: only a comparison can tell.
  std::vector<float> original = frozen_;
  frozen_ = std::vector<float>(original);
  frozen_[kRows * kCols - 1] += 1.f;  // the second half of the rows differs
  SK_ASSERT_OK(Save(Request("b", std::nullopt, kRows / 2, FrozenIn("a"))));

  if (GetParam() == Backend::kFiles) {
    // The first half (a's p0-0.bin holds its chunks) is linked; the second
    // half and the adapter are written into files of b's own.
    const std::map<std::string, nlink_t> counts = LinkCounts("b");
    EXPECT_EQ(counts.at("p0-0.bin"), 2u);
    int own = 0;
    for (const auto& [name, links] : counts) own += links == 1;
    EXPECT_GE(own, 1);
  }
  SK_ASSERT_OK(storage_->DeleteRecursive(prefix_ + "a"));
  EXPECT_EQ(ReadLeaf("b", "frozen", kRows * kCols), frozen_);
}

TEST_P(ReuseTest, ComparedShardsThatDifferAreWritten) {
  SK_ASSERT_OK(Save(Request("a", std::nullopt)));
  for (float& value : frozen_) value *= 2.f;
  SK_ASSERT_OK(Save(Request("b", std::nullopt, kRows / 2, FrozenIn("a"))));
  if (GetParam() == Backend::kFiles) {
    for (const auto& [name, links] : LinkCounts("b")) EXPECT_EQ(links, 1u) << name;
  }
  SK_ASSERT_OK(storage_->DeleteRecursive(prefix_ + "a"));
  EXPECT_EQ(ReadLeaf("b", "frozen", kRows * kCols), frozen_);
}

TEST_P(ReuseTest, ComparingWithNothingComparableWrites) {
  SK_ASSERT_OK(Save(Request("a", std::nullopt)));
  StoredIn other_leaf = FrozenIn("a");
  other_leaf.leaf_path = "adapter";  // does not hold the box
  StoredIn absent_leaf = FrozenIn("a");
  absent_leaf.leaf_path = "nothing";
  StoredIn replaced = FrozenIn("a");
  replaced.created_ns += 1;
  StoredIn nowhere = FrozenIn("a");
  nowhere.checkpoint = prefix_ + "nowhere";
  int n = 0;
  for (const StoredIn& place : {other_leaf, absent_leaf, replaced, nowhere}) {
    const std::string path = "b" + std::to_string(n++);
    SK_ASSERT_OK(Save(Request(path, std::nullopt, kRows / 2, place)));
    EXPECT_EQ(ReadLeaf(path, "frozen", kRows * kCols), frozen_) << path;
    if (GetParam() == Backend::kFiles) {
      for (const auto& [name, links] : LinkCounts(path)) EXPECT_EQ(links, 1u) << path << name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, ReuseTest,
                         ::testing::Values(Backend::kFiles, Backend::kMemory,
                                           Backend::kMemoryObjects),
                         [](const auto& info) {
                           switch (info.param) {
                             case Backend::kFiles: return "Files";
                             case Backend::kMemory: return "Memory";
                             default: return "MemoryObjects";
                           }
                         });

}  // namespace
}  // namespace shardkeep

// End-to-end tests of the engine: StartSave's commit protocol and the
// reader's resharding reads, on the memory backend and the file backend.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "shardkeep/checkpoint.h"
#include "storage/fault_injection.h"
#include "testing/payloads.h"
#include "testing/status_matchers.h"

namespace shardkeep {
namespace {

constexpr uint64_t kRows = 12, kCols = 10;


struct TestState {
  std::vector<float> w;
  int32_t step = 7;
  TestState() : w(kRows * kCols) { std::iota(w.begin(), w.end(), 0.5f); }
};

// Saves `state` as four row-block shards of w plus the scalar.
SaveRequest MakeRequest(const std::string& path, const TestState& state) {
  SaveRequest request;
  request.path = path;
  request.step = 3;
  // A 12x10 float32 leaf "w" and a 0-d int32 leaf "step".
  CheckpointablePayload part = testdata::PytreePayload(
      "state", {{"w", "float32", {kRows, kCols}}, {"step", "int32", {}}});
  for (uint64_t r = 0; r < kRows; r += 3) {
    part.shards.push_back(
        {0, DType::kFloat32, Box{{r, 0}, {3, kCols}},
         reinterpret_cast<const uint8_t*>(state.w.data() + r * kCols)});
  }
  part.shards.push_back({1, DType::kInt32, Box{{}, {}},
                         reinterpret_cast<const uint8_t*>(&state.step)});
  request.parts.push_back(std::move(part));
  request.parts.push_back(testdata::BytesPayload("dataset", "loader-position-42"));
  return request;
}

Options SmallChunks() {
  Options options;
  options.chunk_bytes = 64;  // many chunks per shard
  options.io_threads = 3;
  return options;
}

std::vector<float> ReadBox(CheckpointReader& reader, const Box& box,
                           const Options& options, Status* status = nullptr) {
  std::vector<float> out(box.NumElements(), -1.f);
  ReadRequest request{0, DType::kFloat32, box, reinterpret_cast<uint8_t*>(out.data())};
  Status s = reader.Read("state", {request}, options);
  if (status) *status = s;
  else EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

void ExpectBoxMatches(const std::vector<float>& got, const Box& box,
                      const TestState& state) {
  size_t i = 0;
  for (uint64_t r = box.origin[0]; r < box.origin[0] + box.shape[0]; ++r) {
    for (uint64_t c = box.origin[1]; c < box.origin[1] + box.shape[1]; ++c) {
      ASSERT_EQ(got[i++], state.w[r * kCols + c]) << "at " << r << "," << c;
    }
  }
}

class CheckpointTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (GetParam()) {
      root_ = std::filesystem::temp_directory_path() /
              ("shardkeep_checkpoint_test_" + std::to_string(getpid()));
      std::filesystem::remove_all(root_);
      std::filesystem::create_directories(root_);
      storage_ = NewFileStorage();
      path_ = (root_ / "ckpt").string();
    } else {
      storage_ = NewMemoryStorage();
      path_ = "root/ckpt";
    }
    coordinator_ = NewSingleProcessCoordinator();
  }
  void TearDown() override {
    if (!root_.empty()) std::filesystem::remove_all(root_);
  }

  std::filesystem::path root_;
  std::shared_ptr<Storage> storage_;
  std::shared_ptr<Coordinator> coordinator_;
  std::string path_;
  TestState state_;
};

TEST_P(CheckpointTest, RoundTripAnyBox) {
  for (bool compress : {false, true}) {
    Options options = SmallChunks();
    options.compress = compress;
    SaveRequest request = MakeRequest(path_, state_);
    request.force = true;
    SK_ASSERT_OK(Save(storage_, coordinator_, std::move(request), options));
    SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage_, path_));
    for (const Box& box : {Box{{0, 0}, {kRows, kCols}}, Box{{1, 3}, {7, 5}},
                           Box{{5, 0}, {1, kCols}}, Box{{11, 9}, {1, 1}}}) {
      ExpectBoxMatches(ReadBox(*reader, box, options), box, state_);
    }
    int32_t step = 0;
    SK_ASSERT_OK(reader->Read(
        "state", {{1, DType::kInt32, Box{{}, {}}, reinterpret_cast<uint8_t*>(&step)}},
        options));
    EXPECT_EQ(step, 7);
    SK_ASSERT_OK_AND_ASSIGN(std::string value, reader->ReadValue("dataset"));
    EXPECT_EQ(value, "loader-position-42");
  }
}

TEST_P(CheckpointTest, LocatesBoxesStoredAsOneRawChunkAt64ByteOffsets) {
  Options options;
  options.io_threads = 1;  // one data file: the scalar and four row blocks
  SK_ASSERT_OK(Save(storage_, coordinator_, MakeRequest(path_, state_), options));
  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage_, path_));
  const Box block{{3, 0}, {3, kCols}};
  SK_ASSERT_OK_AND_ASSIGN(
      auto found,
      reader->Locate("state",
                     {{0, DType::kFloat32, block, nullptr},
                      {1, DType::kInt32, Box{{}, {}}, nullptr},
                      {0, DType::kFloat32, Box{{2, 0}, {3, kCols}}, nullptr},  // 2 chunks
                      {0, DType::kFloat64, block, nullptr}},                  // a cast
                     options));
  ASSERT_EQ(found.size(), 4u);
  ASSERT_TRUE(found[0].has_value() && found[1].has_value());
  EXPECT_FALSE(found[2].has_value());
  EXPECT_FALSE(found[3].has_value());
  const StoredRange& range = *found[0];
  EXPECT_EQ(range.length, block.NumElements() * sizeof(float));
  EXPECT_EQ(range.offset % 64, 0u);
  EXPECT_EQ(found[1]->offset % 64, 0u);
  std::vector<float> bytes(block.NumElements());
  SK_ASSERT_OK(storage_->ReadAt(range.file, range.offset, range.length, bytes.data()));
  EXPECT_EQ(range.checksum, ChunkChecksum(bytes.data(), range.length));
  ExpectBoxMatches(bytes, block, state_);
  // Requests are checked as Read checks them.
  EXPECT_EQ(reader->Locate("state", {{9, DType::kFloat32, block, nullptr}}, options)
                .status().code(),
            StatusCode::kInvalidArgument);
}

TEST_P(CheckpointTest, CastsOnRead) {
  SK_ASSERT_OK(Save(storage_, coordinator_, MakeRequest(path_, state_), SmallChunks()));
  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage_, path_));
  Box box{{2, 2}, {4, 4}};
  std::vector<double> out(box.NumElements());
  SK_ASSERT_OK(reader->Read(
      "state", {{0, DType::kFloat64, box, reinterpret_cast<uint8_t*>(out.data())}},
      SmallChunks()));
  EXPECT_EQ(out[0], state_.w[2 * kCols + 2]);
  std::vector<uint16_t> narrow(box.NumElements());
  Status lossy = reader->Read(
      "state", {{0, DType::kBFloat16, box, reinterpret_cast<uint8_t*>(narrow.data())}},
      SmallChunks());
  EXPECT_EQ(lossy.code(), StatusCode::kIncompatible) << lossy.ToString();
}

TEST_P(CheckpointTest, RefusesToOverwriteWithoutForce) {
  SK_ASSERT_OK(Save(storage_, coordinator_, MakeRequest(path_, state_), SmallChunks()));
  Status again = Save(storage_, coordinator_, MakeRequest(path_, state_), SmallChunks());
  EXPECT_EQ(again.code(), StatusCode::kAlreadyExists) << again.ToString();
  state_.w[0] = 1000.f;
  SaveRequest forced = MakeRequest(path_, state_);
  forced.force = true;
  SK_ASSERT_OK(Save(storage_, coordinator_, std::move(forced), SmallChunks()));
  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage_, path_));
  EXPECT_EQ(ReadBox(*reader, Box{{0, 0}, {1, 1}}, SmallChunks())[0], 1000.f);
  SK_ASSERT_OK_AND_ASSIGN(bool old_left, storage_->Exists(path_ + ".shardkeep-old"));
  EXPECT_FALSE(old_left);
}

TEST_P(CheckpointTest, CustomMetadataAndMetricsAreJsonObjects) {
  SaveRequest request = MakeRequest(path_, state_);
  request.custom_metadata_json = R"({"run": "demo", "seed": 7})";
  request.metrics_json = R"({"loss": 0.25})";
  SK_ASSERT_OK(Save(storage_, coordinator_, std::move(request), SmallChunks()));
  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage_, path_));
  EXPECT_NE(reader->commit_json().find(R"("seed": 7)"), std::string::npos) << reader->commit_json();
  EXPECT_NE(reader->commit_json().find(R"("loss": 0.25)"), std::string::npos);
  for (const char* bad : {"[1, 2]", "{not json", "7"}) {
    SaveRequest wrong = MakeRequest(path_ + "-bad", state_);
    wrong.metrics_json = bad;
    Status status = Save(storage_, coordinator_, std::move(wrong), SmallChunks());
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find("metrics must be a JSON object"), std::string::npos);
    SK_ASSERT_OK_AND_ASSIGN(bool left, storage_->Exists(path_ + "-bad"));
    EXPECT_FALSE(left);
  }
}

TEST_P(CheckpointTest, MissingCommitRecordIsNotFound) {
  SK_ASSERT_OK(storage_->CreateDir(path_ + "/state"));
  auto reader = CheckpointReader::Open(storage_, path_);
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), StatusCode::kNotFound);
  EXPECT_NE(reader.status().message().find("_SHARDKEEP"), std::string::npos);
}

TEST_P(CheckpointTest, StaleTemporaryDirIsReplaced) {
  SK_ASSERT_OK(storage_->CreateDir(path_ + ".shardkeep-tmp/state/data"));
  SK_ASSERT_OK(storage_->WriteAll(path_ + ".shardkeep-tmp/state/data/p0-0.bin",
                                  "garbage", false));
  EXPECT_FALSE(CheckpointReader::Open(storage_, path_).ok());
  SK_ASSERT_OK(Save(storage_, coordinator_, MakeRequest(path_, state_), SmallChunks()));
  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage_, path_));
  Box all{{0, 0}, {kRows, kCols}};
  ExpectBoxMatches(ReadBox(*reader, all, SmallChunks()), all, state_);
  SK_ASSERT_OK_AND_ASSIGN(bool tmp_left, storage_->Exists(path_ + ".shardkeep-tmp"));
  EXPECT_FALSE(tmp_left);
}

TEST_P(CheckpointTest, FlippedByteIsCorruptionNamingLeafAndFile) {
  Options options = SmallChunks();
  options.io_threads = 1;
  SK_ASSERT_OK(Save(storage_, coordinator_, MakeRequest(path_, state_), options));
  const std::string file = path_ + "/state/data/p0-0.bin";
  SK_ASSERT_OK_AND_ASSIGN(std::string bytes, storage_->ReadAll(file));
  bytes[bytes.size() / 2] ^= 0x10;
  SK_ASSERT_OK(storage_->WriteAll(file, bytes, false));
  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage_, path_));
  Status status;
  ReadBox(*reader, Box{{0, 0}, {kRows, kCols}}, options, &status);
  EXPECT_EQ(status.code(), StatusCode::kCorruption) << status.ToString();
  EXPECT_NE(status.message().find("leaf 'w'"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("p0-0.bin"), std::string::npos) << status.message();
}

TEST_P(CheckpointTest, MissingIndexIsCorruption) {
  SK_ASSERT_OK(Save(storage_, coordinator_, MakeRequest(path_, state_), SmallChunks()));
  SK_ASSERT_OK(storage_->DeleteFile(path_ + "/state/index/p0.idx"));
  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage_, path_));
  SK_EXPECT_OK(reader->ReadValue("dataset").status());  // other parts still load
  Status status;
  ReadBox(*reader, Box{{0, 0}, {1, 1}}, SmallChunks(), &status);
  EXPECT_EQ(status.code(), StatusCode::kCorruption) << status.ToString();
}

INSTANTIATE_TEST_SUITE_P(Backends, CheckpointTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "File" : "Memory"; });

// A failure injected at any storage operation of a save must leave no
// committed checkpoint behind, and a later save must succeed.
TEST(CheckpointFaultTest, FailureAtEveryStepCommitsNothing) {
  const std::vector<std::string> ops = {"CreateDir", "OpenForAppend", "Append",
                                        "Sync",      "Close",         "WriteAll",
                                        "SyncDir",   "Rename"};
  for (const std::string& op : ops) {
    for (int nth : {0, 1, 2}) {
      auto inner = NewMemoryStorage();
      auto storage = std::make_shared<FaultInjectionStorage>(inner);
      std::atomic<int> seen{0};
      storage->FailOn([&](std::string_view called, const std::string&) {
        if (called == op && seen++ == nth) return StorageError("injected " + op);
        return Status::Ok();
      });
      TestState state;
      Status status = Save(storage, NewSingleProcessCoordinator(),
                           MakeRequest("r/ckpt", state), SmallChunks());
      if (seen <= nth) continue;  // this save never made that many calls
      EXPECT_EQ(status.code(), StatusCode::kStorage) << op << " #" << nth;
      EXPECT_FALSE(CheckpointReader::Open(inner, "r/ckpt").ok()) << op << " #" << nth;
      storage->FailOn(nullptr);
      SK_EXPECT_OK(Save(storage, NewSingleProcessCoordinator(),
                        MakeRequest("r/ckpt", state), SmallChunks()));
      EXPECT_TRUE(CheckpointReader::Open(inner, "r/ckpt").ok()) << op << " #" << nth;
    }
  }
}

}  // namespace
}  // namespace shardkeep

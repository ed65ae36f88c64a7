// VerifyCheckpoint against every kind of damage: each must be reported,
// naming the file, the leaf and the offset, and all of them at once.
#include "shardkeep/verify.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "format/commit_record.h"
#include "format/index.h"
#include "shardkeep/checkpoint.h"
#include "testing/payloads.h"
#include "testing/status_matchers.h"

namespace shardkeep {
namespace {

using testing::Has;

constexpr uint64_t kRows = 12, kCols = 10;

class VerifyTest : public ::testing::Test {
 protected:
  // "state": leaf "w", 12x10 float32 in four row blocks of 3 (one chunk
  // each), and leaf "b", 7 int32 (zstd when `compress`); "blob": bytes.
  void Write(const std::shared_ptr<Storage>& storage, bool compress) {
    std::iota(w_.begin(), w_.end(), 0.5f);
    std::iota(b_.begin(), b_.end(), 0);
    SaveRequest request;
    request.path = path_;
    CheckpointablePayload part = testdata::PytreePayload(
        "state", {{"w", "float32", {kRows, kCols}}, {"b", "int32", {7}}});
    for (uint64_t r = 0; r < kRows; r += 3) {
      part.shards.push_back({0, DType::kFloat32, Box{{r, 0}, {3, kCols}},
                             reinterpret_cast<const uint8_t*>(w_.data() + r * kCols)});
    }
    part.shards.push_back({1, DType::kInt32, Box{{0}, {7}},
                           reinterpret_cast<const uint8_t*>(b_.data())});
    request.parts.push_back(std::move(part));
    request.parts.push_back(testdata::BytesPayload("blob", "some bytes"));
    Options options;
    options.io_threads = 1;
    options.compress = compress;
    SK_ASSERT_OK(Save(storage, nullptr, std::move(request), options));
  }

  void SetUp() override {
    Write(storage_, false);
    ReadRecords();
  }

  void ReadRecords() {
    SK_ASSERT_OK_AND_ASSIGN(std::string bytes, storage_->ReadAll(index_));
    SK_ASSERT_OK_AND_ASSIGN(records_, format::DecodeIndex(bytes, index_));
    ASSERT_EQ(records_.size(), 5u);
    // Rows 0-2, 3-5, 6-8, 9-11 of "w", then "b".
    std::sort(records_.begin(), records_.end(), [](const auto& a, const auto& b) {
      return std::tie(a.leaf, a.box.origin) < std::tie(b.leaf, b.box.origin);
    });
  }

  void RewriteIndex() {
    SK_ASSERT_OK(storage_->WriteAll(index_, format::EncodeIndex(records_), false));
  }

  // Where record `i` (in records_' order) lies in the rewritten index.
  uint64_t RecordOffset(size_t i) {
    uint64_t offset = 16;
    for (size_t j = 0; j < i; ++j) offset += 48 + 16 * records_[j].box.rank();
    return offset;
  }

  void FlipByte(uint64_t offset) {
    SK_ASSERT_OK_AND_ASSIGN(std::string data, storage_->ReadAll(data_));
    data[offset] ^= 0x40;
    SK_ASSERT_OK(storage_->WriteAll(data_, data, false));
  }

  VerifyReport Verify(const VerifyOptions& options = {}) {
    Result<VerifyReport> report = VerifyCheckpoint(storage_, path_, options);
    EXPECT_TRUE(report.ok()) << report.status().ToString();
    return report.ok() ? *report : VerifyReport();
  }

  static std::string Describe(const VerifyReport& report) {
    std::string text;
    for (const VerifyProblem& p : report.problems) text += p.message + "\n";
    return text;
  }

  std::shared_ptr<Storage> storage_ = NewMemoryStorage();
  const std::string path_ = "root/ckpt";
  const std::string index_ = path_ + "/state/index/p0.idx";
  const std::string data_ = path_ + "/state/data/p0-0.bin";
  std::vector<float> w_ = std::vector<float>(kRows * kCols);
  std::vector<int32_t> b_ = std::vector<int32_t>(7);
  std::vector<format::ChunkRecord> records_;
};

TEST_F(VerifyTest, IntactCheckpointIsClean) {
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  VerifyOptions options;
  options.progress = [&](uint64_t done, uint64_t total) { calls.push_back({done, total}); };
  const VerifyReport report = Verify(options);
  EXPECT_TRUE(report.ok()) << Describe(report);
  EXPECT_EQ(report.chunks_checked, 5u);
  EXPECT_EQ(report.bytes_checked, kRows * kCols * 4 + 7 * 4);
  ASSERT_FALSE(calls.empty());
  EXPECT_EQ(calls.front(), std::make_pair(uint64_t{0}, report.bytes_checked));
  EXPECT_EQ(calls.back(), std::make_pair(report.bytes_checked, report.bytes_checked));
}

TEST_F(VerifyTest, EveryFlippedChunkIsReportedWithItsOffset) {
  FlipByte(records_[1].offset + 5);
  FlipByte(records_[4].offset);
  const VerifyReport report = Verify();
  ASSERT_EQ(report.problems.size(), 2u) << Describe(report);
  int found = 0;
  for (const VerifyProblem& problem : report.problems) {
    EXPECT_EQ(problem.file, data_);
    EXPECT_EQ(problem.checkpointable, "state");
    EXPECT_TRUE(Has(problem.message, "checksum mismatch"));
    EXPECT_TRUE(Has(problem.message, data_));
    if (problem.leaf == "w") {
      EXPECT_EQ(problem.offset, records_[1].offset);
      EXPECT_TRUE(Has(problem.message, "[3:6, 0:10]"));
      found |= 1;
    } else if (problem.leaf == "b") {
      EXPECT_EQ(problem.offset, records_[4].offset);
      found |= 2;
    }
  }
  EXPECT_EQ(found, 3);
  EXPECT_LT(report.problems[0].offset, report.problems[1].offset);  // sorted
}

TEST_F(VerifyTest, TruncatedDataFileReportsEveryChunkPastItsEnd) {
  SK_ASSERT_OK_AND_ASSIGN(std::string data, storage_->ReadAll(data_));
  const uint64_t keep = std::min(records_[2].offset, records_[3].offset) + 1;
  SK_ASSERT_OK(storage_->WriteAll(data_, data.substr(0, keep), false));
  const VerifyReport report = Verify();
  size_t past_end = 0;
  for (const VerifyProblem& problem : report.problems) {
    EXPECT_EQ(problem.file, data_);
    ASSERT_TRUE(problem.offset.has_value());
    if (problem.message.find("past the end of the file (" + std::to_string(keep) +
                             " bytes)") != std::string::npos) {
      ++past_end;
    }
  }
  // Every chunk starting at or after the cut lies past the end.
  size_t expected = 0;
  for (const auto& record : records_) expected += record.offset + record.stored_length > keep;
  EXPECT_EQ(past_end, expected) << Describe(report);
  EXPECT_GE(expected, 2u);
}

TEST_F(VerifyTest, MissingIndexFileIsReportedWithoutTilingNoise) {
  SK_ASSERT_OK(storage_->DeleteFile(index_));
  const VerifyReport report = Verify();
  ASSERT_EQ(report.problems.size(), 1u) << Describe(report);
  EXPECT_EQ(report.problems[0].file, index_);
  EXPECT_TRUE(Has(report.problems[0].message, "is missing"));
}

TEST_F(VerifyTest, DamagedIndexFileIsReported) {
  SK_ASSERT_OK_AND_ASSIGN(std::string bytes, storage_->ReadAll(index_));
  bytes[20] ^= 1;
  SK_ASSERT_OK(storage_->WriteAll(index_, bytes, false));
  const VerifyReport report = Verify();
  ASSERT_EQ(report.problems.size(), 1u) << Describe(report);
  EXPECT_EQ(report.problems[0].file, index_);
  EXPECT_TRUE(Has(report.problems[0].message, "trailer checksum mismatch"));
}

TEST_F(VerifyTest, RecordOutsideTheLeafShapeIsReportedAtItsOffset) {
  records_[3].box.origin[0] = kRows;  // rows 12-14 of a 12-row leaf
  RewriteIndex();
  const VerifyReport report = Verify();
  ASSERT_EQ(report.problems.size(), 2u) << Describe(report);
  // Both in the index file; the one without an offset sorts first.
  const VerifyProblem& record = report.problems[1];
  EXPECT_EQ(record.file, index_);
  EXPECT_EQ(record.leaf, "w");
  EXPECT_EQ(record.offset, RecordOffset(3));
  EXPECT_TRUE(Has(record.message, "outside shape [0:12, 0:10]"));
  // Without that chunk, rows 9-11 are not covered.
  EXPECT_TRUE(Has(report.problems[0].message, "cover 90 of its 120 elements"));
  EXPECT_EQ(report.problems[0].leaf, "w");
}

TEST_F(VerifyTest, RecordNamingNoLeafIsReported) {
  records_[4].leaf = 9;
  RewriteIndex();
  const VerifyReport report = Verify();
  // The record, and leaf "b" left without chunks.
  ASSERT_EQ(report.problems.size(), 2u) << Describe(report);
  EXPECT_EQ(report.problems[1].leaf, "#9");
  EXPECT_EQ(report.problems[1].offset, RecordOffset(4));
  EXPECT_TRUE(Has(report.problems[1].message, "names no leaf of meta.json"));
  EXPECT_EQ(report.problems[0].leaf, "b");
  EXPECT_TRUE(Has(report.problems[0].message, "cover 0 of its 7 elements"));
}

TEST_F(VerifyTest, OverlappingChunksAreATilingProblem) {
  records_[3] = records_[1];  // rows 3-5 twice, rows 9-11 never
  RewriteIndex();
  const VerifyReport report = Verify();
  ASSERT_EQ(report.problems.size(), 1u) << Describe(report);
  EXPECT_EQ(report.problems[0].leaf, "w");
  EXPECT_EQ(report.problems[0].file, index_);
  EXPECT_TRUE(Has(report.problems[0].message, "overlaps"));
}

TEST_F(VerifyTest, MissingChunkIsATilingProblem) {
  records_.erase(records_.begin() + 2);
  RewriteIndex();
  const VerifyReport report = Verify();
  ASSERT_EQ(report.problems.size(), 1u) << Describe(report);
  EXPECT_EQ(report.problems[0].leaf, "w");
  EXPECT_TRUE(Has(report.problems[0].message, "cover 90 of its 120 elements"));
  EXPECT_TRUE(Has(report.problems[0].message, index_));
}

TEST_F(VerifyTest, CorruptMetaJsonIsReportedAndChunksAreStillChecked) {
  const std::string meta = path_ + "/state/meta.json";
  SK_ASSERT_OK(storage_->WriteAll(meta, "{\"kind\": \"pytree\", \"tree\": ", false));
  FlipByte(records_[0].offset);
  const VerifyReport report = Verify();
  ASSERT_EQ(report.problems.size(), 2u) << Describe(report);
  EXPECT_EQ(report.problems[0].file, data_);
  EXPECT_EQ(report.problems[0].leaf, "#0");  // meta.json cannot name it
  EXPECT_TRUE(Has(report.problems[0].message, "checksum mismatch"));
  EXPECT_EQ(report.problems[1].file, meta);
  EXPECT_EQ(report.problems[1].checkpointable, "state");
  EXPECT_EQ(report.chunks_checked, 5u);
}

// A flip that leaves meta.json and value.bin decodable (a digit of the
// shape, a byte of the blob) is found by the checksums the record lists.
TEST_F(VerifyTest, DecodableButChangedMetaJsonAndValueAreReported) {
  const std::string meta = path_ + "/state/meta.json";
  const std::string blob = path_ + "/blob/value.bin";
  SK_ASSERT_OK_AND_ASSIGN(std::string text, storage_->ReadAll(meta));
  text[text.find("12")] = '3';  // rows 12 -> 32
  SK_ASSERT_OK(storage_->WriteAll(meta, text, false));
  SK_ASSERT_OK(storage_->WriteAll(blob, "some bytez", false));
  const VerifyReport report = Verify();
  ASSERT_EQ(report.problems.size(), 2u) << Describe(report);
  EXPECT_EQ(report.problems[0].file, blob);
  EXPECT_EQ(report.problems[1].file, meta);
  for (const VerifyProblem& problem : report.problems) {
    EXPECT_TRUE(Has(problem.message, "checksum mismatch")) << problem.message;
    EXPECT_TRUE(Has(problem.message, "_SHARDKEEP")) << problem.message;
  }
}

TEST_F(VerifyTest, MissingMetaJsonAndValueFileAreReported) {
  SK_ASSERT_OK(storage_->DeleteFile(path_ + "/blob/value.bin"));
  SK_ASSERT_OK(storage_->DeleteFile(path_ + "/blob/meta.json"));
  const VerifyReport report = Verify();
  ASSERT_EQ(report.problems.size(), 2u) << Describe(report);
  EXPECT_EQ(report.problems[0].file, path_ + "/blob/meta.json");
  EXPECT_EQ(report.problems[1].file, path_ + "/blob/value.bin");
  for (const VerifyProblem& problem : report.problems) {
    EXPECT_EQ(problem.checkpointable, "blob");
    EXPECT_TRUE(Has(problem.message, "is missing"));
  }
}

TEST_F(VerifyTest, MissingDataFileIsReportedOnce) {
  SK_ASSERT_OK(storage_->DeleteFile(data_));
  const VerifyReport report = Verify();
  ASSERT_EQ(report.problems.size(), 1u) << Describe(report);
  EXPECT_EQ(report.problems[0].file, data_);
  EXPECT_TRUE(Has(report.problems[0].message, "is missing"));
}

TEST_F(VerifyTest, UndecodableCommitRecordIsTheOneProblem) {
  SK_ASSERT_OK(storage_->WriteAll(path_ + "/_SHARDKEEP", "{\"format\": \"shardkeep\"", false));
  const VerifyReport report = Verify();
  ASSERT_EQ(report.problems.size(), 1u) << Describe(report);
  EXPECT_EQ(report.problems[0].file, path_ + "/_SHARDKEEP");
}

TEST_F(VerifyTest, NoCommitRecordIsNotFound) {
  Result<VerifyReport> report = VerifyCheckpoint(storage_, "root/elsewhere");
  EXPECT_EQ(report.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Has(report.status().message(), "root/elsewhere/_SHARDKEEP"));
}

// A zstd chunk whose checksum is right (rewritten to match) but whose frame
// does not decode: only decompression finds it.
TEST(VerifyCompressed, UndecodableFrameWithRightChecksumIsReported) {
  auto storage = NewMemoryStorage();
  std::vector<float> w(4096);
  std::iota(w.begin(), w.end(), 0.f);
  SaveRequest request;
  request.path = "ckpt";
  CheckpointablePayload part = testdata::PytreePayload("state", {{"w", "float32", {4096}}});
  part.shards.push_back({0, DType::kFloat32, Box{{0}, {4096}},
                         reinterpret_cast<const uint8_t*>(w.data())});
  request.parts.push_back(std::move(part));
  Options options;
  options.compress = true;
  SK_ASSERT_OK(Save(storage, nullptr, std::move(request), options));
  const std::string index = "ckpt/state/index/p0.idx", data = "ckpt/state/data/p0-0.bin";
  SK_ASSERT_OK_AND_ASSIGN(std::string index_bytes, storage->ReadAll(index));
  SK_ASSERT_OK_AND_ASSIGN(auto records, format::DecodeIndex(index_bytes, index));
  ASSERT_EQ(records.size(), 1u);
  ASSERT_EQ(records[0].codec, format::Codec::kZstdBytePlanes);
  SK_ASSERT_OK_AND_ASSIGN(std::string bytes, storage->ReadAll(data));
  bytes[records[0].offset + records[0].stored_length - 1] ^= 0xff;  // in the frame's end
  records[0].checksum =
      ChunkChecksum(bytes.data() + records[0].offset, records[0].stored_length);
  SK_ASSERT_OK(storage->WriteAll(data, bytes, false));
  SK_ASSERT_OK(storage->WriteAll(index, format::EncodeIndex(records), false));

  SK_ASSERT_OK_AND_ASSIGN(VerifyReport report, VerifyCheckpoint(storage, "ckpt"));
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_EQ(report.problems[0].offset, records[0].offset);
  EXPECT_TRUE(Has(report.problems[0].message, "decompress"));
}

// On an object store the files sit in the generation the record names.
TEST(VerifyObjectStore, GenerationLayoutIsCleanAndDamageIsFound) {
  auto storage = NewMemoryStorage(MemoryStorageMode::kObjectStore);
  std::vector<int32_t> v(100, 7);
  SaveRequest request;
  request.path = "bucket/ckpt";
  CheckpointablePayload part = testdata::PytreePayload("state", {{"v", "int32", {100}}});
  part.shards.push_back({0, DType::kInt32, Box{{0}, {100}},
                         reinterpret_cast<const uint8_t*>(v.data())});
  request.parts.push_back(std::move(part));
  SK_ASSERT_OK(Save(storage, nullptr, std::move(request), Options()));
  SK_ASSERT_OK_AND_ASSIGN(VerifyReport clean, VerifyCheckpoint(storage, "bucket/ckpt"));
  EXPECT_TRUE(clean.ok());
  EXPECT_EQ(clean.chunks_checked, 1u);

  SK_ASSERT_OK_AND_ASSIGN(std::string record, storage->ReadAll("bucket/ckpt/_SHARDKEEP"));
  SK_ASSERT_OK_AND_ASSIGN(auto commit, format::DecodeCommitRecord(record, "_SHARDKEEP"));
  ASSERT_TRUE(commit.data_folder.has_value());
  const std::string data = "bucket/ckpt/" + *commit.data_folder + "/state/data/p0-0.bin";
  SK_ASSERT_OK_AND_ASSIGN(std::string bytes, storage->ReadAll(data));
  bytes[10] ^= 1;
  SK_ASSERT_OK(storage->WriteAll(data, bytes, false));
  SK_ASSERT_OK_AND_ASSIGN(VerifyReport damaged, VerifyCheckpoint(storage, "bucket/ckpt"));
  ASSERT_EQ(damaged.problems.size(), 1u);
  EXPECT_EQ(damaged.problems[0].file, data);
}

}  // namespace
}  // namespace shardkeep

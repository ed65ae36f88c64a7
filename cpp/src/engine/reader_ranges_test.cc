// CheckpointReader::Ranges: the byte ranges a Read of each request fetches,
// known from the index alone, so that another process can fetch exactly
// those bytes and the reader then read them as if from storage.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <tuple>

#include "format/index.h"
#include "shardkeep/checkpoint.h"
#include "shardkeep/safetensors.h"
#include "testing/payloads.h"
#include "testing/status_matchers.h"

namespace shardkeep {
namespace {

const std::string kPath = "root/ckpt";
const std::string kIndex = kPath + "/state/index/p0.idx";
constexpr uint64_t kRows = 12, kCols = 10;

std::string DataFile(uint32_t data_file) {
  return kPath + "/state/" + format::DataFileName(0, data_file);
}

// Saves the kRows x kCols float32 leaf "w" (0.5, 1.5, ...) at kPath as
// four shards of three rows.
Status SaveW(const std::shared_ptr<Storage>& storage, const std::vector<float>& w,
             const Options& options) {
  SaveRequest request;
  request.path = kPath;
  CheckpointablePayload part =
      testdata::PytreePayload("state", {{"w", "float32", {kRows, kCols}}});
  for (uint64_t r = 0; r < kRows; r += 3) {
    part.shards.push_back({0, DType::kFloat32, Box{{r, 0}, {3, kCols}},
                           reinterpret_cast<const uint8_t*>(w.data() + r * kCols)});
  }
  request.parts.push_back(std::move(part));
  return Save(storage, NewSingleProcessCoordinator(), std::move(request), options);
}

// A chunk per row, two chunks per data file.
Options SmallChunksInSeveralFiles() {
  Options options;
  options.chunk_bytes = 64;
  options.data_file_bytes = 128;
  options.io_threads = 1;
  return options;
}

ReadRequest RequestOf(const Box& box, uint8_t* dst = nullptr) {
  return ReadRequest{0, DType::kFloat32, box, dst};
}

// Where a chunk record lies, as Ranges reports it.
StoredRange RangeOf(const format::ChunkRecord& record) {
  return {DataFile(record.data_file), record.offset, record.stored_length, record.checksum};
}

void ExpectSameRanges(const std::vector<StoredRange>& got,
                      const std::vector<StoredRange>& expected) {
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(got[i].file, expected[i].file);
    EXPECT_EQ(got[i].offset, expected[i].offset);
    EXPECT_EQ(got[i].length, expected[i].length);
    EXPECT_EQ(got[i].checksum, expected[i].checksum);
  }
}

class ReaderRangesTest : public ::testing::Test {
 protected:
  void SetUp() override { std::iota(w_.begin(), w_.end(), 0.5f); }

  // Saves w with `options` and decodes its index.
  void Save(const Options& options) {
    SK_ASSERT_OK(SaveW(storage_, w_, options));
    SK_ASSERT_OK_AND_ASSIGN(std::string bytes, storage_->ReadAll(kIndex));
    SK_ASSERT_OK_AND_ASSIGN(records_, format::DecodeIndex(bytes, kIndex));
    std::sort(records_.begin(), records_.end(), [](const auto& a, const auto& b) {
      return std::tie(a.data_file, a.offset) < std::tie(b.data_file, b.offset);
    });
  }

  // The records whose boxes intersect `box`, in file order.
  std::vector<StoredRange> ChunksTouching(const Box& box) const {
    std::vector<StoredRange> out;
    for (const auto& record : records_) {
      if (Intersect(record.box, box)) out.push_back(RangeOf(record));
    }
    return out;
  }

  std::shared_ptr<Storage> storage_ = NewMemoryStorage();
  std::vector<float> w_ = std::vector<float>(kRows * kCols);
  std::vector<format::ChunkRecord> records_;
};

TEST_F(ReaderRangesTest, AWholeLeafIsEachOfItsChunksOnceInFileOrder) {
  Save(SmallChunksInSeveralFiles());
  std::set<uint32_t> files;
  for (const auto& record : records_) files.insert(record.data_file);
  ASSERT_GT(files.size(), 1u);
  ASSERT_GE(records_.size(), 8u);

  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage_, kPath));
  SK_ASSERT_OK_AND_ASSIGN(
      auto ranges, reader->Ranges("state", {RequestOf(Box{{0, 0}, {kRows, kCols}})}, Options()));
  ASSERT_EQ(ranges.size(), 1u);
  ExpectSameRanges(ranges[0], ChunksTouching(Box{{0, 0}, {kRows, kCols}}));
  uint64_t total = 0;
  for (const StoredRange& range : ranges[0]) total += range.length;
  EXPECT_EQ(total, kRows * kCols * sizeof(float));  // raw: the leaf's bytes
}

TEST_F(ReaderRangesTest, ABoxIsTheWholeChunksItTouchesPerRequest) {
  Save(Options());  // one chunk per three-row shard
  ASSERT_EQ(records_.size(), 4u);
  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage_, kPath));
  const Box middle{{2, 3}, {6, 4}};  // rows 2-7: the first three chunks
  const Box last_rows{{7, 0}, {5, kCols}};  // rows 7-11: the last two
  SK_ASSERT_OK_AND_ASSIGN(
      auto ranges,
      reader->Ranges("state", {RequestOf(middle), RequestOf(last_rows)}, Options()));
  ASSERT_EQ(ranges.size(), 2u);
  ExpectSameRanges(ranges[0], ChunksTouching(middle));
  EXPECT_EQ(ranges[0].size(), 3u);
  for (const StoredRange& range : ranges[0]) EXPECT_EQ(range.length, 3 * kCols * 4);
  // Rows 6-8 are in both: each request lists what it needs.
  ExpectSameRanges(ranges[1], ChunksTouching(last_rows));
  EXPECT_EQ(ranges[1].size(), 2u);

  // Requests are checked as by Read.
  EXPECT_EQ(reader->Ranges("state", {RequestOf(Box{{10, 0}, {3, kCols}})}, Options())
                .status()
                .code(),
            StatusCode::kIncompatible);
  EXPECT_EQ(reader->Ranges("state", {{1, DType::kFloat32, Box{{}, {}}, nullptr}}, Options())
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(reader->Ranges("state", {{0, DType::kInt8, Box{{0, 0}, {1, 1}}, nullptr}},
                           Options())
                .status()
                .code(),
            StatusCode::kIncompatible);  // a lossy cast, not allowed
}

TEST_F(ReaderRangesTest, ACompressedChunkIsFetchedWhole) {
  std::fill(w_.begin(), w_.end(), 2.5f);  // compresses well
  Options options;
  options.compress = true;
  Save(options);
  ASSERT_EQ(records_.size(), 4u);
  const auto& second = records_[1];
  ASSERT_EQ(second.codec, format::Codec::kZstdBytePlanes);
  ASSERT_LT(second.stored_length, second.raw_length);
  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage_, kPath));
  // One element of the chunk holding rows 3-5 still needs all of it.
  const Box one{{second.box.origin[0] + 1, 4}, {1, 1}};
  SK_ASSERT_OK_AND_ASSIGN(auto ranges, reader->Ranges("state", {RequestOf(one)}, Options()));
  ExpectSameRanges(ranges.at(0), {RangeOf(second)});
}

// A box of a safetensors tensor is the slab of its rows that Read fetches.
TEST(ReaderRangesSafetensors, ARowBlockIsItsSlabOfTheTensor) {
  constexpr uint64_t kTensorRows = 64, kTensorCols = 32, kRowBytes = kTensorCols * 2;
  auto storage = NewMemoryStorage();
  std::vector<SafetensorsTensor> tensors = {
      {"emb", DType::kUInt16, {kTensorRows, kTensorCols}, 0, kTensorRows * kRowBytes}};
  std::string bytes = EncodeSafetensorsHeader(tensors, {});
  for (uint64_t i = 0; i < kTensorRows * kTensorCols; ++i) {
    const uint16_t v = static_cast<uint16_t>(i);
    bytes.append(reinterpret_cast<const char*>(&v), 2);
  }
  SK_ASSERT_OK(storage->WriteAll("m/e.safetensors", bytes, false));
  SK_ASSERT_OK_AND_ASSIGN(auto reader,
                          CheckpointReader::OpenSafetensors(storage, "m/e.safetensors"));
  const uint64_t data_start = bytes.size() - kTensorRows * kRowBytes;
  const std::vector<ReadRequest> requests = {
      {0, DType::kUInt16, Box{{0, 0}, {kTensorRows, kTensorCols}}, nullptr},
      {0, DType::kUInt16, Box{{8, 4}, {8, 8}}, nullptr},    // rows 8-15
      {0, DType::kUInt32, Box{{16, 0}, {16, kTensorCols}}, nullptr}};  // a cast
  SK_ASSERT_OK_AND_ASSIGN(auto ranges, reader->Ranges("tensors", requests, Options()));
  ExpectSameRanges(ranges.at(0),
                   {{"m/e.safetensors", data_start, kTensorRows * kRowBytes, std::nullopt}});
  ExpectSameRanges(ranges.at(1),
                   {{"m/e.safetensors", data_start + 8 * kRowBytes, 8 * kRowBytes, std::nullopt}});
  ExpectSameRanges(ranges.at(2), {{"m/e.safetensors", data_start + 16 * kRowBytes,
                                   16 * kRowBytes, std::nullopt}});
}

TEST_F(ReaderRangesTest, NeedsNoDataFileWhileReadNamesTheMissingOne) {
  Save(Options());
  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage_, kPath));
  const Box box{{4, 0}, {2, kCols}};
  SK_ASSERT_OK_AND_ASSIGN(auto before, reader->Ranges("state", {RequestOf(box)}, Options()));
  // The file holding the box: which writer thread wrote it varies from run to run.
  ASSERT_FALSE(before.at(0).empty());
  const std::string missing = before.at(0).front().file;
  SK_ASSERT_OK(storage_->DeleteFile(missing));

  // A fresh reader, so that nothing of the data file is known.
  SK_ASSERT_OK_AND_ASSIGN(auto fresh, CheckpointReader::Open(storage_, kPath));
  SK_ASSERT_OK_AND_ASSIGN(auto after, fresh->Ranges("state", {RequestOf(box)}, Options()));
  ExpectSameRanges(after.at(0), before.at(0));
  ExpectSameRanges(after.at(0), ChunksTouching(box));

  std::vector<float> out(box.NumElements());
  Status read = fresh->Read(
      "state", {RequestOf(box, reinterpret_cast<uint8_t*>(out.data()))}, Options());
  EXPECT_EQ(read.code(), StatusCode::kNotFound) << read.ToString();
  EXPECT_NE(read.message().find(missing), std::string::npos) << read.ToString();
}

// What Ranges reports is all a Read needs: a copy of the checkpoint whose
// data files are zeros except those ranges reads the right values.
TEST_F(ReaderRangesTest, FetchingOnlyTheRangesIsEnoughToRead) {
  Save(SmallChunksInSeveralFiles());
  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage_, kPath));
  const Box top_left{{1, 2}, {4, 5}};
  const Box bottom{{9, 0}, {2, kCols}};
  SK_ASSERT_OK_AND_ASSIGN(
      auto ranges,
      reader->Ranges("state", {RequestOf(top_left), RequestOf(bottom)}, Options()));

  // Everything but the data files as saved; the data files as zeros.
  auto copy = NewMemoryStorage();
  for (const std::string file : {kPath + "/_SHARDKEEP", kPath + "/state/meta.json", kIndex}) {
    SK_ASSERT_OK_AND_ASSIGN(std::string bytes, storage_->ReadAll(file));
    SK_ASSERT_OK(copy->WriteAll(file, bytes, false));
  }
  SK_ASSERT_OK_AND_ASSIGN(auto data_files, storage_->List(kPath + "/state/data"));
  ASSERT_GT(data_files.size(), 1u);
  for (const std::string& name : data_files) {
    const std::string file = kPath + "/state/data/" + name;
    SK_ASSERT_OK_AND_ASSIGN(uint64_t size, storage_->FileSize(file));
    SK_ASSERT_OK(copy->WriteAll(file, std::string(size, '\0'), false));
  }
  // Then only the reported ranges, patched in.
  uint64_t fetched = 0;
  for (const auto& request_ranges : ranges) {
    for (const StoredRange& range : request_ranges) {
      SK_ASSERT_OK_AND_ASSIGN(std::string content, copy->ReadAll(range.file));
      SK_ASSERT_OK(storage_->ReadAt(range.file, range.offset, range.length,
                                    content.data() + range.offset));
      SK_ASSERT_OK(copy->WriteAll(range.file, content, false));
      fetched += range.length;
    }
  }
  ASSERT_LT(fetched, kRows * kCols * sizeof(float));  // not the whole leaf

  SK_ASSERT_OK_AND_ASSIGN(auto sparse, CheckpointReader::Open(copy, kPath));
  std::vector<float> a(top_left.NumElements()), b(bottom.NumElements());
  SK_ASSERT_OK(sparse->Read("state",
                            {RequestOf(top_left, reinterpret_cast<uint8_t*>(a.data())),
                             RequestOf(bottom, reinterpret_cast<uint8_t*>(b.data()))},
                            Options()));
  for (uint64_t r = 0; r < 4; ++r) {
    for (uint64_t c = 0; c < 5; ++c) {
      EXPECT_EQ(a[r * 5 + c], w_[(1 + r) * kCols + 2 + c]) << r << "," << c;
    }
  }
  EXPECT_TRUE(std::equal(b.begin(), b.end(), w_.begin() + 9 * kCols));
  // The copy really is sparse: a row fetched by neither request fails its
  // checksum.
  std::vector<float> row(kCols);
  Status unfetched = sparse->Read(
      "state", {RequestOf(Box{{7, 0}, {1, kCols}}, reinterpret_cast<uint8_t*>(row.data()))},
      Options());
  EXPECT_EQ(unfetched.code(), StatusCode::kCorruption) << unfetched.ToString();
}

}  // namespace
}  // namespace shardkeep

// The reader against hostile checkpoints: files whose every checksum is
// right but whose sizes, chunks or tree lie. Each must be refused with a
// Corruption error naming the file, never read out of bounds.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <chrono>
#include <algorithm>
#include <atomic>
#include <numeric>

#include "format/checkpointable_meta.h"
#include "format/commit_record.h"
#include "format/index.h"
#include "shardkeep/checkpoint.h"
#include "storage/fault_injection.h"
#include "testing/forged_checkpoint.h"
#include "testing/payloads.h"
#include "testing/status_matchers.h"

namespace shardkeep {
namespace {

const std::string kPath = "root/ckpt";
constexpr uint64_t kRows = 12, kCols = 10;

void ExpectCorruption(const Status& status, const std::vector<std::string>& parts) {
  EXPECT_EQ(status.code(), StatusCode::kCorruption) << status.ToString();
  for (const std::string& part : parts) {
    EXPECT_NE(status.message().find(part), std::string::npos)
        << "'" << part << "' not in: " << status.message();
  }
}

// Writes a committed single-process checkpoint with one pytree
// checkpointable "state" whose files are exactly these, bypassing the
// writer as a hostile producer would.
void WriteCheckpoint(Storage& storage, const std::string& meta_json,
                     const std::vector<format::ChunkRecord>& records,
                     const std::string& data) {
  format::CommitRecord commit;
  commit.checkpointables = {format::ListCheckpointable("state", "pytree", meta_json, "")};
  commit.index_files["state"] = {format::IndexFileName(0)};
  SK_ASSERT_OK(storage.CreateDir(kPath + "/state/index"));
  SK_ASSERT_OK(storage.CreateDir(kPath + "/state/data"));
  SK_ASSERT_OK(storage.WriteAll(kPath + "/state/meta.json", meta_json, false));
  SK_ASSERT_OK(storage.WriteAll(kPath + "/state/" + format::IndexFileName(0),
                                format::EncodeIndex(records), false));
  SK_ASSERT_OK(storage.WriteAll(kPath + "/state/" + format::DataFileName(0, 0), data, false));
  SK_ASSERT_OK(storage.WriteAll(kPath + "/" + format::kCommitFileName,
                                format::EncodeCommitRecord(commit), false));
}

// Defect: 2^61 float64 elements are 2^64 bytes, which wrapped to 0, so a
// zero-length record with the checksum of empty input passed every check
// and a read of two elements copied 16 bytes out of a 0-byte buffer.
TEST(ReaderHostile, HugeLeafWithEmptyRecordIsCorruption) {
  auto storage = NewMemoryStorage();
  const uint64_t huge = uint64_t{1} << 61;
  format::ChunkRecord record;
  record.box = Box{{0}, {huge}};
  record.checksum = ChunkChecksum("", 0);
  WriteCheckpoint(*storage, testdata::PytreeMetaJson({{"w", "float64", {huge}}}),
                  {record}, "");
  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage, kPath));
  ExpectCorruption(reader->MetaJson("state").status(),
                   {kPath + "/state/meta.json", "leaf 0 (\"w\")", "2^63 bytes"});
  double out[2] = {-1, -1};
  Status read = reader->Read(
      "state", {{0, DType::kFloat64, Box{{0}, {2}}, reinterpret_cast<uint8_t*>(out)}},
      Options());
  ExpectCorruption(read, {"meta.json", "2^63 bytes"});
}

// Saves the rows x cols float32 leaf "w" at kPath in chunks of
// `block_rows` rows (one data file: one writer thread).
Status SaveInRowBlocks(const std::shared_ptr<Storage>& storage, const std::vector<float>& w,
                       uint64_t rows, uint64_t cols, uint64_t block_rows) {
  SaveRequest request;
  request.path = kPath;
  CheckpointablePayload part =
      testdata::PytreePayload("state", {{"w", "float32", {rows, cols}}});
  for (uint64_t r = 0; r < rows; r += block_rows) {
    part.shards.push_back({0, DType::kFloat32, Box{{r, 0}, {block_rows, cols}},
                           reinterpret_cast<const uint8_t*>(w.data() + r * cols)});
  }
  request.parts.push_back(std::move(part));
  Options options;
  options.io_threads = 1;
  return Save(storage, NewSingleProcessCoordinator(), std::move(request), options);
}

// A real save of a 12x10 float32 leaf as four row blocks, one chunk each.
class ReaderChunksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::iota(w_.begin(), w_.end(), 0.5f);
    SK_ASSERT_OK(SaveInRowBlocks(storage_, w_, kRows, kCols, 3));
    SK_ASSERT_OK_AND_ASSIGN(std::string bytes, storage_->ReadAll(index_file_));
    SK_ASSERT_OK_AND_ASSIGN(records_, format::DecodeIndex(bytes, index_file_));
    ASSERT_EQ(records_.size(), 4u);
  }

  void RewriteIndex() {
    SK_ASSERT_OK(storage_->WriteAll(index_file_, format::EncodeIndex(records_), false));
  }

  Status ReadAll(const Box& box = Box{{0, 0}, {kRows, kCols}}) {
    SK_ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(storage_, kPath));
    std::vector<float> out(box.NumElements(), -1.f);
    return reader->Read(
        "state", {{0, DType::kFloat32, box, reinterpret_cast<uint8_t*>(out.data())}},
        Options());
  }

  std::shared_ptr<Storage> storage_ = NewMemoryStorage();
  const std::string index_file_ = kPath + "/state/index/p0.idx";
  std::vector<float> w_ = std::vector<float>(kRows * kCols);
  std::vector<format::ChunkRecord> records_;
};

TEST_F(ReaderChunksTest, IntactCheckpointReads) { SK_EXPECT_OK(ReadAll()); }

// Defect: coverage was checked by adding element counts, so a duplicated
// record made up for a missing one and rows 9-11 were never written.
TEST_F(ReaderChunksTest, DuplicatedPlusMissingRecordIsCorruption) {
  auto block = [](const format::ChunkRecord& r) { return r.box.origin[0]; };
  std::sort(records_.begin(), records_.end(),
            [&](const auto& a, const auto& b) { return block(a) < block(b); });
  records_[3] = records_[1];  // rows 3-5 twice, rows 9-11 never
  RewriteIndex();
  ExpectCorruption(ReadAll(), {"leaf 'w'", "[3:6, 0:10]", index_file_, "overlaps"});
  // Locate checks the same, before any caller maps a file.
  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage_, kPath));
  ExpectCorruption(
      reader->Locate("state", {{0, DType::kFloat32, Box{{0, 0}, {3, kCols}}, nullptr}},
                     Options())
          .status(),
      {"leaf 'w'", "overlaps"});
}

TEST_F(ReaderChunksTest, MissingRecordIsCorruptionNamingTheIndexFiles) {
  records_.pop_back();
  RewriteIndex();
  ExpectCorruption(ReadAll(), {"leaf 'w'", index_file_, "cover 90 of its 120 elements"});
}

// A chunk whose stored bytes would lie past the end of its data file is
// refused before a buffer is sized by its length.
TEST_F(ReaderChunksTest, ChunkPastTheEndOfItsFileIsCorruption) {
  SK_ASSERT_OK(storage_->WriteAll(kPath + "/state/data/p0-0.bin", "short", false));
  // Part of a chunk: read through a buffer, not straight into place.
  ExpectCorruption(ReadAll(Box{{0, 0}, {2, kCols}}),
                   {"p0-0.bin", "past the end of the file (5 bytes)"});
}

// Defect: the tree was not checked, so a repeated leaf number loaded one
// leaf's values in two places. MetaJson hands out only checked documents.
TEST_F(ReaderChunksTest, InvalidTreeIsCorruptionNamingTheNode) {
  const std::string meta_file = kPath + "/state/meta.json";
  SK_ASSERT_OK_AND_ASSIGN(std::string text, storage_->ReadAll(meta_file));
  nlohmann::json meta = nlohmann::json::parse(text);
  meta["tree"]["keys"].push_back("again");
  meta["tree"]["children"].push_back({{"type", "leaf"}, {"leaf", 0}});
  SK_ASSERT_OK(storage_->WriteAll(meta_file, meta.dump(), false));
  SK_ASSERT_OK(testdata::RelistCheckpointFiles(*storage_, kPath));
  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage_, kPath));
  ExpectCorruption(reader->MetaJson("state").status(),
                   {meta_file, "tree node /tree/children/1", "leaf 0 is already used"});
  ExpectCorruption(ReadAll(), {meta_file, "tree node"});
}

// The format-compatibility checkpoints (cpp/testdata/compat, written by
// four processes; python/tests/test_compat_checkpoints.py checks their
// values): the raw and the zstd one hold the same leaves, which must read
// back identically, every chunk verified.
class ReaderCompat : public ::testing::TestWithParam<std::string> {};

TEST_P(ReaderCompat, RawAndZstdCheckpointsReadTheSame) {
  auto storage = NewFileStorage();
  const std::string root = std::string(SHARDKEEP_TESTDATA_DIR) + "/compat/" + GetParam() + "/";
  SK_ASSERT_OK_AND_ASSIGN(auto raw, CheckpointReader::Open(storage, root + "raw"));
  SK_ASSERT_OK_AND_ASSIGN(auto zstd, CheckpointReader::Open(storage, root + "zstd"));
  SK_ASSERT_OK_AND_ASSIGN(std::string text, raw->MetaJson("state"));
  SK_ASSERT_OK_AND_ASSIGN(auto meta, format::DecodeCheckpointableMeta(text, "meta.json"));
  int arrays = 0;
  for (uint32_t leaf = 0; leaf < meta.leaves.size(); ++leaf) {
    const format::LeafMeta& spec = meta.leaves[leaf];
    if (spec.kind != format::LeafKind::kArray) continue;
    SCOPED_TRACE(spec.path);
    SK_ASSERT_OK_AND_ASSIGN(DType dtype, DTypeFromName(spec.dtype));
    const Box box{std::vector<uint64_t>(spec.shape.size(), 0), spec.shape};
    std::vector<uint8_t> a(*CheckedByteSize(spec.shape, DTypeSize(dtype)), 0xAA);
    std::vector<uint8_t> b(a.size(), 0x55);
    SK_ASSERT_OK(raw->Read("state", {{leaf, dtype, box, a.data()}}, Options()));
    SK_ASSERT_OK(zstd->Read("state", {{leaf, dtype, box, b.data()}}, Options()));
    EXPECT_EQ(a, b);
    ++arrays;
  }
  EXPECT_GE(arrays, 26);  // one per dtype, and more
  SK_ASSERT_OK_AND_ASSIGN(std::string blob, zstd->ReadValue("blob"));
  EXPECT_EQ(blob.size(), 256u + 9u);
}

// Every format version's compatibility checkpoints.
INSTANTIATE_TEST_SUITE_P(Versions, ReaderCompat, ::testing::Values("v1", "v2"));

// A storage far away (S3) asks for more reads in flight than cores; the
// reader follows its hint unless Options::io_threads says otherwise.
TEST(ReaderParallelism, FollowsTheStoragesHintForReadsInFlight) {
  constexpr uint64_t kRowsHere = 24, kColsHere = 256;
  std::vector<float> w(kRowsHere * kColsHere, 1.5f);
  auto base = NewMemoryStorage();
  SK_ASSERT_OK(SaveInRowBlocks(base, w, kRowsHere, kColsHere, 2));

  auto storage = std::make_shared<FaultInjectionStorage>(base);
  StorageFeatures features = base->features();
  features.parallel_reads = 6;
  storage->OverrideFeatures(features);
  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0, peak = 0, awaited = 0;
  storage->FailOn([&](std::string_view op, const std::string&) {
    if (op != "ReadAt") return Status::Ok();
    std::unique_lock<std::mutex> lock(mu);
    peak = std::max(peak, ++in_flight);
    cv.notify_all();
    // Hold each read until `awaited` are in flight (or long enough that
    // fewer are coming).
    cv.wait_for(lock, std::chrono::seconds(2), [&] { return in_flight >= awaited; });
    --in_flight;
    return Status::Ok();
  });
  auto read_with = [&](int io_threads, int expected_in_flight) {
    awaited = expected_in_flight;
    Options options;
    options.io_threads = io_threads;
    options.coalesce_gap_bytes = 0;
    peak = 0;
    SK_ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(storage, kPath));
    std::vector<float> out(w.size(), -1.f);
    SK_RETURN_IF_ERROR(reader->Read(
        "state",
        {{0, DType::kFloat32, Box{{0, 0}, {kRowsHere, kColsHere}},
          reinterpret_cast<uint8_t*>(out.data())}},
        options));
    EXPECT_EQ(out, w);
    return Status::Ok();
  };
  SK_ASSERT_OK(read_with(0, 6));
  EXPECT_EQ(peak, 6);
  SK_ASSERT_OK(read_with(1, 1));
  EXPECT_EQ(peak, 1);
}

// Where a request costs more than a copy (S3), chunks that could each be
// read straight into place are fetched together and copied out instead.
TEST(ReaderRequests, SmallDirectReadsMergeWhereTheStorageAsks) {
  constexpr uint64_t kRowsHere = 24, kColsHere = 256;
  std::vector<float> w(kRowsHere * kColsHere);
  std::iota(w.begin(), w.end(), 0.25f);
  auto base = NewMemoryStorage();
  SK_ASSERT_OK(SaveInRowBlocks(base, w, kRowsHere, kColsHere, 2));

  auto reads_with = [&](uint64_t min_efficient_read_bytes) -> Result<int> {
    auto storage = std::make_shared<FaultInjectionStorage>(base);
    StorageFeatures features = base->features();
    features.min_efficient_read_bytes = min_efficient_read_bytes;
    storage->OverrideFeatures(features);
    std::atomic<int> reads{0};
    storage->FailOn([&](std::string_view op, const std::string&) {
      if (op == "ReadAt") ++reads;
      return Status::Ok();
    });
    SK_ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(storage, kPath));
    std::vector<float> out(w.size(), -1.f);
    SK_RETURN_IF_ERROR(reader->Read(
        "state",
        {{0, DType::kFloat32, Box{{0, 0}, {kRowsHere, kColsHere}},
          reinterpret_cast<uint8_t*>(out.data())}},
        Options()));
    EXPECT_EQ(out, w);
    return reads.load();
  };
  SK_ASSERT_OK_AND_ASSIGN(int straight_into_place, reads_with(0));
  EXPECT_EQ(straight_into_place, 12);
  SK_ASSERT_OK_AND_ASSIGN(int merged, reads_with(5 << 10));  // 3 chunks, then a new range
  EXPECT_EQ(merged, 4);
  SK_ASSERT_OK_AND_ASSIGN(int one_request, reads_with(1 << 20));
  EXPECT_EQ(one_request, 1);
}

}  // namespace
}  // namespace shardkeep

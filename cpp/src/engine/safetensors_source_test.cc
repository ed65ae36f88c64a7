// CheckpointReader::OpenSafetensors on a file of the safetensors library
// and on an index of several files: the tensors read as leaves, by box and
// with casts, through the reader's own planner.
#include "engine/safetensors_source.h"

#include <gtest/gtest.h>

#include <atomic>

#include "shardkeep/safetensors.h"
#include "shardkeep/checkpoint.h"
#include "storage/fault_injection.h"
#include "testing/status_matchers.h"
#include "testing/storage_conformance.h"

namespace shardkeep {
namespace {

const std::string kTestdata = std::string(SHARDKEEP_TESTDATA_DIR) + "/safetensors";

TEST(OpenSafetensors, ReadsTheLibrarysFileByBoxAndWithACast) {
  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::OpenSafetensors(
                                           NewFileStorage(), kTestdata + "/small.safetensors"));
  EXPECT_EQ(reader->Info().checkpointables.at(0).name, "tensors");
  SK_ASSERT_OK_AND_ASSIGN(PytreeInfo tree, reader->Pytree("tensors"));
  ASSERT_EQ(tree.leaves.size(), 3u);
  const LeafInfo* embed = tree.Find("embed.weight");
  ASSERT_NE(embed, nullptr);
  EXPECT_EQ(embed->shape, (std::vector<uint64_t>{3, 4}));
  // The file holds arange(12) as float32 3x4: row 1, as float64.
  std::vector<double> row(4);
  SK_ASSERT_OK(reader->ReadLeaf("tensors", "embed.weight", DType::kFloat64, row.data(),
                                Options(), Box{{1, 0}, {1, 4}}));
  EXPECT_EQ(row, (std::vector<double>{4, 5, 6, 7}));
  std::vector<int16_t> bias(3);
  SK_ASSERT_OK(reader->ReadLeaf("tensors", "layers.0.bias", DType::kInt16, bias.data(),
                                Options()));
  EXPECT_EQ(bias, (std::vector<int16_t>{1, -2, 3}));
  ReadRequest whole{embed->index, DType::kFloat32, Box{{0, 0}, {3, 4}}, nullptr};
  SK_ASSERT_OK_AND_ASSIGN(auto ranges, reader->Locate("tensors", {whole}, Options()));
  ASSERT_TRUE(ranges[0].has_value());
  EXPECT_EQ(ranges[0]->file, kTestdata + "/small.safetensors");
  EXPECT_EQ(ranges[0]->length, 48u);
  EXPECT_FALSE(ranges[0]->checksum.has_value());  // safetensors has none
}

class SafetensorsIndexTest : public ::testing::Test {
 protected:
  void Write(const std::string& file, std::vector<SafetensorsTensor> tensors) {
    std::string bytes = EncodeSafetensorsHeader(tensors, {});
    for (const auto& t : tensors) bytes.append(t.length, static_cast<char>(t.name[0]));
    SK_ASSERT_OK(storage_->WriteAll("m/" + file, bytes, false));
  }
  std::shared_ptr<Storage> storage_ = NewMemoryStorage();
};

TEST_F(SafetensorsIndexTest, AnIndexJoinsItsFiles) {
  Write("a.safetensors", {{"a", DType::kUInt8, {2}, 0, 2}});
  Write("b.safetensors", {{"b", DType::kUInt8, {3}, 0, 3}});
  SK_ASSERT_OK(storage_->WriteAll(
      "m/index.json", R"({"weight_map": {"a": "a.safetensors", "b": "b.safetensors"}})", false));
  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::OpenSafetensors(storage_, "m/index.json"));
  std::vector<uint8_t> b(3);
  SK_ASSERT_OK(reader->ReadLeaf("tensors", "b", DType::kUInt8, b.data(), Options()));
  EXPECT_EQ(b, (std::vector<uint8_t>{'b', 'b', 'b'}));
  // The folder gives the same tensors.
  SK_ASSERT_OK_AND_ASSIGN(auto folder, CheckpointReader::OpenSafetensors(storage_, "m"));
  SK_ASSERT_OK_AND_ASSIGN(PytreeInfo tree, folder->Pytree("tensors"));
  EXPECT_EQ(tree.leaves.size(), 2u);
}

// Counts the bytes read through ReadAt; everything else goes to `base`.
class ReadCountingStorage final : public Storage {
 public:
  explicit ReadCountingStorage(std::shared_ptr<Storage> base) : base_(std::move(base)) {}
  std::atomic<uint64_t> bytes_read{0};
  StorageFeatures features() const override { return base_->features(); }
  Status ReadAt(const std::string& p, uint64_t o, uint64_t n, void* d) override {
    bytes_read += n;
    return base_->ReadAt(p, o, n, d);
  }
  Result<std::string> ReadAll(const std::string& p) override { return base_->ReadAll(p); }
  Result<uint64_t> FileSize(const std::string& p) override { return base_->FileSize(p); }
  Status WriteAll(const std::string& p, std::string_view d, bool s) override {
    return base_->WriteAll(p, d, s);
  }
  Result<std::unique_ptr<WritableFile>> OpenForAppend(const std::string& p) override {
    return base_->OpenForAppend(p);
  }
  Result<bool> Exists(const std::string& p) override { return base_->Exists(p); }
  Result<std::vector<std::string>> List(const std::string& d) override { return base_->List(d); }
  Status CreateDir(const std::string& d) override { return base_->CreateDir(d); }
  Status DeleteFile(const std::string& p) override { return base_->DeleteFile(p); }
  Status DeleteRecursive(const std::string& p) override { return base_->DeleteRecursive(p); }
  Status Rename(const std::string& f, const std::string& t) override {
    return base_->Rename(f, t);
  }
  Status SyncDir(const std::string& d) override { return base_->SyncDir(d); }

 private:
  std::shared_ptr<Storage> base_;
};

// A box of a large tensor reads only the rows that hold it, not the whole
// tensor: one process's shard of an embedding costs its share.
TEST_F(SafetensorsIndexTest, ABoxReadsOnlyTheRowsHoldingIt) {
  constexpr uint64_t kRows = 64, kCols = 32;
  std::vector<SafetensorsTensor> tensors = {{"emb", DType::kUInt16, {kRows, kCols}, 0,
                                             kRows * kCols * 2}};
  std::string bytes = EncodeSafetensorsHeader(tensors, {});
  for (uint64_t i = 0; i < kRows * kCols; ++i) {
    const uint16_t v = static_cast<uint16_t>(i);
    bytes.append(reinterpret_cast<const char*>(&v), 2);
  }
  SK_ASSERT_OK(storage_->WriteAll("m/e.safetensors", bytes, false));
  auto counting = std::make_shared<ReadCountingStorage>(storage_);
  SK_ASSERT_OK_AND_ASSIGN(auto reader,
                          CheckpointReader::OpenSafetensors(counting, "m/e.safetensors"));
  const uint64_t header_bytes = counting->bytes_read;
  // Rows 8..15, columns 4..11: the slab of rows 8..15 is read, 1/8 of it.
  std::vector<uint16_t> box(8 * 8);
  SK_ASSERT_OK(reader->ReadLeaf("tensors", "emb", DType::kUInt16, box.data(), Options(),
                                Box{{8, 4}, {8, 8}}));
  EXPECT_EQ(counting->bytes_read - header_bytes, 8 * kCols * 2);
  EXPECT_EQ(box[0], 8 * kCols + 4);
  EXPECT_EQ(box[63], 15 * kCols + 11);
  // Two boxes of the same rows share one read.
  std::vector<uint16_t> left(8 * 4), right(8 * 4);
  const uint64_t before = counting->bytes_read;
  SK_ASSERT_OK(reader->Read("tensors",
                            {{0, DType::kUInt16, Box{{16, 0}, {8, 4}},
                              reinterpret_cast<uint8_t*>(left.data())},
                             {0, DType::kUInt16, Box{{16, 28}, {8, 4}},
                              reinterpret_cast<uint8_t*>(right.data())}},
                            Options()));
  EXPECT_EQ(counting->bytes_read - before, 8 * kCols * 2);
  EXPECT_EQ(right[3], 16 * kCols + 31);
}

// The 2x4 boxes of a row-major tensor are not contiguous in its file: on a
// file system each row of each box is read straight into place (one
// vectored read per slab of rows), the columns no box wants are skipped,
// and boxes that overlap go through a buffer instead.
class ScatteredReadTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kRows = 16, kCols = 1024;  // a box's row: 512 bytes

  void SetUp() override {
    std::vector<SafetensorsTensor> tensors = {
        {"w", DType::kUInt16, {kRows, kCols}, 0, kRows * kCols * 2}};
    std::string bytes = EncodeSafetensorsHeader(tensors, {});
    for (uint64_t i = 0; i < kRows * kCols; ++i) {
      const uint16_t v = static_cast<uint16_t>(i * 7);
      bytes.append(reinterpret_cast<const char*>(&v), 2);
    }
    file_ = MakeTempDir() + "/w.safetensors";
    SK_ASSERT_OK(storage_->WriteAll(file_, bytes, false));
  }

  // Reads `boxes`, each into its own buffer, and checks every element.
  // Counts the plain reads of the data (not of the header) in data_reads_.
  void ReadAndCheck(const std::vector<Box>& boxes) {
    SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::OpenSafetensors(storage_, file_));
    const int header_reads = storage_->Count("ReadAt");
    std::vector<std::vector<uint16_t>> out;
    std::vector<ReadRequest> requests;
    for (const Box& box : boxes) out.emplace_back(box.NumElements(), 0xffff);
    for (size_t i = 0; i < boxes.size(); ++i) {
      requests.push_back({0, DType::kUInt16, boxes[i], reinterpret_cast<uint8_t*>(out[i].data())});
    }
    Options options;
    options.io_threads = 2;
    SK_ASSERT_OK(reader->Read("tensors", requests, options));
    data_reads_ = storage_->Count("ReadAt") - header_reads;
    for (size_t i = 0; i < boxes.size(); ++i) {
      const Box& box = boxes[i];
      for (uint64_t r = 0; r < box.shape[0]; ++r) {
        for (uint64_t c = 0; c < box.shape[1]; ++c) {
          const uint64_t at = (box.origin[0] + r) * kCols + box.origin[1] + c;
          ASSERT_EQ(out[i][r * box.shape[1] + c], static_cast<uint16_t>(at * 7))
              << "box " << box.ToString() << " at (" << r << ", " << c << ")";
        }
      }
    }
  }

  static Box Block(uint64_t row_block, uint64_t col_block) {
    return Box{{row_block * kRows / 2, col_block * kCols / 4}, {kRows / 2, kCols / 4}};
  }

  std::shared_ptr<FaultInjectionStorage> storage_ =
      std::make_shared<FaultInjectionStorage>(NewFileStorage());
  std::string file_;
  int data_reads_ = 0;
};

TEST_F(ScatteredReadTest, TwoByFourBoxesAreReadIntoPlace) {
  std::vector<Box> boxes;
  for (uint64_t r = 0; r < 2; ++r) {
    for (uint64_t c = 0; c < 4; ++c) boxes.push_back(Block(r, c));
  }
  ReadAndCheck(boxes);
  EXPECT_EQ(storage_->Count("ReadScatter"), 2);  // one per slab of rows
  EXPECT_EQ(data_reads_, 0);
}

TEST_F(ScatteredReadTest, ColumnsNoBoxWantsAreSkipped) {
  ReadAndCheck({Block(0, 0), Block(0, 2), Block(1, 3)});
  EXPECT_EQ(storage_->Count("ReadScatter"), 2);
}

TEST_F(ScatteredReadTest, OverlappingBoxesAndShortRowsGoThroughABuffer) {
  ReadAndCheck({Block(0, 1), Block(0, 1)});  // a replicated box
  EXPECT_EQ(data_reads_, 1);
  ReadAndCheck({Box{{0, 0}, {kRows, 100}}});  // rows of 200 bytes
  EXPECT_EQ(data_reads_, 1);
  EXPECT_EQ(storage_->Count("ReadScatter"), 0);
}

TEST_F(SafetensorsIndexTest, BadIndexesAndDuplicatesAreNamed) {
  Write("a.safetensors", {{"a", DType::kUInt8, {2}, 0, 2}});
  Write("a2.safetensors", {{"a", DType::kUInt8, {2}, 0, 2}});
  SK_ASSERT_OK(storage_->WriteAll("m/twice.json",
                                  R"({"weight_map": {"a": "a.safetensors", "x": "a2.safetensors"}})",
                                  false));
  Status twice = CheckpointReader::OpenSafetensors(storage_, "m/twice.json").status();
  EXPECT_EQ(twice.code(), StatusCode::kCorruption);
  EXPECT_NE(twice.message().find("in both"), std::string::npos) << twice.message();
  SK_ASSERT_OK(storage_->WriteAll("m/wrong.json", R"({"weight_map": {"a": "b.safetensors"}})",
                                  false));
  EXPECT_EQ(CheckpointReader::OpenSafetensors(storage_, "m/wrong.json").status().code(),
            StatusCode::kNotFound);  // b.safetensors does not exist
  SK_ASSERT_OK(storage_->WriteAll("m/escape.json", R"({"weight_map": {"a": "../a.safetensors"}})",
                                  false));
  Status escape = CheckpointReader::OpenSafetensors(storage_, "m/escape.json").status();
  EXPECT_EQ(escape.code(), StatusCode::kCorruption);
  EXPECT_NE(escape.message().find("file name"), std::string::npos) << escape.message();
  EXPECT_EQ(CheckpointReader::OpenSafetensors(storage_, "m/none").status().code(),
            StatusCode::kNotFound);
}

}  // namespace
}  // namespace shardkeep

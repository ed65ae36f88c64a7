// CheckpointReader::OpenSafetensors on a file of the safetensors library
// and on an index of several files: the tensors read as leaves, by box and
// with casts, through the reader's own planner.
#include "engine/safetensors_source.h"

#include <gtest/gtest.h>

#include "shardkeep/safetensors.h"
#include "shardkeep/checkpoint.h"
#include "testing/status_matchers.h"

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

// CheckpointReader's plain view of a checkpoint: Info(), Pytree() and
// ReadLeaf() by key path.
#include <gtest/gtest.h>

#include <numeric>

#include "shardkeep/checkpoint.h"
#include "testing/payloads.h"
#include "testing/status_matchers.h"

namespace shardkeep {
namespace {

class ContentsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    storage_ = NewMemoryStorage();
    std::iota(w_.begin(), w_.end(), 1.0f);
    SaveRequest request;
    request.path = "ckpt";
    request.step = 42;
    request.custom_metadata_json = R"({"model": "tiny"})";
    request.metrics_json = R"({"loss": 0.5})";
    CheckpointablePayload part = testdata::PytreePayload(
        "state", {{"params/w", "float32", {4, 3}}, {"params/a~1b", "int32", {}}});
    part.shards.push_back({0, DType::kFloat32, Box{{0, 0}, {2, 3}},
                           reinterpret_cast<const uint8_t*>(w_.data())});
    part.shards.push_back({0, DType::kFloat32, Box{{2, 0}, {2, 3}},
                           reinterpret_cast<const uint8_t*>(w_.data() + 6)});
    part.shards.push_back({1, DType::kInt32, Box{{}, {}},
                           reinterpret_cast<const uint8_t*>(&count_)});
    request.parts.push_back(std::move(part));
    request.parts.push_back(testdata::BytesPayload("tokenizer", "vocab"));
    SK_ASSERT_OK(Save(storage_, nullptr, std::move(request), Options()));
    SK_ASSERT_OK_AND_ASSIGN(reader_, CheckpointReader::Open(storage_, "ckpt"));
  }

  std::shared_ptr<Storage> storage_;
  std::vector<float> w_ = std::vector<float>(12);
  int32_t count_ = 7;
  std::unique_ptr<CheckpointReader> reader_;
};

TEST_F(ContentsTest, InfoHoldsTheCommitRecord) {
  const CheckpointInfo& info = reader_->Info();
  EXPECT_EQ(info.step, 42);
  EXPECT_EQ(info.process_count, 1);
  EXPECT_GT(info.committed_ns, 0);
  EXPECT_LE(info.created_ns, info.committed_ns);
  ASSERT_EQ(info.checkpointables.size(), 2u);
  EXPECT_EQ(info.checkpointables[0].name, "state");
  EXPECT_EQ(info.checkpointables[0].kind, "pytree");
  EXPECT_EQ(info.checkpointables[1].kind, "bytes");
  EXPECT_EQ(info.custom_metadata_json, R"({"model":"tiny"})");
  EXPECT_EQ(info.metrics_json, R"({"loss":0.5})");
}

TEST_F(ContentsTest, PytreeListsLeavesWithStoredBytes) {
  SK_ASSERT_OK_AND_ASSIGN(PytreeInfo tree, reader_->Pytree("state"));
  ASSERT_EQ(tree.leaves.size(), 2u);
  const LeafInfo* w = tree.Find("params/w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->index, 0u);
  EXPECT_EQ(w->kind, LeafKind::kArray);
  EXPECT_EQ(w->dtype, DType::kFloat32);
  EXPECT_EQ(w->shape, (std::vector<uint64_t>{4, 3}));
  EXPECT_EQ(w->nbytes(), 48u);
  EXPECT_EQ(tree.stored_bytes[0], 48u);  // raw chunks
  EXPECT_EQ(tree.Find("params/missing"), nullptr);
  EXPECT_NE(tree.tree_json.find("\"leaf\""), std::string::npos);
}

TEST_F(ContentsTest, ReadLeafByPathWholeBoxOrCast) {
  std::vector<float> whole(12);
  SK_ASSERT_OK(reader_->ReadLeaf("state", "params/w", DType::kFloat32, whole.data(),
                                 Options()));
  EXPECT_EQ(whole, w_);
  std::vector<double> row(3);
  SK_ASSERT_OK(reader_->ReadLeaf("state", "params/w", DType::kFloat64, row.data(),
                                 Options(), Box{{3, 0}, {1, 3}}));
  EXPECT_EQ(row, (std::vector<double>{10, 11, 12}));
  int32_t count = 0;
  SK_ASSERT_OK(reader_->ReadLeaf("state", EscapeKey("a/b").insert(0, "params/"),
                                 DType::kInt32, &count, Options()));
  EXPECT_EQ(count, 7);
}

TEST_F(ContentsTest, ErrorsNameWhatIsMissing) {
  float x;
  Status missing = reader_->ReadLeaf("state", "params/v", DType::kFloat32, &x, Options());
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_NE(missing.ToString().find("params/v"), std::string::npos);
  EXPECT_EQ(reader_->Pytree("tokenizer").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(reader_->Pytree("nope").status().code(), StatusCode::kNotFound);
}

TEST(KeyEscaping, RoundTripsSlashesAndTildes) {
  EXPECT_EQ(EscapeKey("a/b~c"), "a~1b~0c");
  EXPECT_EQ(UnescapeKey("a~1b~0c"), "a/b~c");
  EXPECT_EQ(UnescapeKey(EscapeKey("~1/~0")), "~1/~0");
}

}  // namespace
}  // namespace shardkeep

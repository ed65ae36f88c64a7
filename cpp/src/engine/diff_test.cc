// DiffCheckpoints: every kind of change, and chunks decided by their
// checksums without being read.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "shardkeep/checkpoint.h"
#include "shardkeep/diff.h"
#include "testing/payloads.h"
#include "testing/status_matchers.h"

namespace shardkeep {
namespace {

constexpr uint64_t kRows = 8, kCols = 16;

struct Tree {
  std::vector<float> w = std::vector<float>(kRows * kCols);
  std::vector<int32_t> n = {1, 2, 3};
  std::string w_dtype = "float32";
  bool with_n = true;
  std::string note = "{\"lr\": 0.1}";
  Tree() { std::iota(w.begin(), w.end(), 0.5f); }
};

class DiffTest : public ::testing::Test {
 protected:
  Status Save(const std::string& path, const Tree& tree) {
    SaveRequest request;
    request.path = path;
    std::vector<testdata::ArrayLeaf> leaves = {{"w", tree.w_dtype, {kRows, kCols}}};
    if (tree.with_n) leaves.push_back({"n", "int32", {3}});
    CheckpointablePayload part = testdata::PytreePayload("state", leaves);
    const DType w_dtype = tree.w_dtype == "float32" ? DType::kFloat32 : DType::kInt32;
    for (uint64_t r = 0; r < kRows; r += 2) {  // four shards of two rows
      part.shards.push_back({0, w_dtype, Box{{r, 0}, {2, kCols}},
                             reinterpret_cast<const uint8_t*>(tree.w.data() + r * kCols)});
    }
    if (tree.with_n) {
      part.shards.push_back({1, DType::kInt32, Box{{0}, {3}},
                             reinterpret_cast<const uint8_t*>(tree.n.data())});
    }
    request.parts.push_back(std::move(part));
    CheckpointablePayload note;
    note.name = "config";
    note.kind = "json";
    note.meta_json = "{\"kind\": \"json\"}";
    note.value = tree.note;
    request.parts.push_back(std::move(note));
    Options options;
    options.chunk_bytes = 2 * kCols * sizeof(float);  // one chunk per shard
    return shardkeep::Save(storage_, nullptr, std::move(request), options);
  }

  Result<DiffReport> Diff() { return DiffCheckpoints(storage_, "a", storage_, "b"); }

  static const LeafDiff& Leaf(const DiffReport& report, const std::string& path) {
    for (const LeafDiff& leaf : report.leaves) {
      if (leaf.path == path) return leaf;
    }
    ADD_FAILURE() << "no leaf " << path;
    return report.leaves.front();
  }

  std::shared_ptr<Storage> storage_ = NewMemoryStorage();
};

TEST_F(DiffTest, IdenticalCheckpointsAreDecidedFromTheIndexes) {
  SK_ASSERT_OK(Save("a", Tree()));
  SK_ASSERT_OK(Save("b", Tree()));
  SK_ASSERT_OK_AND_ASSIGN(DiffReport report, Diff());
  EXPECT_TRUE(report.identical());
  ASSERT_EQ(report.leaves.size(), 3u);  // w, n, config
  EXPECT_EQ(Leaf(report, "w").bytes_read, 0u);
  EXPECT_EQ(Leaf(report, "n").bytes_read, 0u);
}

TEST_F(DiffTest, AChangedElementIsCountedAndMeasured) {
  SK_ASSERT_OK(Save("a", Tree()));
  Tree changed;
  changed.w[5 * kCols + 3] += 2.0f;   // row 5: the third shard's chunk
  changed.w[5 * kCols + 4] *= 1.5f;
  SK_ASSERT_OK(Save("b", changed));
  SK_ASSERT_OK_AND_ASSIGN(DiffReport report, Diff());
  EXPECT_FALSE(report.identical());
  const LeafDiff& w = Leaf(report, "w");
  EXPECT_EQ(w.change, LeafChange::kDiffers);
  EXPECT_EQ(w.differing_elements, 2u);
  const float before = Tree().w[5 * kCols + 4];
  EXPECT_DOUBLE_EQ(w.max_abs_diff, std::max(2.0, 0.5 * before));
  EXPECT_NEAR(w.max_rel_diff, std::max(2.0 / (Tree().w[5 * kCols + 3] + 2.0), 1.0 / 3), 1e-6);
  // Only the one chunk that differs was read, from both sides.
  EXPECT_EQ(w.bytes_read, 2 * 2 * kCols * sizeof(float));
  EXPECT_EQ(Leaf(report, "n").change, LeafChange::kIdentical);
}

TEST_F(DiffTest, NaNsDifferWithoutAMeasure) {
  Tree with_nan;
  with_nan.w[0] = std::nanf("");
  SK_ASSERT_OK(Save("a", Tree()));
  SK_ASSERT_OK(Save("b", with_nan));
  SK_ASSERT_OK_AND_ASSIGN(DiffReport report, Diff());
  const LeafDiff& w = Leaf(report, "w");
  EXPECT_EQ(w.differing_elements, 1u);
  EXPECT_TRUE(std::isnan(w.max_abs_diff));
}

TEST_F(DiffTest, ChangedTypesMissingLeavesAndValues) {
  Tree a;
  Tree b;
  b.w_dtype = "int32";  // same bytes per element, another dtype
  b.with_n = false;
  b.note = "{\"lr\": 0.2}";
  SK_ASSERT_OK(Save("a", a));
  SK_ASSERT_OK(Save("b", b));
  SK_ASSERT_OK_AND_ASSIGN(DiffReport report, Diff());
  const LeafDiff& w = Leaf(report, "w");
  EXPECT_EQ(w.change, LeafChange::kChangedType);
  EXPECT_EQ(w.type_a, "float32[8,16]");
  EXPECT_EQ(w.type_b, "int32[8,16]");
  EXPECT_EQ(Leaf(report, "n").change, LeafChange::kOnlyInA);
  EXPECT_EQ(Leaf(report, "").change, LeafChange::kDiffers);  // config
  EXPECT_EQ(Leaf(report, "").checkpointable, "config");
}

TEST_F(DiffTest, AMissingCheckpointIsAnError) {
  SK_ASSERT_OK(Save("a", Tree()));
  Result<DiffReport> report = Diff();
  EXPECT_EQ(report.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace shardkeep

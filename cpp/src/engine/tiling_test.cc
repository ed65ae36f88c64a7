#include "engine/tiling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace shardkeep::internal {
namespace {

std::vector<const Box*> Pointers(const std::vector<Box>& boxes) {
  std::vector<const Box*> out;
  for (const Box& box : boxes) out.push_back(&box);
  return out;
}

// The boxes of a rows x cols grid of blocks over shape [rows*h, cols*w].
std::vector<Box> Grid(uint64_t rows, uint64_t cols, uint64_t h, uint64_t w) {
  std::vector<Box> boxes;
  for (uint64_t r = 0; r < rows; ++r) {
    for (uint64_t c = 0; c < cols; ++c) boxes.push_back(Box{{r * h, c * w}, {h, w}});
  }
  return boxes;
}

TEST(Tiling, GridsAndStripsTile) {
  EXPECT_FALSE(FindTilingFault({12, 10}, Pointers(Grid(4, 1, 3, 10))));
  EXPECT_FALSE(FindTilingFault({12, 10}, Pointers(Grid(1, 5, 12, 2))));
  EXPECT_FALSE(FindTilingFault({12, 10}, Pointers(Grid(3, 2, 4, 5))));
  // Uneven blocks: a 2x2 split whose halves are cut differently.
  const std::vector<Box> uneven = {Box{{0, 0}, {5, 3}}, Box{{0, 3}, {5, 7}},
                                   Box{{5, 0}, {7, 8}}, Box{{5, 8}, {7, 2}}};
  EXPECT_FALSE(FindTilingFault({12, 10}, Pointers(uneven)));
}

TEST(Tiling, DuplicateMakingUpForAMissingBoxIsAnOverlap) {
  std::vector<Box> boxes = Grid(4, 1, 3, 10);
  boxes[3] = boxes[1];  // same element count as before
  auto fault = FindTilingFault({12, 10}, Pointers(boxes));
  ASSERT_TRUE(fault);
  ASSERT_TRUE(fault->overlap);
  EXPECT_EQ(*fault->overlap, std::make_pair(size_t{1}, size_t{3}));
}

TEST(Tiling, PartialOverlapIsFound) {
  const std::vector<Box> boxes = {Box{{0, 0}, {6, 10}}, Box{{5, 4}, {7, 6}},
                                  Box{{6, 0}, {6, 4}}};
  auto fault = FindTilingFault({12, 10}, Pointers(boxes));
  ASSERT_TRUE(fault && fault->overlap);
  EXPECT_EQ(*fault->overlap, std::make_pair(size_t{0}, size_t{1}));
}

TEST(Tiling, GapReportsCoveredElements) {
  std::vector<Box> boxes = Grid(4, 1, 3, 10);
  boxes.erase(boxes.begin() + 2);
  auto fault = FindTilingFault({12, 10}, Pointers(boxes));
  ASSERT_TRUE(fault);
  EXPECT_FALSE(fault->overlap);
  EXPECT_EQ(fault->covered, 90u);
  EXPECT_EQ(fault->total, 120u);
  fault = FindTilingFault({12, 10}, {});
  ASSERT_TRUE(fault);
  EXPECT_EQ(fault->covered, 0u);
}

TEST(Tiling, RankZeroAndEmptyShapes) {
  const Box scalar{{}, {}};
  EXPECT_FALSE(FindTilingFault({}, {&scalar}));
  EXPECT_TRUE(FindTilingFault({}, {}));
  auto twice = FindTilingFault({}, {&scalar, &scalar});
  ASSERT_TRUE(twice && twice->overlap);
  // A leaf with a zero extent needs no chunks; empty boxes overlap nothing.
  const Box empty{{0, 0}, {0, 5}};
  EXPECT_FALSE(FindTilingFault({0, 5}, {}));
  EXPECT_FALSE(FindTilingFault({0, 5}, {&empty, &empty}));
}

// Thousands of chunks per leaf, shuffled, in either orientation: the sweep
// must stay far from quadratic for the layouts sharded saves write. Its
// cost is checked by how many boxes it holds open (each box is compared
// with those), not by a clock: a sweep along the wrong dimension of a
// 20000x1 grid holds all 20000 open.
TEST(Tiling, ThousandsOfChunksKeepFewOpen) {
  std::mt19937 rng(7);
  for (auto [rows, cols] : {std::pair<uint64_t, uint64_t>{20000, 1}, {1, 20000}, {150, 150}}) {
    std::vector<Box> boxes = Grid(rows, cols, 3, 5);
    std::shuffle(boxes.begin(), boxes.end(), rng);
    size_t most_open = 0;
    EXPECT_FALSE(FindTilingFault({rows * 3, cols * 5}, Pointers(boxes), &most_open));
    EXPECT_EQ(most_open, std::min(rows, cols)) << rows << "x" << cols;
    boxes.push_back(boxes[boxes.size() / 2]);
    auto fault = FindTilingFault({rows * 3, cols * 5}, Pointers(boxes));
    EXPECT_TRUE(fault && fault->overlap);
  }
}

}  // namespace
}  // namespace shardkeep::internal

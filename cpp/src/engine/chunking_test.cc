#include "engine/chunking.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace shardkeep::internal {
namespace {

Box MakeBox(std::vector<uint64_t> origin, std::vector<uint64_t> shape) {
  return Box{std::move(origin), std::move(shape)};
}

// Checks every property SplitIntoChunks promises for a small box: the pieces
// tile it exactly (a counting grid sees each element once), each fits in
// `max_bytes` unless it is one element, they form a grid in row-major order
// whose pieces along a dimension have equal extents except the last.
void CheckTiling(const Box& box, uint64_t item_size, uint64_t max_bytes) {
  SCOPED_TRACE(box.ToString() + " item_size=" + std::to_string(item_size) +
               " max_bytes=" + std::to_string(max_bytes));
  const std::vector<Box> chunks = SplitIntoChunks(box, item_size, max_bytes);
  ASSERT_FALSE(chunks.empty());
  const size_t rank = box.rank();

  std::vector<int> count(box.NumElements(), 0);
  for (const Box& c : chunks) {
    ASSERT_EQ(c.rank(), rank);
    ASSERT_TRUE(Contains(box, c)) << c.ToString();
    ASSERT_GT(c.NumElements(), 0u) << c.ToString();
    EXPECT_TRUE(c.NumElements() * item_size <= max_bytes ||
                c.NumElements() == 1)
        << c.ToString();
    // Mark each element of c in the grid.
    std::vector<uint64_t> idx(rank, 0);
    for (uint64_t n = 0; n < c.NumElements(); ++n) {
      uint64_t flat = 0;
      for (size_t d = 0; d < rank; ++d) {
        flat = flat * box.shape[d] + (c.origin[d] - box.origin[d] + idx[d]);
      }
      ++count[flat];
      for (size_t d = rank; d-- > 0;) {
        if (++idx[d] < c.shape[d]) break;
        idx[d] = 0;
      }
    }
  }
  for (size_t i = 0; i < count.size(); ++i) {
    ASSERT_EQ(count[i], 1) << "element " << i;
  }

  // Grid: the distinct origins along each dimension, times each other, give
  // the chunks in row-major order, so the origins are sorted.
  uint64_t grid = 1;
  for (size_t d = 0; d < rank; ++d) {
    std::vector<uint64_t> starts;
    uint64_t piece = 0;
    for (const Box& c : chunks) {
      starts.push_back(c.origin[d]);
      piece = std::max(piece, c.shape[d]);
    }
    std::sort(starts.begin(), starts.end());
    starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
    grid *= starts.size();
    for (const Box& c : chunks) {
      const bool last =
          c.origin[d] + c.shape[d] == box.origin[d] + box.shape[d];
      if (!last) {
        EXPECT_EQ(c.shape[d], piece) << c.ToString();
      }
    }
  }
  EXPECT_EQ(grid, chunks.size());
  EXPECT_TRUE(std::is_sorted(
      chunks.begin(), chunks.end(),
      [](const Box& a, const Box& b) { return a.origin < b.origin; }));
}

TEST(SplitIntoChunksTest, RankZeroIsWhole) {
  const Box box = MakeBox({}, {});
  EXPECT_EQ(SplitIntoChunks(box, 8, 1), std::vector<Box>{box});
}

TEST(SplitIntoChunksTest, ZeroSizeIsWhole) {
  const Box box = MakeBox({3, 0}, {0, 100});
  EXPECT_EQ(SplitIntoChunks(box, 4, 16), std::vector<Box>{box});
}

TEST(SplitIntoChunksTest, SmallBoxIsWhole) {
  const Box box = MakeBox({10, 20}, {4, 8});
  EXPECT_EQ(SplitIntoChunks(box, 4, 128), std::vector<Box>{box});
  EXPECT_EQ(SplitIntoChunks(box, 4, 1000), std::vector<Box>{box});
}

TEST(SplitIntoChunksTest, SplitsLargestDimensionFirst) {
  // 16000 bytes; cutting dim 1 into 4 gives 4000-byte row blocks.
  const std::vector<Box> chunks =
      SplitIntoChunks(MakeBox({0, 0}, {4, 1000}), 4, 4000);
  ASSERT_EQ(chunks.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(chunks[i], MakeBox({0, 250 * i}, {4, 250}));
  }
}

TEST(SplitIntoChunksTest, TiesSplitLowestDimension) {
  EXPECT_EQ(SplitIntoChunks(MakeBox({0, 0}, {100, 100}), 4, 20000),
            (std::vector<Box>{MakeBox({0, 0}, {50, 100}),
                              MakeBox({50, 0}, {50, 100})}));
  // Then the other dimension, which is now the largest: near-cubes.
  EXPECT_EQ(SplitIntoChunks(MakeBox({0, 0}, {100, 100}), 4, 10000),
            (std::vector<Box>{
                MakeBox({0, 0}, {50, 50}), MakeBox({0, 50}, {50, 50}),
                MakeBox({50, 0}, {50, 50}), MakeBox({50, 50}, {50, 50})}));
}

TEST(SplitIntoChunksTest, OriginsAreAbsolute) {
  EXPECT_EQ(SplitIntoChunks(MakeBox({7, 100}, {2, 10}), 1, 10),
            (std::vector<Box>{MakeBox({7, 100}, {2, 5}),
                              MakeBox({7, 105}, {2, 5})}));
}

TEST(SplitIntoChunksTest, LastPieceIsSmallerAndNoneIsEmpty) {
  // 10 elements, 3 per piece: 3, 3, 3, 1.
  EXPECT_EQ(SplitIntoChunks(MakeBox({0}, {10}), 1, 3),
            (std::vector<Box>{MakeBox({0}, {3}), MakeBox({3}, {3}),
                              MakeBox({6}, {3}), MakeBox({9}, {1})}));
  // 10 elements, 2 per piece: 5 pieces (not 6 with an empty one).
  EXPECT_EQ(SplitIntoChunks(MakeBox({0}, {10}), 1, 2).size(), 5u);
}

TEST(SplitIntoChunksTest, MaxBelowItemSizeGivesSingleElements) {
  const Box box = MakeBox({1, 2}, {3, 4});
  const std::vector<Box> chunks = SplitIntoChunks(box, 8, 4);
  ASSERT_EQ(chunks.size(), 12u);
  for (const Box& c : chunks) EXPECT_EQ(c.NumElements(), 1u);
  CheckTiling(box, 8, 4);
  CheckTiling(box, 8, 0);
}

TEST(SplitIntoChunksTest, HugeShapeDoesNotOverflow) {
  // 2^34 bytes into 64 MiB pieces: 256 row blocks.
  const uint64_t rows = uint64_t{1} << 33;
  std::vector<Box> chunks =
      SplitIntoChunks(MakeBox({0, 0}, {rows, 2}), 1, uint64_t{64} << 20);
  ASSERT_EQ(chunks.size(), 256u);
  for (size_t i = 0; i < chunks.size(); ++i) {
    EXPECT_EQ(chunks[i], MakeBox({i << 25, 0}, {uint64_t{1} << 25, 2}));
  }

  // 2^72 bytes overflows uint64 (a wrapped product would read as 0 bytes).
  chunks = SplitIntoChunks(
      MakeBox({0, 0}, {uint64_t{1} << 40, uint64_t{1} << 30}), 4,
      uint64_t{1} << 62);
  ASSERT_EQ(chunks.size(), 1024u);
  EXPECT_EQ(chunks.back(), MakeBox({uint64_t{1023} << 30, 0},
                                   {uint64_t{1} << 30, uint64_t{1} << 30}));

  // Origins near the top of the index space.
  const uint64_t far = uint64_t{1} << 62;
  chunks = SplitIntoChunks(MakeBox({far}, {1000}), 8, 800);
  ASSERT_EQ(chunks.size(), 10u);
  EXPECT_EQ(chunks[9], MakeBox({far + 900}, {100}));
}

TEST(SplitIntoChunksTest, RankFive) {
  CheckTiling(MakeBox({1, 0, 2, 0, 5}, {3, 5, 7, 2, 4}), 2, 40);
  const std::vector<Box> chunks =
      SplitIntoChunks(MakeBox({0, 0, 0, 0, 0}, {2, 3, 4, 5, 6}), 4, 200);
  for (const Box& c : chunks) EXPECT_LE(c.NumElements() * 4, 200u);
  CheckTiling(MakeBox({0, 0, 0, 0, 0}, {2, 3, 4, 5, 6}), 4, 200);
}

TEST(SplitIntoChunksTest, RandomSmallBoxesTileExactly) {
  std::mt19937_64 rng(1234);
  for (int iter = 0; iter < 500; ++iter) {
    const size_t rank = 1 + rng() % 4;
    Box box;
    for (size_t d = 0; d < rank; ++d) {
      box.origin.push_back(rng() % 50);
      box.shape.push_back(1 + rng() % 9);
    }
    const uint64_t item_size = uint64_t{1} << (rng() % 4);
    const uint64_t max_bytes = rng() % (box.NumElements() * item_size + 8);
    CheckTiling(box, item_size, max_bytes);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace shardkeep::internal

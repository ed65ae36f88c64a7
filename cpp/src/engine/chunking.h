// Splitting a shard into chunks.
#pragma once

#include <cstdint>
#include <vector>

#include "shardkeep/box.h"

namespace shardkeep::internal {

// Splits `box` into a grid of boxes of at most `max_bytes` each (at least
// one element each), cutting the largest remaining extent first so chunks
// stay close to cubes and a load onto another sharding reads little waste.
// Returned in row-major order of the grid. A box of at most `max_bytes`
// (and a zero-size box) comes back whole.
std::vector<Box> SplitIntoChunks(const Box& box, uint64_t item_size,
                                 uint64_t max_bytes);

}  // namespace shardkeep::internal

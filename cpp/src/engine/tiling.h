// Proving that the stored chunks of a leaf tile it: every element lies in
// exactly one chunk. Adding up element counts cannot prove it (a duplicated
// chunk makes up for a missing one), so the reader checks this when it
// opens a checkpointable.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "shardkeep/box.h"

namespace shardkeep::internal {

// Why boxes fail to tile a shape: two of them overlap (`overlap` holds
// their positions in the input), or, when none overlap, they cover only
// `covered` of the shape's `total` elements.
struct TilingFault {
  std::optional<std::pair<size_t, size_t>> overlap;
  uint64_t covered = 0;
  uint64_t total = 0;
};

// Checks that `boxes` tile the box [0, shape) exactly. REQUIRES: every box
// has the rank of `shape` and lies inside it, and the shape's element count
// fits in 64 bits (the decoders guarantee both).
//
// Sorts the boxes along the dimension with the most distinct origins and
// sweeps, comparing each box only with the boxes still open at its origin:
// O(n log n) for the grids of chunks that sharded saves write; the worst
// case, boxes that all stay open along that dimension, is O(n^2).
// `most_open`, if given, receives the most boxes open at once: each box is
// compared with at most that many, which is how a test checks the sweep's
// cost without timing it.
std::optional<TilingFault> FindTilingFault(const std::vector<uint64_t>& shape,
                                           const std::vector<const Box*>& boxes,
                                           size_t* most_open = nullptr);

}  // namespace shardkeep::internal

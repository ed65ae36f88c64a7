// A hyper-rectangle of a leaf's global index space. Device shards, stored
// chunks and restore requests are all boxes; a 0-d array has rank 0 and one
// element.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace shardkeep {

struct Box {
  std::vector<uint64_t> origin;
  std::vector<uint64_t> shape;

  size_t rank() const { return shape.size(); }
  // Product of shape (1 for rank 0; 0 if any extent is 0).
  uint64_t NumElements() const;
  bool operator==(const Box& other) const = default;
  // "[0:4, 8:16]" for messages.
  std::string ToString() const;
};

// The common part of two boxes of equal rank, or nullopt when it is empty.
std::optional<Box> Intersect(const Box& a, const Box& b);
// True when `inner` lies entirely inside `outer`. Safe for boxes whose
// origin + shape overflows: such a box is never contained.
bool Contains(const Box& outer, const Box& inner);

// The bytes that elements of `itemsize` bytes fill over `shape` (0 when an
// extent is 0), or nullopt when that does not fit in 64 bits. Sizes taken
// from files or callers go through this, never a bare multiplication.
std::optional<uint64_t> CheckedByteSize(const std::vector<uint64_t>& shape,
                                        uint64_t itemsize);

}  // namespace shardkeep

#include "engine/chunking.h"

#include <algorithm>

namespace shardkeep::internal {
namespace {

uint64_t CeilDiv(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

// True when a box of shape `piece` takes at most `max_bytes`. Divides instead
// of multiplying so that shapes whose byte size overflows uint64 compare
// correctly.
bool Fits(const std::vector<uint64_t>& piece, uint64_t item_size,
          uint64_t max_bytes) {
  if (item_size > max_bytes) return false;
  uint64_t bytes = item_size;
  for (uint64_t extent : piece) {
    if (bytes > max_bytes / extent) return false;
    bytes *= extent;
  }
  return true;
}

}  // namespace

std::vector<Box> SplitIntoChunks(const Box& box, uint64_t item_size,
                                 uint64_t max_bytes) {
  const size_t rank = box.rank();
  if (rank == 0 || std::find(box.shape.begin(), box.shape.end(), uint64_t{0}) !=
                       box.shape.end()) {
    return {box};
  }

  // piece[d]: extent of every piece along d but the last, which may be
  // smaller; parts[d] = ceil(shape[d] / piece[d]).
  std::vector<uint64_t> piece = box.shape;
  std::vector<uint64_t> parts(rank, 1);
  while (!Fits(piece, item_size, max_bytes)) {
    // Cut the largest extent; ties go to the lowest dimension so chunks
    // tend to be contiguous row blocks.
    size_t d = 0;
    for (size_t i = 1; i < rank; ++i) {
      if (piece[i] > piece[d]) d = i;
    }
    if (piece[d] == 1) break;  // every piece is one element
    // The next smaller piece extent a grid can have. Taking parts + 1 could
    // leave the extent unchanged or create an empty last piece, so derive
    // parts back from the extent.
    const uint64_t extent = box.shape[d];
    piece[d] = CeilDiv(extent, CeilDiv(extent, piece[d] - 1));
    parts[d] = CeilDiv(extent, piece[d]);
  }

  uint64_t count = 1;
  for (uint64_t p : parts) count *= p;
  std::vector<Box> out;
  out.reserve(count);
  // Odometer over the grid, last dimension fastest (row-major).
  std::vector<uint64_t> index(rank, 0);
  for (uint64_t n = 0; n < count; ++n) {
    Box chunk;
    chunk.origin.resize(rank);
    chunk.shape.resize(rank);
    for (size_t d = 0; d < rank; ++d) {
      const uint64_t start = index[d] * piece[d];
      chunk.origin[d] = box.origin[d] + start;
      chunk.shape[d] = std::min(piece[d], box.shape[d] - start);
    }
    out.push_back(std::move(chunk));
    for (size_t d = rank; d-- > 0;) {
      if (++index[d] < parts[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

}  // namespace shardkeep::internal

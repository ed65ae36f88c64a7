#include "shardkeep/box.h"

#include <algorithm>

namespace shardkeep {

uint64_t Box::NumElements() const {
  uint64_t n = 1;
  for (uint64_t extent : shape) n *= extent;
  return n;
}

std::string Box::ToString() const {
  std::string out = "[";
  for (size_t d = 0; d < rank(); ++d) {
    if (d) out += ", ";
    out += std::to_string(origin[d]) + ":" + std::to_string(origin[d] + shape[d]);
  }
  return out + "]";
}

std::optional<Box> Intersect(const Box& a, const Box& b) {
  if (a.rank() != b.rank()) return std::nullopt;
  Box out;
  out.origin.resize(a.rank());
  out.shape.resize(a.rank());
  for (size_t d = 0; d < a.rank(); ++d) {
    const uint64_t lo = std::max(a.origin[d], b.origin[d]);
    const uint64_t hi = std::min(a.origin[d] + a.shape[d], b.origin[d] + b.shape[d]);
    if (hi <= lo) return std::nullopt;
    out.origin[d] = lo;
    out.shape[d] = hi - lo;
  }
  return out;
}

bool Contains(const Box& outer, const Box& inner) {
  if (outer.rank() != inner.rank()) return false;
  for (size_t d = 0; d < outer.rank(); ++d) {
    // Written without origin + shape, which may wrap for an inner box
    // that came from a file or a caller.
    if (inner.origin[d] < outer.origin[d]) return false;
    const uint64_t skip = inner.origin[d] - outer.origin[d];
    if (skip > outer.shape[d] || inner.shape[d] > outer.shape[d] - skip) {
      return false;
    }
  }
  return true;
}

std::optional<uint64_t> CheckedByteSize(const std::vector<uint64_t>& shape,
                                        uint64_t itemsize) {
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  uint64_t bytes = itemsize;
  for (uint64_t extent : shape) {
    if (__builtin_mul_overflow(bytes, extent, &bytes)) return std::nullopt;
  }
  return bytes;
}

}  // namespace shardkeep

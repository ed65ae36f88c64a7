#include "engine/copy.h"

#include <cstring>

namespace shardkeep::internal {

void CopyRegion(const uint8_t* src, const Box& src_box, DType src_dtype,
                uint8_t* dst, const Box& dst_box, DType dst_dtype,
                const Box& region) {
  const uint64_t src_item = DTypeSize(src_dtype);
  const uint64_t dst_item = DTypeSize(dst_dtype);
  const bool same = src_dtype == dst_dtype;
  ForEachRun(src_box, dst_box, region,
             [&](uint64_t src_off, uint64_t dst_off, uint64_t count) {
               const uint8_t* from = src + src_off * src_item;
               uint8_t* to = dst + dst_off * dst_item;
               if (same) {
                 std::memcpy(to, from, count * src_item);
               } else {
                 CastElements(from, src_dtype, to, dst_dtype, count);
               }
             });
}

RunShape RunsOf(const Box& src_box, const Box& dst_box, const Box& region) {
  RunShape shape{region.rank(), 1};
  while (shape.outer > 0) {
    const size_t d = --shape.outer;
    shape.length *= region.shape[d];
    if (region.shape[d] != src_box.shape[d] || region.shape[d] != dst_box.shape[d]) break;
  }
  return shape;
}

uint64_t RowMajorOffset(const Box& inner, const Box& outer) {
  uint64_t offset = 0;
  for (size_t d = 0; d < outer.rank(); ++d) {
    offset = offset * outer.shape[d] + (inner.origin[d] - outer.origin[d]);
  }
  return offset;
}

bool IsContiguousIn(const Box& inner, const Box& outer) {
  size_t d = 0;
  while (d < inner.rank() && inner.shape[d] == 1) ++d;  // leading unit dims
  if (d < inner.rank()) ++d;                            // the partial one
  for (; d < inner.rank(); ++d) {
    if (inner.shape[d] != outer.shape[d]) return false;
  }
  return true;
}

}  // namespace shardkeep::internal

#include "engine/copy.h"

#include <cstring>
#include <vector>

namespace shardkeep::internal {

void CopyRegion(const uint8_t* src, const Box& src_box, DType src_dtype,
                uint8_t* dst, const Box& dst_box, DType dst_dtype,
                const Box& region) {
  const size_t rank = region.rank();
  for (uint64_t extent : region.shape) {
    if (extent == 0) return;
  }

  // Row-major element strides of both buffers.
  std::vector<uint64_t> src_stride(rank), dst_stride(rank);
  uint64_t src_size = 1, dst_size = 1;
  for (size_t d = rank; d-- > 0;) {
    src_stride[d] = src_size;
    dst_stride[d] = dst_size;
    src_size *= src_box.shape[d];
    dst_size *= dst_box.shape[d];
  }

  // Trailing dimensions that the region covers fully in both boxes are
  // contiguous in both buffers, as is the next dimension out across them:
  // together they form one run. Dimensions [0, outer) are iterated.
  size_t outer = rank;
  uint64_t run = 1;
  while (outer > 0) {
    const size_t d = --outer;
    run *= region.shape[d];
    if (region.shape[d] != src_box.shape[d] ||
        region.shape[d] != dst_box.shape[d]) {
      break;
    }
  }

  uint64_t src_off = 0, dst_off = 0;  // in elements
  for (size_t d = 0; d < rank; ++d) {
    src_off += (region.origin[d] - src_box.origin[d]) * src_stride[d];
    dst_off += (region.origin[d] - dst_box.origin[d]) * dst_stride[d];
  }

  const uint64_t src_item = DTypeSize(src_dtype);
  const uint64_t dst_item = DTypeSize(dst_dtype);
  const bool same = src_dtype == dst_dtype;
  uint64_t runs = 1;
  for (size_t d = 0; d < outer; ++d) runs *= region.shape[d];
  // Odometer over the outer dimensions, last one fastest.
  std::vector<uint64_t> index(outer, 0);
  for (uint64_t n = 0; n < runs; ++n) {
    const uint8_t* from = src + src_off * src_item;
    uint8_t* to = dst + dst_off * dst_item;
    if (same) {
      std::memcpy(to, from, run * src_item);
    } else {
      CastElements(from, src_dtype, to, dst_dtype, run);
    }
    for (size_t d = outer; d-- > 0;) {
      src_off += src_stride[d];
      dst_off += dst_stride[d];
      if (++index[d] < region.shape[d]) break;
      src_off -= region.shape[d] * src_stride[d];
      dst_off -= region.shape[d] * dst_stride[d];
      index[d] = 0;
    }
  }
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

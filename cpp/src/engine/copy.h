// Copying boxes between row-major buffers, with dtype casts.
#pragma once

#include <cstdint>
#include <vector>

#include "shardkeep/box.h"
#include "shardkeep/dtype.h"
#include "shardkeep/status.h"

namespace shardkeep::internal {

// OK when values of `from` may be loaded as `to`. Identity always; among
// float16/bfloat16/float32/float64 and among the integer types, casts that
// keep every value exactly (widening) always, and the others (narrowing,
// signed/unsigned changes, float16<->bfloat16) only with `allow_lossy`.
// Anything else (bool, complex, float8, int4, float<->int) is Incompatible.
// Messages name both dtypes.
Status CheckCast(DType from, DType to, bool allow_lossy);

// Converts `count` contiguous elements. REQUIRES: CheckCast(from, to, true)
// is OK. Float narrowing rounds to nearest even; integer narrowing wraps
// (as numpy's astype does).
void CastElements(const uint8_t* src, DType from, uint8_t* dst, DType to,
                  uint64_t count);

// Position (in elements) of `inner`'s first element in the row-major
// buffer of `outer`. REQUIRES: Contains(outer, inner).
uint64_t RowMajorOffset(const Box& inner, const Box& outer);

// True when `inner` occupies one contiguous range of `outer`'s row-major
// buffer: every dimension after the first one of extent > 1 is full.
// REQUIRES: Contains(outer, inner).
bool IsContiguousIn(const Box& inner, const Box& outer);

// Copies the elements of `region` from `src` (row-major buffer of box
// `src_box`, dtype `src_dtype`) into `dst` (row-major buffer of `dst_box`,
// dtype `dst_dtype`), casting when the dtypes differ. Contiguous runs are
// copied with memcpy / CastElements.
// REQUIRES: region lies in both boxes; all three have equal rank; the cast
// passed CheckCast.
void CopyRegion(const uint8_t* src, const Box& src_box, DType src_dtype,
                uint8_t* dst, const Box& dst_box, DType dst_dtype,
                const Box& region);

// How ForEachRun splits `region`: dimensions [0, outer) are iterated, the
// rest form runs of `length` elements.
struct RunShape {
  size_t outer;
  uint64_t length;
};
RunShape RunsOf(const Box& src_box, const Box& dst_box, const Box& region);

// Calls `run(src_offset, dst_offset, count)` for each contiguous run of
// `region` in the row-major buffers of `src_box` and `dst_box`, in
// row-major order; offsets and count are in elements. Trailing dimensions
// that the region covers fully in both boxes merge into one run, as does
// the next dimension out across them. Nothing for an empty region.
// REQUIRES: region lies in both boxes; all three have equal rank.
template <typename Run>
void ForEachRun(const Box& src_box, const Box& dst_box, const Box& region, Run run) {
  const size_t rank = region.rank();
  for (uint64_t extent : region.shape) {
    if (extent == 0) return;
  }
  const auto [outer, length] = RunsOf(src_box, dst_box, region);
  std::vector<uint64_t> src_stride(rank), dst_stride(rank);
  uint64_t src_size = 1, dst_size = 1;
  for (size_t d = rank; d-- > 0;) {
    src_stride[d] = src_size;
    dst_stride[d] = dst_size;
    src_size *= src_box.shape[d];
    dst_size *= dst_box.shape[d];
  }
  uint64_t src_off = 0, dst_off = 0;
  for (size_t d = 0; d < rank; ++d) {
    src_off += (region.origin[d] - src_box.origin[d]) * src_stride[d];
    dst_off += (region.origin[d] - dst_box.origin[d]) * dst_stride[d];
  }
  uint64_t runs = 1;
  for (size_t d = 0; d < outer; ++d) runs *= region.shape[d];
  // Odometer over the outer dimensions, last one fastest.
  std::vector<uint64_t> index(outer, 0);
  for (uint64_t n = 0; n < runs; ++n) {
    run(src_off, dst_off, length);
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

}  // namespace shardkeep::internal

// Copying boxes between row-major buffers, with dtype casts.
#pragma once

#include <cstdint>

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

// Copies the elements of `region` from `src` (row-major buffer of box
// `src_box`, dtype `src_dtype`) into `dst` (row-major buffer of `dst_box`,
// dtype `dst_dtype`), casting when the dtypes differ. Contiguous runs are
// copied with memcpy / CastElements.
// REQUIRES: region lies in both boxes; all three have equal rank; the cast
// passed CheckCast.
// Position (in elements) of `inner`'s first element in the row-major
// buffer of `outer`. REQUIRES: Contains(outer, inner).
uint64_t RowMajorOffset(const Box& inner, const Box& outer);

// True when `inner` occupies one contiguous range of `outer`'s row-major
// buffer: every dimension after the first one of extent > 1 is full.
// REQUIRES: Contains(outer, inner).
bool IsContiguousIn(const Box& inner, const Box& outer);

void CopyRegion(const uint8_t* src, const Box& src_box, DType src_dtype,
                uint8_t* dst, const Box& dst_box, DType dst_dtype,
                const Box& region);

}  // namespace shardkeep::internal

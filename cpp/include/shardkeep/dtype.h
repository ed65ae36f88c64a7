// Element types of stored arrays. Names are the numpy / ml_dtypes names, so
// a dtype crosses the Python boundary as its name and never as a buffer
// protocol format (custom dtypes such as bfloat16 do not survive that).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "shardkeep/status.h"

namespace shardkeep {

enum class DType {
  kBool,
  kInt4, kUInt4,  // stored one element per byte, as ml_dtypes holds them
  kInt8, kInt16, kInt32, kInt64,
  kUInt8, kUInt16, kUInt32, kUInt64,
  kFloat16, kBFloat16, kFloat32, kFloat64,
  kComplex64, kComplex128,
  kFloat8E4M3FN, kFloat8E4M3FNUZ, kFloat8E4M3B11FNUZ, kFloat8E5M2,
  kFloat8E5M2FNUZ, kFloat8E3M4, kFloat8E4M3, kFloat8E8M0FNU,
  kFloat4E2M1FN,
};

// "bfloat16", "float8_e4m3fn", "int4", ...
std::string_view DTypeName(DType dtype);
// Inverse of DTypeName; InvalidArgument naming `name` when unknown.
Result<DType> DTypeFromName(std::string_view name);
// Bytes per element in memory and on disk.
size_t DTypeSize(DType dtype);

// Cast families used by the reader's dtype conversion.
bool IsCastableFloat(DType dtype);  // float16, bfloat16, float32, float64
bool IsInteger(DType dtype);        // int8..int64, uint8..uint64 (not int4)

}  // namespace shardkeep

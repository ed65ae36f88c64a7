#include "shardkeep/dtype.h"

#include <array>

namespace shardkeep {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
};

constexpr std::array<DTypeInfo, 26> kDTypes = {{
    {DType::kBool, "bool", 1},
    {DType::kInt4, "int4", 1},
    {DType::kUInt4, "uint4", 1},
    {DType::kInt8, "int8", 1},
    {DType::kInt16, "int16", 2},
    {DType::kInt32, "int32", 4},
    {DType::kInt64, "int64", 8},
    {DType::kUInt8, "uint8", 1},
    {DType::kUInt16, "uint16", 2},
    {DType::kUInt32, "uint32", 4},
    {DType::kUInt64, "uint64", 8},
    {DType::kFloat16, "float16", 2},
    {DType::kBFloat16, "bfloat16", 2},
    {DType::kFloat32, "float32", 4},
    {DType::kFloat64, "float64", 8},
    {DType::kComplex64, "complex64", 8},
    {DType::kComplex128, "complex128", 16},
    {DType::kFloat8E4M3FN, "float8_e4m3fn", 1},
    {DType::kFloat8E4M3FNUZ, "float8_e4m3fnuz", 1},
    {DType::kFloat8E4M3B11FNUZ, "float8_e4m3b11fnuz", 1},
    {DType::kFloat8E5M2, "float8_e5m2", 1},
    {DType::kFloat8E5M2FNUZ, "float8_e5m2fnuz", 1},
    {DType::kFloat8E3M4, "float8_e3m4", 1},
    {DType::kFloat8E4M3, "float8_e4m3", 1},
    {DType::kFloat8E8M0FNU, "float8_e8m0fnu", 1},
    {DType::kFloat4E2M1FN, "float4_e2m1fn", 1},
}};

const DTypeInfo& Info(DType dtype) {
  for (const auto& info : kDTypes) {
    if (info.dtype == dtype) return info;
  }
  return kDTypes[0];  // unreachable: every enumerator is listed
}

}  // namespace

std::string_view DTypeName(DType dtype) { return Info(dtype).name; }

size_t DTypeSize(DType dtype) { return Info(dtype).size; }

Result<DType> DTypeFromName(std::string_view name) {
  for (const auto& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return InvalidArgumentError("unknown dtype '" + std::string(name) + "'");
}

bool IsCastableFloat(DType d) {
  return d == DType::kFloat16 || d == DType::kBFloat16 ||
         d == DType::kFloat32 || d == DType::kFloat64;
}

bool IsInteger(DType d) {
  switch (d) {
    case DType::kInt8: case DType::kInt16: case DType::kInt32:
    case DType::kInt64: case DType::kUInt8: case DType::kUInt16:
    case DType::kUInt32: case DType::kUInt64:
      return true;
    default:
      return false;
  }
}

}  // namespace shardkeep
